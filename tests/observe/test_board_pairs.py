"""Issue 20 item 4: the board's pair matrix reads ``/api/pairs``, the health pass of ``kvstatus health`` in
bounded pages (as ``/api/rooms`` and ``/api/stuck``): the pages of one walk add up to ``read_health``'s counts,
a page covering the whole namespace carries the verdicts, bad parameters are a 400, and the read-only ACL user
is enough. The browser test (test_board_browser.py) checks how the page draws the matrix."""

from __future__ import annotations

from collections import Counter
from typing import Any, Iterator

import pytest

from kvstatus.admin.acl import acl_rules
from kvstatus.admin.health import NONE, HealthSettings, read_health
from kvstatus.keys import KeySchema
from kvstatus.observe.board import MAX_PAGE_READS, Board
from kvstatus.observe.boardpages import PAIRS_SCAN_COUNT
from tests.admin.test_health import build
from tests.helpers.backends import RedisUnderTest
from tests.observe.support import ServerProcess, wait_until
from tests.observe.test_board import request
from tests.servers import RedisServer

pytestmark = pytest.mark.real

PAIR_FIELDS = {
    "prefill",
    "decode",
    "succeeded",
    "failed",
    "failed_by_stage",
    "stuck",
    "open",
    "dead",
    "verdict",
    "served_ms",
    "died_ms",
}
PAGE_FIELDS = {
    "namespace",
    "now",
    "now_ms",
    "window_seconds",
    "older_than_seconds",
    "tombstone_ttl_seconds",
    "threshold",
    "healthy",
    "rooms",
    "unpaired_rooms",
    "corrupted_rooms",
    "corrupted_sample",
    "pairs",
    "complete",
    "unhealthy",
    "scanned",
    "cursor",
    "done",
}


@pytest.fixture(scope="module")
def own_server() -> Iterator[RedisServer]:
    """A server of this module's own: a page's read budget counts every key SCAN walks, so the session server's
    keys from other tests would spread a small namespace over several pages."""
    with RedisServer() as server:
        yield server


@pytest.fixture
def pd(own_server: RedisServer) -> Iterator[RedisUnderTest]:
    backend = RedisUnderTest("real", own_server.client(), own_server.client, False)
    build(backend)
    yield backend
    backend.close()


def walk(board: Board, settings: HealthSettings = HealthSettings()) -> tuple[dict[tuple[str, str], Counter], list]:
    """Every page of the pairs from 0-0: the counts per pair summed over the pages, and the pages."""
    sums: dict[tuple[str, str], Counter] = {}
    cursor, pages = "0-0", []
    while True:
        page = board.pairs(cursor, settings)
        pages.append(page)
        for pair in page["pairs"]:
            counts = sums.setdefault((pair["prefill"], pair["decode"]), Counter())
            counts.update({key: pair[key] for key in ("succeeded", "failed", "stuck", "open")})
            counts.update({f"stage:{stage}": n for stage, n in pair["failed_by_stage"].items()})
        if page["done"]:
            return sums, pages
        cursor = page["cursor"]
        assert len(pages) < 200, "the walk does not end"


def expected(client: Any, schema: KeySchema, settings: HealthSettings = HealthSettings()) -> dict:
    health = read_health(client, schema, settings)
    found: dict[tuple[str, str], Counter] = {}
    for pair in health.pairs:
        counts = Counter(succeeded=pair.succeeded, failed=pair.failed_total, stuck=pair.stuck, open=pair.open)
        counts.update({f"stage:{stage}": n for stage, n in pair.failed.items()})
        found[(pair.prefill, pair.decode)] = +counts
    return found


def test_one_page_holds_the_health_of_a_small_namespace_with_its_verdicts(pd: RedisUnderTest) -> None:
    schema = KeySchema(pd.namespace)
    board = Board(pd.raw, schema, shown_url="redis://localhost")
    page = board.pairs("0-0", HealthSettings())
    assert set(page) == PAGE_FIELDS and all(set(pair) == PAIR_FIELDS for pair in page["pairs"])
    assert page["done"] and page["complete"] and page["cursor"] is None
    assert page["healthy"] is False and page["unhealthy"] == ["prefill-c,decode-d", f"prefill-e,{NONE}"]
    health = read_health(pd.raw, schema)
    shown = [{k: v for k, v in pair.items() if k not in ("served_ms", "died_ms")} for pair in page["pairs"]]
    assert shown == [pair.to_json() for pair in health.pairs]  # exactly what kvstatus health --json says
    assert (page["rooms"], page["unpaired_rooms"], page["corrupted_rooms"]) == (8, 1, 0)
    assert page["window_seconds"] == 60 and page["older_than_seconds"] == 30 and page["threshold"] == 1
    lenient = board.pairs("0-0", HealthSettings(threshold=4))
    assert lenient["healthy"] is True and lenient["unhealthy"] == []


