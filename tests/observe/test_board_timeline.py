"""Issue 20: the board's room detail carries the entries' timelines, and ``/api/stuck`` lists the stuck rooms.

Both are read with the read-only ACL user's commands (HGETALL, PTTL, SCAN, TIME) and judged at Redis' clock.
The browser test (test_board_browser.py) checks how the page draws them.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from kvstatus import KVPoll, StatusStore
from kvstatus.admin.acl import acl_rules
from kvstatus.admin.reads import redis_ms
from kvstatus.keys import KeySchema
from kvstatus.observe.board import Board
from kvstatus.observe.boardpages import MAX_OLDER_THAN_SECONDS
from kvstatus.stuck import stuck
from tests.helpers.backends import fresh_namespace
from tests.observe.support import ServerProcess, wait_until
from tests.observe.test_board import request
from tests.servers import RedisServer

pytestmark = pytest.mark.real

B, W, T, S, F = KVPoll.Bootstrapping, KVPoll.WaitingForInput, KVPoll.Transferring, KVPoll.Success, KVPoll.Failed


def walk_room(url: str, namespace: str, room: int, pause: float = 0.05) -> None:
    """prefill-0 and decode-tp0-pp0 walk ``room`` B -> W -> T -> S with timelines, ``pause`` apart; prefill-0's
    W stage lasts twice as long as the others, and decode-tp0-pp0 stays at Transferring."""
    with (
        StatusStore.from_url(url, namespace=namespace, participant="prefill-0", timeline=True) as prefill,
        StatusStore.from_url(url, namespace=namespace, participant="decode-tp0-pp0", timeline=True) as decode,
    ):
        prefill.update_status(room, B)
        time.sleep(pause)
        decode.update_status(room, B)
        prefill.update_status(room, W)
        time.sleep(2 * pause)
        decode.update_status(room, W)
        prefill.update_status(room, T)
        time.sleep(pause)
        decode.update_status(room, T)
        prefill.update_status(room, S)


def write_stuck_rooms(raw: Any, namespace: str) -> dict[int, tuple[str, str, float]]:
    """Rooms whose timelines stopped moving a known time ago (by Redis' clock), written raw; returns
    room -> (holder, status or "", seconds at least) of the stuck ones."""
    now = redis_ms(*raw.time())
    rooms = {
        # decode entries only: the prefill never wrote.
        9100: ({"decode-0": T}, {"decode-0": f"1@{now - 95_000} 3+5000"}),
        # both roles: the lowest open entry holds it back.
        9101: (
            {"decode-0": W, "prefill-0": T},
            {"decode-0": f"1@{now - 200_000} 2+2000", "prefill-0": f"1@{now - 200_000} 3+10000"},
        ),
        9102: ({"decode-0": S, "prefill-0": S}, {"decode-0": f"4@{now - 500_000}", "prefill-0": f"4@{now - 500_000}"}),
        9103: ({"decode-0": T, "prefill-0": T}, {"decode-0": f"3@{now - 1_000}", "prefill-0": f"3@{now - 2_000}"}),
        9104: ({"decode-0": T}, {}),  # no timeline: cannot be judged
    }
    for room, (entries, timelines) in rooms.items():
        key = KeySchema(namespace).room_key(room)
        raw.hset(
            key, mapping={**{p: str(int(s)) for p, s in entries.items()}, **{f"t:{p}": t for p, t in timelines.items()}}
        )
        raw.pexpire(key, 600_000)
    return {9100: ("prefill (no entry)", "", 90.0), 9101: ("decode-0", "WaitingForInput", 190.0)}


def test_room_detail_carries_the_timelines_relative_to_the_first_step(redis_server: RedisServer) -> None:
    namespace = fresh_namespace("timeline")
    walk_room(redis_server.url, namespace, 7)
    with StatusStore.from_url(redis_server.url, namespace=namespace) as store:
        view = store.room(7)
    board = Board(redis_server.client(), KeySchema(namespace), shown_url=redis_server.url)
    before = redis_ms(*redis_server.client().time())
    detail = board.room(7)
    assert detail is not None
    timelines = detail["timelines"]
    start = min(steps[0].at_ms for steps in view.timelines.values())
    assert timelines["start_ms"] == start and before <= timelines["now_ms"] <= before + 5_000
    shown = {p["name"]: p for p in timelines["participants"]}
    assert list(shown) == ["decode-tp0-pp0", "prefill-0"]
    for name, steps in view.timelines.items():
        assert shown[name]["steps"] == [{"status": s.status.name, "at_ms": s.at_ms - start} for s in steps]
    assert shown["prefill-0"]["steps"][0]["at_ms"] == 0 and shown["prefill-0"]["open"] is False
    assert shown["decode-tp0-pp0"]["open"] is True  # still Transferring: its bar runs on to now
    prefill = [s["at_ms"] for s in shown["prefill-0"]["steps"]]
    assert prefill[2] - prefill[1] >= 100 and prefill[1] - prefill[0] >= 50  # the pauses, by Redis' clock
    assert board.room(8) is None
    plain = fresh_namespace("timeline")
    with StatusStore.from_url(redis_server.url, namespace=plain, participant="p") as store:
        store.update_status(1, B)
    untimed = Board(redis_server.client(), KeySchema(plain), shown_url=redis_server.url).room(1)
    assert untimed is not None and untimed["timelines"]["participants"] == []


def test_stuck_page_lists_what_kvstatus_stuck_finds_at_redis_time() -> None:
    # A server of its own: a page's read budget counts every key SCAN walks, the session server's too.
    with RedisServer() as redis_server:
        _stuck_page_lists_what_kvstatus_stuck_finds(redis_server)


def _stuck_page_lists_what_kvstatus_stuck_finds(redis_server: RedisServer) -> None:
    namespace = fresh_namespace("stuck")
    raw = redis_server.client()
    expected = write_stuck_rooms(raw, namespace)
    walk_room(redis_server.url, namespace, 7)  # moving just now: not stuck
    board = Board(raw, KeySchema(namespace), shown_url=redis_server.url)
    page = board.stuck("0-0", 50, 30.0)
    assert page["done"] and page["cursor"] is None and page["scanned"] == 6 and page["judged"] == 5
    assert [s["room"] for s in page["stuck"]] == [9101, 9100]  # the longest stuck first, JSON integers
    assert [s["room_text"] for s in page["stuck"]] == ["9101", "9100"]  # for JavaScript
    for found in page["stuck"]:
        holder, status, at_least = expected[int(found["room"])]
        assert found["holder"] == holder and (found["status"] or "") == status
        assert at_least <= found["seconds"] < at_least + 30
    with StatusStore.from_url(redis_server.url, namespace=namespace) as store:  # the same judgement as stuck()
        for room in (9100, 9101):
            judged = stuck(store.room(room), page["now_ms"], 30.0)
            assert judged is not None and judged.seconds == next(
                s["seconds"] for s in page["stuck"] if s["room"] == room
            )
    assert [s["room"] for s in board.stuck("0-0", 50, 150.0)["stuck"]] == [9101]
    assert {s["room"] for s in board.stuck("0-0", 50, 0.0)["stuck"]} >= {9100, 9101, 9103, 7}


def test_stuck_and_timelines_over_http_as_the_read_only_user() -> None:
    with RedisServer() as redis_server:  # its own (see above): the first page holds the whole namespace
        _stuck_and_timelines_over_http(redis_server)


def _stuck_and_timelines_over_http(redis_server: RedisServer) -> None:
    namespace = fresh_namespace("stuck")
    admin = redis_server.client()
    write_stuck_rooms(admin, namespace)
    walk_room(redis_server.url, namespace, 7)
    user, password = f"reader-{namespace}", "reader-pw-for-stuck"
    admin.execute_command("ACL", "SETUSER", user, *acl_rules(namespace, read_only=True, password=password))
    url = f"redis://{user}:{password}@{redis_server.host}:{redis_server.port}/0"
    try:
        with ServerProcess("--url", url, "--namespace", namespace, "serve", "--port", "0", "--interval", "0.3") as s:
            wait_until(lambda: request(s.base + "/api/summary")[1]["ready"], 30, "the first pass")
            status, page = request(s.base + "/api/stuck?older_than=60&limit=10")
            assert status == 200 and [r["room"] for r in page["stuck"]] == [9101, 9100], page
            assert page["older_than"] == 60
            status, default = request(s.base + "/api/stuck")
            assert status == 200 and default["older_than"] == 30 and len(default["stuck"]) == 2
            status, room = request(s.base + "/api/rooms/7")
            assert status == 200 and [p["name"] for p in room["timelines"]["participants"]] == [
                "decode-tp0-pp0",
                "prefill-0",
            ]
            for bad in (
                "older_than=-1",
                "older_than=banana",
                "older_than=nan",
                f"older_than={MAX_OLDER_THAN_SECONDS * 2}",
                "limit=0",
                "cursor=x",
            ):
                status, body = request(f"{s.base}/api/stuck?{bad}")
                assert status == 400 and body["error"], bad
            assert request(s.base + "/api/stuck", "POST")[0] == 405
            assert s.terminate() == 0
            assert "Traceback" not in s.output
    finally:
        admin.execute_command("ACL", "DELUSER", user)
