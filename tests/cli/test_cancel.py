"""``kvstatus cancel`` and the room's first failure in ``get`` / ``ls --json`` (issue 16, items 4 and 6).

Through click's CliRunner against fakeredis (the cancel script runs in fakeredis' Lua), and once as an operator
types it, against a real Redis."""

from __future__ import annotations

import json

import fakeredis
import pytest

from kvstatus import KVPoll, StatusStore
from kvstatus.keys import FATE_FIELD, PROBE_PARTICIPANT
from kvstatus.model import CancelOutcome, Stage
from tests.helpers.cli import NS, assert_clean_failure, cli, json_lines, run_cli
from tests.servers import RedisServer


def _two_rooms(store: StatusStore) -> None:
    """Room 42 open on both sides; room 7 failed by prefill-1 (with its reason) while decode-1 waits."""
    store.for_participant("prefill-0").update_status(42, KVPoll.Transferring)
    store.for_participant("decode-0").update_status(42, KVPoll.WaitingForInput)
    prefill = store.for_participant("prefill-1")
    prefill.update_status(7, KVPoll.Transferring)
    prefill.update_status(7, KVPoll.Failed)
    prefill.record_failure(7, "NIXL transfer timed out")
    store.for_participant("decode-1").update_status(7, KVPoll.WaitingForInput)


def test_cancel_fails_the_open_entries_and_says_what_happened_per_room(connect, store):
    _two_rooms(store)
    done = cli(connect, "cancel", "42", "7", "9", "42", "--reason", "client went away")
    assert done.exit_code == 0, done.output
    assert done.output.splitlines() == [
        "room 42: cancelled, 2 open entries failed",
        "room 7: had already failed (first failure: failed at transfer by prefill-1: NIXL transfer timed out), "
        "1 open entry failed",
        "room 9: cancelled, 0 open entries failed",  # no entry yet: the record alone, a later writer reads Failed
    ]
    view = store.room(42)
    assert {n: e.status for n, e in view.participants.items()} == {
        "decode-0": KVPoll.Failed,
        "prefill-0": KVPoll.Failed,
    }
    assert view.participants["decode-0"].reason == "cancelled by operator: client went away"
    assert view.failure is not None and (view.failure.stage, view.failure.origin, view.failure.reason) == (
        Stage.CANCELLED,
        "operator",
        "client went away",
    )
    assert store.room(7).failure.origin == "prefill-1"  # the first failure stays
    assert store.room(9).exists and store.room(9).participants == {}
    assert store.for_participant("decode-5").update_status(9, KVPoll.Bootstrapping).outcome.name == "CREATED"
    assert store.for_participant("decode-5").get(9) is KVPoll.Failed  # shared fate


def test_cancel_json_and_origin(connect, store):
    _two_rooms(store)
    first = json.loads(cli(connect, "cancel", "42", "--reason", "drained", "--origin", "router-1", "--json").output)
    assert first == {
        "namespace": NS,
        "origin": "router-1",
        "reason": "drained",
        "rooms": [{"room": 42, "outcome": "CANCELLED", "failed": 2}],
    }
    again = json.loads(cli(connect, "cancel", "42", "7", "--reason", "again", "--json").output)
    rooms = {r["room"]: r for r in again["rooms"]}
    assert rooms[42]["outcome"] == "ALREADY_FAILED" and rooms[42]["failed"] == 0
    at = rooms[42]["first_failure"].pop("at")
    assert rooms[42]["first_failure"] == {"stage": "cancelled", "origin": "router-1", "reason": "drained"}
    assert isinstance(at, float) and at == store.failure(42).at
    assert rooms[7]["first_failure"]["stage"] == "transfer" and rooms[7]["failed"] == 1


def test_cancel_in_batches_cancels_every_room_once(connect, store):
    for room in range(5):
        store.update_status(room, KVPoll.Bootstrapping)
    done = cli(connect, "cancel", *map(str, range(5)), "3", "--reason", "scale down", "--batch", "2", "--json")
    assert done.exit_code == 0
    assert [(r["room"], r["outcome"], r["failed"]) for r in json.loads(done.output)["rooms"]] == [
        (room, "CANCELLED", 1) for room in range(5)
    ]
    assert store.get_many(range(5)) == dict.fromkeys(range(5), KVPoll.Failed)


@pytest.mark.parametrize(
    "args, needle",
    [
        (["cancel", "1", "2"], "Missing option '--reason'"),
        (["cancel", "1", "--reason", ""], "--reason must not be empty"),
        (["cancel", "1", "--reason", "  \t"], "--reason must not be empty"),
        (["cancel", "1", "--reason", "x", "--origin", "router:1"], "invalid origin 'router:1'"),
        (["cancel", "1", "--reason", "x", "--origin", ""], "invalid origin ''"),
        (["cancel", "1", "2x", "--reason", "x"], "invalid room '2x'"),
        (["cancel", "1", str(2**63), "--reason", "x"], "invalid room"),
        (["cancel", "1", "-5", "--reason", "x"], "negative numbers are no room"),
        (["cancel", "--reason", "x"], "Missing argument 'ROOM...'"),
        (["cancel", "1", "--reason", "x", "--batch", "0"], "--batch"),
        (["cancel", "1", "--reason", "bad \udcff bytes"], "not valid UTF-8 text"),
    ],
)
def test_bad_input_is_a_usage_error_and_nothing_is_written(connect, store, server, args, needle):
    store.update_status(1, KVPoll.Transferring)
    before = fakeredis.FakeRedis(server=server).hgetall(f"kvstatus:{NS}:{{1}}")
    done = cli(connect, *args)
    assert_clean_failure(done.output, done.exit_code, 2, needle)
    assert fakeredis.FakeRedis(server=server).hgetall(f"kvstatus:{NS}:{{1}}") == before
    assert store.failure(1) is None


