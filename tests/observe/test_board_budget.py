"""Issue 19 item 8: a board page whose filter matches nothing read the whole namespace (6.7 s at 100k rooms).
Each page now reads at most about MAX_PAGE_READS rooms and hands back a cursor to continue from."""

from __future__ import annotations

from typing import Any

import pytest

from kvstatus.keys import KeySchema
from kvstatus.model import KVPoll
from kvstatus.observe.board import MAX_PAGE, MAX_PAGE_READS, Board
from tests.helpers.backends import fresh_namespace
from tests.servers import RedisServer

pytestmark = pytest.mark.real

ROOMS = 5 * MAX_PAGE_READS + 123
ONE_SCAN_REPLY = 2 * MAX_PAGE  # SCAN COUNT is max(limit, 100); a reply may hold a few more


def populate(raw: Any, schema: KeySchema, rooms: int = ROOMS, odd_one: int | None = None) -> None:
    with raw.pipeline(transaction=False) as pipe:
        for room in range(rooms):
            key = schema.room_key(room)
            pipe.hset(key, "prefill-0", str(int(KVPoll.Failed if room == odd_one else KVPoll.Transferring)))
            pipe.pexpire(key, 600_000)
        pipe.execute()


def walk(board: Board, limit: int, status: KVPoll) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    cursor, pages, rooms = "0-0", [], []
    while True:
        page = board.page(cursor, limit, status, None)
        pages.append(page)
        rooms += page["rooms"]
        if page["done"]:
            return rooms, pages
        cursor = page["cursor"]
        assert len(pages) < 100, "the walk does not end"


@pytest.mark.parametrize("limit", [50, MAX_PAGE])
def test_a_filter_matching_nothing_reads_a_bounded_amount_per_page(redis_server: RedisServer, limit: int) -> None:
    raw = redis_server.client()
    schema = KeySchema(fresh_namespace("budget"))
    populate(raw, schema)
    board = Board(raw, schema, shown_url="redis://x")
    first = board.page("0-0", limit, KVPoll.Failed, None)
    assert first["rooms"] == [] and not first["done"] and first["budget_spent"] is True
    assert first["cursor"] is not None
    assert first["scanned"] < MAX_PAGE_READS + ONE_SCAN_REPLY  # was: every room of the namespace
    rooms, pages = walk(board, limit, KVPoll.Failed)
    assert rooms == []
    assert all(p["scanned"] < MAX_PAGE_READS + ONE_SCAN_REPLY for p in pages)
    assert sum(p["scanned"] for p in pages) >= ROOMS  # continuing reaches the end of the namespace
    assert len(pages) >= ROOMS // (MAX_PAGE_READS + ONE_SCAN_REPLY)


def test_continuing_finds_the_one_matching_room(redis_server: RedisServer) -> None:
    raw = redis_server.client()
    schema = KeySchema(fresh_namespace("budget"))
    populate(raw, schema, odd_one=ROOMS - 7)
    rooms, pages = walk(Board(raw, schema, shown_url="redis://x"), 50, KVPoll.Failed)
    assert [r["room"] for r in rooms] == [ROOMS - 7]
    assert len(pages) > 1


def test_a_page_that_fills_spends_no_budget(redis_server: RedisServer) -> None:
    raw = redis_server.client()
    schema = KeySchema(fresh_namespace("budget"))
    populate(raw, schema, rooms=300)
    page = Board(raw, schema, shown_url="redis://x").page("0-0", 50, KVPoll.Transferring, None)
    assert len(page["rooms"]) >= 50 and page["budget_spent"] is False