def test_pages_are_bounded_and_add_up_to_the_full_pass(redis_server: RedisServer) -> None:
    backend = RedisUnderTest("real", redis_server.client(), redis_server.client, False)
    try:
        build(backend)
        schema = KeySchema(backend.namespace)
        raw = backend.raw
        with raw.pipeline(transaction=False) as pipe:  # many more rooms: a served pair and an open one
            for room in range(100, 100 + 2 * MAX_PAGE_READS):
                key = schema.room_key(room)
                pipe.hset(key, mapping={"prefill-m-tp0-pp0": "2", "decode-n-tp0-pp0": "2"})
                pipe.pexpire(key, 600_000)
            pipe.execute()
        board = Board(raw, schema, shown_url="redis://localhost")
        sums, pages = walk(board)
        assert len(pages) >= 2
        for page in pages:
            assert (
                page["scanned"] <= MAX_PAGE_READS + 2 * PAIRS_SCAN_COUNT
            )  # the reply reaching the bound is read whole
            assert page["complete"] is False and page["healthy"] is None and page["unhealthy"] is None
            assert all(pair["verdict"] is None for pair in page["pairs"])
        assert {key: +counts for key, counts in sums.items()} == expected(raw, schema)
        assert sums[("prefill-m", "decode-n")]["open"] == 2 * MAX_PAGE_READS
        assert sum(page["rooms"] for page in pages) == 8 + 2 * MAX_PAGE_READS
        continued = board.pairs(pages[0]["cursor"], HealthSettings())
        assert continued["complete"] is False  # from a cursor: never the whole namespace
    finally:
        backend.close()


def test_pairs_of_a_cluster_walk_every_primary(redis_cluster: Any) -> None:
    from tests.conftest import _cluster_backend

    backend = _cluster_backend(redis_cluster, False)
    try:
        build(backend)
        schema = KeySchema(backend.namespace)
        sums, pages = walk(Board(backend.raw, schema, shown_url="redis://localhost"))
        assert {key: +counts for key, counts in sums.items()} == expected(backend.raw, schema)
        assert sums[("prefill-a", "decode-b")]["succeeded"] == 2
    finally:
        backend.close()


def test_pairs_over_http_as_the_read_only_user_and_bad_parameters_are_400(
    pd: RedisUnderTest, own_server: RedisServer
) -> None:
    namespace, redis_server = pd.namespace, own_server
    admin = redis_server.client()
    user, password = f"reader-{namespace}", "reader-pw-for-pairs"
    admin.execute_command("ACL", "SETUSER", user, *acl_rules(namespace, read_only=True, password=password))
    url = f"redis://{user}:{password}@{redis_server.host}:{redis_server.port}/0"
    try:
        with ServerProcess("--url", url, "--namespace", namespace, "serve", "--port", "0", "--interval", "0.3") as s:
            wait_until(lambda: request(s.base + "/api/summary")[1]["ready"], 30, "the first pass")
            status, page = request(s.base + "/api/pairs")
            assert status == 200 and set(page) == PAGE_FIELDS, page
            assert page["complete"] and page["unhealthy"] == ["prefill-c,decode-d", f"prefill-e,{NONE}"]
            pairs = {(p["prefill"], p["decode"]): p for p in page["pairs"]}
            assert pairs[("prefill-a", "decode-b")]["succeeded"] == 2
            assert pairs[("prefill-c", "decode-d")]["failed_by_stage"] == {"cancelled": 1, "unknown": 1}
            status, page = request(s.base + "/api/pairs?threshold=4&older_than=120&window=60")
            assert status == 200 and page["healthy"] is True and page["threshold"] == 4, page
            assert page["window_seconds"] == 60 and page["tombstone_ttl_seconds"] == 60
            assert {(p["prefill"], p["decode"]): p["stuck"] for p in page["pairs"]}[("prefill-e", NONE)] == 0
            for bad, needle in (
                ("window=0", "invalid window"),
                ("window=-5", "invalid window"),
                ("window=soon", "invalid window"),
                ("window=nan", "invalid window"),
                ("window=inf", "invalid window"),
                ("window=61", "at most the tombstone TTL"),
                ("older_than=0", "invalid older_than"),
                ("older_than=banana", "invalid older_than"),
                ("threshold=0", "invalid threshold"),
                ("threshold=1.5", "invalid threshold"),
                ("threshold=many", "invalid threshold"),
                ("cursor=x", "invalid cursor"),
                ("cursor=7-0", "invalid cursor"),
            ):
                status, body = request(f"{s.base}/api/pairs?{bad}")
                assert status == 400 and needle in body["error"], (bad, body)
            assert request(s.base + "/api/pairs", "POST")[0] == 405
            assert s.terminate() == 0
            assert "Traceback" not in s.output and password not in s.output
    finally:
        admin.execute_command("ACL", "DELUSER", user)


def test_a_string_at_a_tombstone_name_is_counted_and_every_pair_still_judged(pd: RedisUnderTest) -> None:
    """Issue 36: a tenant's SET at a tombstone name made /api/pairs answer 503."""
    schema = KeySchema(pd.namespace)
    board = Board(pd.raw, schema, shown_url="redis://localhost")
    before = board.pairs("0-0", HealthSettings())
    room_keys = sorted(k.decode() for k in pd.raw.scan_iter(match=f"kvstatus:{pd.namespace}:{{*}}"))
    live = next(k for k in room_keys if k.endswith("}") and not pd.raw.exists(k + ":t"))
    pd.raw.set(live + ":t", "junk")
    pd.raw.set(schema.tombstone_key(10**12), "junk")
    page = board.pairs("0-0", HealthSettings())
    assert page["pairs"] == before["pairs"] and page["rooms"] == before["rooms"]
    assert page["corrupted_rooms"] == before["corrupted_rooms"] + 2
    assert any(live + ":t" in message for message in page["corrupted_sample"]), page["corrupted_sample"]