def test_an_unreadable_first_failure_is_said_and_the_cancel_still_done(connect, store, server):
    store.update_status(3, KVPoll.Transferring)
    fakeredis.FakeRedis(server=server).hset(f"kvstatus:{NS}:{{3}}", FATE_FIELD, "garbage")
    done = cli(connect, "cancel", "3", "--reason", "x")
    assert done.exit_code == 0
    assert "room 3: had already failed (its first failure could not be read), 1 open entry failed" in done.output
    assert "warning: room 3:" in done.output and "not a failure record" in done.output
    assert fakeredis.FakeRedis(server=server).hget(f"kvstatus:{NS}:{{3}}", "default") == b"0"


def test_get_shows_the_first_failure_and_who_reads_failed(connect, store):
    _two_rooms(store)
    text = cli(connect, "get", "7", "42")
    assert text.exit_code == 0
    lines = text.output.splitlines()
    failure = [line for line in lines if line.startswith("room 7: first failure ")]
    assert len(failure) == 1 and failure[0].endswith(
        " s ago: failed at transfer by prefill-1: NIXL transfer timed out; decode-1 reads Failed (shared fate)"
    )
    assert not any(line.startswith("room 42:") for line in lines)  # no failure, nothing said
    document = json.loads(cli(connect, "get", "7", "42", "--json").output)
    rooms = {r["room"]: r for r in document["rooms"]}
    assert "failure" not in rooms[42]
    at = rooms[7]["failure"].pop("at")
    assert rooms[7]["failure"] == {"stage": "transfer", "origin": "prefill-1", "reason": "NIXL transfer timed out"}
    assert at == store.failure(7).at_ms / 1000


def test_get_of_a_room_cancelled_before_any_entry_exits_0(connect, store):
    assert store.cancel(11, "never started", origin="router-2").outcome is CancelOutcome.CANCELLED
    done = cli(connect, "get", "11")
    assert done.exit_code == 0
    (line,) = done.output.splitlines()
    assert line.startswith("room 11: first failure ") and line.endswith("ago: cancelled by router-2: never started")
    assert json.loads(cli(connect, "get", "11", "--json").output)["rooms"][0]["failure"]["origin"] == "router-2"


def test_ls_json_carries_the_failure(connect, store):
    _two_rooms(store)
    rooms = {r["room"]: r for r in json_lines(cli(connect, "ls", "--json").output)}
    assert rooms[7]["failure"]["origin"] == "prefill-1" and "failure" not in rooms[42]


def test_ls_lists_a_room_cancelled_before_anyone_wrote_it(connect, store):
    _two_rooms(store)
    store.cancel(9, "never started", origin="router-2")
    rows = [line.split() for line in cli(connect, "ls").output.splitlines()[1:]]
    assert [row[:3] for row in rows if row[0] == "9"] == [["9", "-", "-"]]
    assert "cancelled by router-2: never started" in cli(connect, "ls").output
    rooms = {r["room"]: r for r in json_lines(cli(connect, "ls", "--json").output)}
    assert rooms[9]["participants"] == {} and rooms[9]["failure"]["origin"] == "router-2"
    # A filter asks for entries: the room has none.
    assert "9 " not in cli(connect, "ls", "--participant", "decode-1").output
    assert 9 not in {r["room"] for r in json_lines(cli(connect, "ls", "--status", "failed", "--json").output)}


def test_the_doctors_probe_entry_hides_nothing_else(connect, store):
    """``get`` and ``ls`` leave out the probe entry of ``kvstatus doctor``, not the room's first failure."""
    _two_rooms(store)
    store.for_participant(PROBE_PARTICIPANT).update_status(7, KVPoll.Bootstrapping)
    document = json.loads(cli(connect, "get", "7", "--json").output)["rooms"][0]
    assert PROBE_PARTICIPANT not in document["participants"] and document["failure"]["origin"] == "prefill-1"
    rooms = {r["room"]: r for r in json_lines(cli(connect, "ls", "--json").output)}
    assert rooms[7]["failure"]["origin"] == "prefill-1"


@pytest.mark.real
def test_cancel_as_an_operator_types_it(real_server: RedisServer) -> None:
    env = {"KVSTATUS_URL": real_server.url, "KVSTATUS_NAMESPACE": "cancel-real"}
    assert run_cli("set", "5", "waitingforinput", "-p", "decode-0", env=env).returncode == 0
    done = run_cli("cancel", "5", "6", "--reason", "router restart", "--origin", "router-0", env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "room 5: cancelled, 1 open entry failed",
        "room 6: cancelled, 0 open entries failed",
    ]
    again = run_cli("cancel", "5", "--reason", "again", "--json", env=env)
    assert again.returncode == 0, again.stderr
    (room,) = json.loads(again.stdout)["rooms"]
    assert (room["outcome"], room["failed"], room["first_failure"]["origin"]) == ("ALREADY_FAILED", 0, "router-0")
    shown = run_cli("get", "5", env=env)
    assert shown.returncode == 0 and "ago: cancelled by router-0: router restart" in shown.stdout
    bad = run_cli("cancel", "5", "--reason", " ", env=env)
    assert_clean_failure(bad.stdout + bad.stderr, bad.returncode, 2, "--reason must not be empty")
    down = run_cli("--url", "redis://127.0.0.1:1/0?retries=0", "cancel", "5", "--reason", "x", env=env)
    assert_clean_failure(down.stdout + down.stderr, down.returncode, 1, "Redis unavailable")
