"""`kvstatus serve` over HTTP: counts, paging over SCAN, detail, changes, read-only, ACL, masked passwords."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest
import redis

import kvstatus.observe
from kvstatus import KVPoll, StatusStore
from kvstatus.admin.acl import acl_rules
from kvstatus.admin.stats import collect_stats
from kvstatus.keys import KeySchema
from kvstatus.observe.board import MAX_SCAN_STEPS
from tests.helpers.backends import fresh_namespace
from tests.observe.support import ServerProcess, get, wait_until
from tests.servers import RedisServer

pytestmark = pytest.mark.real

PASSWORD = "board-s3cret-pw"
READER_PASSWORD = "reader-s3cret-pw"
ROOMS = 230


def request(url: str, method: str = "GET", body: bytes | None = None) -> tuple[int, Any]:
    req = urllib.request.Request(url, method=method, data=body)
    try:
        with urllib.request.urlopen(req, timeout=10) as response:
            text = response.read().decode()
            status = response.status
    except urllib.error.HTTPError as exc:
        text, status = exc.read().decode(), exc.code
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def populate(url: str, namespace: str) -> dict[str, dict[int, KVPoll]]:
    """Rooms of two prefill and one decode participant; returns participant -> room -> status written."""
    written: dict[str, dict[int, KVPoll]] = {}
    for i, participant in enumerate(("prefill-0", "prefill-1", "decode-0")):
        with StatusStore.from_url(url, namespace=namespace, participant=participant, shared_fate=False) as store:
            updates = {room: KVPoll(1 + (room * (i + 1)) % 4) for room in range(i * 10, ROOMS)}
            store.update_many(updates)
            store.update_many({room: KVPoll.Failed for room in range(i * 10, ROOMS, 17)})
            store.record_failure(i * 10 + 17 if i else 17, f"{participant}: transfer timed out")
            written[participant] = {room: store.get(room) for room in updates}
    return written


@pytest.fixture
def board(redis_server: RedisServer) -> Iterator[tuple[ServerProcess, str, dict[str, dict[int, KVPoll]]]]:
    namespace = fresh_namespace("board")
    written = populate(redis_server.url, namespace)
    with ServerProcess(
        "--url", redis_server.url, "--namespace", namespace, "serve", "--port", "0", "--interval", "0.3"
    ) as server:
        wait_until(lambda: request(server.base + "/api/summary")[1]["ready"], 30, "the first pass")
        yield server, namespace, written
        assert server.terminate() == 0
        assert "Traceback" not in server.output


def all_pages(base: str, **query: str) -> tuple[list[dict], int]:
    rooms: list[dict] = []
    cursor, pages = "0-0", 0
    while True:
        params = urllib.parse.urlencode({**query, "cursor": cursor})
        status, page = request(f"{base}/api/rooms?{params}")
        assert status == 200, page
        pages += 1
        assert page["scanned"] <= MAX_SCAN_STEPS * max(int(query.get("limit", 50)), 100)
        rooms += page["rooms"]
        if page["done"]:
            assert page["cursor"] is None
            return rooms, pages
        cursor = page["cursor"]


def test_summary_counts_agree_with_stats(board, redis_server: RedisServer) -> None:
    server, namespace, _ = board
    stats = collect_stats(redis_server.client(), KeySchema(namespace))
    status, summary = request(server.base + "/api/summary")
    assert status == 200 and summary["up"] is True and summary["namespace"] == namespace
    assert summary["rooms"] == stats.rooms == ROOMS
    assert summary["by_status"] == {s.name: stats.by_status.get(s, 0) for s in KVPoll}
    assert summary["participants"] == ["decode-0", "prefill-0", "prefill-1"]
    assert summary["history"] and summary["history"][-1]["by_status"] == summary["by_status"]


def test_rooms_are_paged_over_scan_and_filtered(board) -> None:
    server, _, written = board
    rooms, pages = all_pages(server.base, limit="20")
    ids = [int(r["room"]) for r in rooms]
    assert set(ids) == set(range(ROOMS)) and pages > 1
    failed = {room for statuses in written.values() for room, s in statuses.items() if s == KVPoll.Failed}
    # the filter matches what the entry reads: an open entry in a room that failed reads Failed (shared fate)
    expected = {room for room, s in written["prefill-1"].items() if s == KVPoll.Transferring and room not in failed}
    filtered, _ = all_pages(server.base, limit="20", status="Transferring", participant="prefill-1")
    assert expected and {int(r["room"]) for r in filtered} == expected
    for room in filtered:
        assert any(p["name"] == "prefill-1" and p["reads"] == "Transferring" for p in room["participants"])
    shared, _ = all_pages(server.base, limit="20", status="Failed", participant="prefill-1")
    fated = {room for room, s in written["prefill-1"].items() if s == KVPoll.Transferring and room in failed}
    assert fated and fated <= {int(r["room"]) for r in shared}
    for room in shared:
        if int(room["room"]) in fated:
            (entry,) = [p for p in room["participants"] if p["name"] == "prefill-1"]
            assert (entry["status"], entry["reads"]) == ("Transferring", "Failed") and room["failure"] is not None
    by_number, _ = all_pages(server.base, status="3", participant="prefill-1")
    assert {int(r["room"]) for r in by_number} == expected


def test_room_detail_and_errors(board, redis_server: RedisServer) -> None:
    server, namespace, written = board
    status, room = request(server.base + "/api/rooms/27")
    assert status == 200 and room["room"] == 27 and room["room_text"] == "27" and 590_000 < room["ttl_ms"] <= 600_000
    entries = {p["name"]: p for p in room["participants"]}
    assert set(entries) == {"prefill-0", "prefill-1", "decode-0"}
    for name, entry in entries.items():
        assert entry["status"] == written[name][27].name
    assert entries["prefill-1"]["reason"] == "prefill-1: transfer timed out"
    assert entries["prefill-0"]["reason"] is None
    assert room["tombstone"] is None
    failure = room["failure"]  # prefill-1 failed room 27 first, from Transferring
    assert failure["stage"] == "transfer" and failure["origin"] == "prefill-1"
    assert failure["reason"] == "prefill-1: transfer timed out"
    with StatusStore.from_url(redis_server.url, namespace=namespace) as store:
        assert failure["at"] == store.failure(27).at  # Redis' clock, Unix seconds
    assert request(server.base + "/api/rooms/1")[1]["failure"] is None  # a room nobody failed
    assert request(server.base + "/api/rooms/999999")[0] == 404
    for bad in (
        "/api/rooms/abc",
        "/api/rooms/99999999999999999999",
        "/api/rooms?status=Done",
        "/api/rooms?cursor=banana",
        "/api/rooms?limit=0",
        "/api/changes?after=x",
    ):
        status, body = request(server.base + bad)
        assert status == 400 and body["error"], bad


def test_recent_changes_come_from_watch_change_detection(board, redis_server: RedisServer) -> None:
    server, namespace, _ = board
    last = request(server.base + "/api/summary")[1]["last_change"]
    with StatusStore.from_url(redis_server.url, namespace=namespace, participant="decode-0") as store:
        store.update_status(5000, KVPoll.Bootstrapping)
        store.update_status(40, KVPoll.Failed)
    changes = wait_until(
        lambda: len((c := request(f"{server.base}/api/changes?after={last}")[1])["changes"]) >= 2 and c,
        30,
        "two changes",
    )
    kinds = {c["room"]: c["event"] for c in changes["changes"]}
    assert kinds[5000] == "new" and kinds[40] == "failed"
    assert all(type(c["room"]) is int and c["room_text"] == str(c["room"]) for c in changes["changes"])
    assert all(c["seq"] > last for c in changes["changes"])


def test_the_board_refuses_every_write_method(board, redis_server: RedisServer) -> None:
    server, namespace, _ = board
    before = collect_stats(redis_server.client(), KeySchema(namespace)).to_json()
    for path in ("/", "/api/summary", "/api/rooms", "/api/rooms/27", "/api/changes"):
        for method in ("POST", "PUT", "DELETE", "PATCH"):
            status, _ = request(server.base + path, method, b'{"status": "Failed"}')
            assert status == 405, (method, path)
    assert request(server.base + "/api/rooms/27/clear", "POST")[0] == 404
    after = collect_stats(redis_server.client(), KeySchema(namespace)).to_json()
    assert after["by_participant"] == before["by_participant"]


def test_works_with_the_read_only_acl_user(redis_server: RedisServer) -> None:
    namespace = fresh_namespace("board")
    populate(redis_server.url, namespace)
    admin = redis_server.client()
    user = f"reader-{namespace}"
    admin.execute_command("ACL", "SETUSER", user, *acl_rules(namespace, read_only=True, password=READER_PASSWORD))
    url = f"redis://{user}:{READER_PASSWORD}@{redis_server.host}:{redis_server.port}/0"
    reader = redis_server.client(username=user, password=READER_PASSWORD)
    with pytest.raises(redis.exceptions.NoPermissionError):
        reader.hset(f"kvstatus:{namespace}:{{1}}", "x", "1")  # the user really is read-only
    try:
        with ServerProcess("--url", url, "--namespace", namespace, "serve", "--port", "0", "--interval", "0.3") as s:
            summary = wait_until(lambda: (b := request(s.base + "/api/summary")[1])["ready"] and b, 30, "a pass")
            assert summary["up"] and summary["rooms"] == ROOMS
            assert READER_PASSWORD not in json.dumps(summary) and "***" in summary["url"]
            rooms, _ = all_pages(s.base, limit="100")
            assert len(rooms) == ROOMS
            assert request(s.base + "/api/rooms/27")[1]["participants"]
            assert s.terminate() == 0
            assert READER_PASSWORD not in s.output and "Traceback" not in s.output
    finally:
        admin.execute_command("ACL", "DELUSER", user)


def test_password_is_masked_everywhere_and_an_outage_is_shown_not_fatal() -> None:
    namespace = fresh_namespace("board")
    with RedisServer(password=PASSWORD) as redis:
        populate(redis.url, namespace)
        with ServerProcess(
            "--url", redis.url, "--namespace", namespace, "serve", "--port", "0", "--interval", "0.3"
        ) as server:
            summary = wait_until(lambda: (b := request(server.base + "/api/summary")[1])["ready"] and b, 30, "a pass")
            page = get(server.base + "/")
            redis.kill()
            down = wait_until(
                lambda: (b := request(server.base + "/api/summary")[1])["up"] is False and b,
                60,
                "the board to see Redis down",
            )
            status, failed_page = request(server.base + "/api/rooms")
            assert status == 503 and "Redis unavailable" in failed_page["error"]  # BackendRefusedError since 19.17
            redis.restart()
            wait_until(lambda: request(server.base + "/api/summary")[1]["up"], 60, "the board to see Redis back")
            assert server.terminate() == 0
            output = server.output
    for text in (json.dumps(summary), page, json.dumps(down), json.dumps(failed_page), output):
        assert PASSWORD not in text
    assert "redis://:***@" in summary["url"] and "Traceback" not in output


@pytest.mark.parametrize("command", ["serve", "exporter"])
def test_a_port_in_use_is_one_line_and_exit_1_not_a_traceback(redis_server: RedisServer, command: str) -> None:
    import socket

    from click.testing import CliRunner

    from kvstatus.cli import main

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        result = CliRunner().invoke(
            main,
            [
                "--url",
                redis_server.url,
                "--namespace",
                fresh_namespace("board"),
                command,
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
            ],
        )
    assert result.exit_code == 1, result.output
    assert f"cannot listen on 127.0.0.1:{port}" in result.output and "Traceback" not in result.output
    assert not isinstance(result.exception, OSError)


def test_serve_help_states_its_own_interval_default() -> None:
    from click.testing import CliRunner

    from kvstatus.cli import main

    def shown(command: str) -> str:  # the wrap moves with the widest option name
        return " ".join(CliRunner().invoke(main, [command, "--help"]).output.split())

    assert "[default: 2.0" in shown("serve")
    assert "[default: 15.0" in shown("exporter")


def test_room_detail_shows_the_tombstone_of_a_clear(board, redis_server: RedisServer) -> None:
    server, namespace, _ = board
    with StatusStore.from_url(redis_server.url, namespace=namespace, participant="decode-0") as store:
        store.update_status(5000, KVPoll.WaitingForInput)
        store.update_status(5000, KVPoll.Success)
        store.clear(5000)
        store.update_status(5000, KVPoll.Failed)  # a late abort: ignored, and noted
    status, room = request(server.base + "/api/rooms/5000")
    assert status == 200 and room["participants"] == [] and len(room["tombstone"]) == 1
    assert room["failure"] is None
    assert "by decode-0 at Success" in room["tombstone"][0] and "late abort" in room["tombstone"][0]


def test_a_corrupted_first_failure_is_a_503_naming_the_key_as_a_corrupted_status(
    board, redis_server: RedisServer
) -> None:
    server, namespace, _ = board
    raw = redis_server.client()
    for room, fields in {6000: {"prefill-0": "banana"}, 6001: {"prefill-0": "0", "room:fate": "banana"}}.items():
        raw.hset(f"kvstatus:{namespace}:{{{room}}}", mapping=fields)
        raw.pexpire(f"kvstatus:{namespace}:{{{room}}}", 600_000)
    for room, what in ((6000, "field prefill-0 holds 'banana'"), (6001, "field room:fate holds 'banana'")):
        status, body = request(f"{server.base}/api/rooms/{room}")
        assert status == 503 and body["error"].startswith("CorruptedValueError: key kvstatus:"), body
        assert what in body["error"] and "left as it is" in body["error"]
    summary = wait_until(
        lambda: (b := request(server.base + "/api/summary")[1])["corrupted_rooms"] == 2 and b, 30, "a pass"
    )
    assert summary["rooms"] == ROOMS  # both are counted as corrupted, not as rooms


def test_the_page_shows_room_ids_from_room_text() -> None:
    """The API's ``room`` is a JSON integer, which JavaScript rounds past 2^53: the page reads ``room_text``."""
    page = (Path(kvstatus.observe.__file__).parent / "board.html").read_text(encoding="utf-8")
    assert re.search(r"\b(r|s|ch)\.room\b(?!_)", page) is None
    assert page.count(".room_text") >= 6
