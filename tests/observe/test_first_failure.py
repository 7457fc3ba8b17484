"""Issue 16 item 6 on the observe side: the exporter counts the rooms whose first failure is recorded, by stage,
and the board's room detail shows that failure. Against a real redis-server; the exporter's collector and the
board run in this process over it (tests/observe/test_exporter.py and test_board.py serve them as processes)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kvstatus import KVPoll, StatusStore
from kvstatus.admin.reads import iter_rooms
from kvstatus.admin.sweep import sweep
from kvstatus.errors import CorruptedValueError
from kvstatus.keys import FATE_FIELD, KeySchema
from kvstatus.model import Stage
from kvstatus.observe.board import Board
from kvstatus.observe.exporter import METRICS, build_registry
from kvstatus.observe.scanner import PassLoop
from tests.helpers.backends import fresh_namespace
from tests.servers import RedisServer

pytestmark = pytest.mark.real

METRIC = "kvstatus_rooms_by_failure_stage"
HOSTILE_ORIGIN = "<img src=x onerror=alert(document.cookie)>"  # a participant name cannot hold it; a raw write can
HOSTILE_REASON = "</p><script>alert('tenant A')</script>&amp;\"'"
LIVE = set(range(1, 9)) | set(range(10, 21))  # the rooms populate() leaves readable
CORRUPTED = {"banana", "123:exploded:prefill-0:no such stage", "12x:transfer:prefill-0:not a time", "99:cancelled::"}


def populate(url: str, namespace: str) -> dict[int, Stage]:
    """Rooms failed at every stage, rooms that did not fail, and rooms whose record is corrupted (rooms 100 on).

    Returns room -> the stage of its first failure, for the rooms that have one."""
    prefill = StatusStore.from_url(url, namespace=namespace, participant="prefill-0")
    decode = prefill.for_participant("decode-0")
    router = prefill.for_participant("router-1")
    for room, status in {1: KVPoll.Bootstrapping, 2: KVPoll.WaitingForInput, 3: KVPoll.Transferring}.items():
        prefill.update_status(room, status)
        decode.update_status(room, KVPoll.WaitingForInput)
        prefill.update_status(room, KVPoll.Failed)
        prefill.record_failure(room, f"failed in room {room}")
    decode.update_status(4, KVPoll.Success)  # fails after its transfer: stage transfer
    decode.update_status(4, KVPoll.Failed)
    prefill.update_status(5, KVPoll.Transferring)
    decode.update_status(5, KVPoll.Transferring)
    decode.update_status(5, KVPoll.Failed)  # the first failure of room 5 ...
    prefill.update_status(5, KVPoll.Failed)  # ... stays the first: one room, one record
    prefill.update_status(6, KVPoll.Transferring)
    router.cancel(6, "client went away")
    router.cancel(7, "drained")  # a room nobody has written: its key holds the record alone
    decode.update_many({room: KVPoll.Transferring for room in range(10, 20)})  # open: no failure
    prefill.update_status(20, KVPoll.Success)
    with StatusStore.from_url(url, namespace=namespace, participant="dead-0", lease_ttl=3) as dead:
        dead.update_status(8, KVPoll.Bootstrapping)
    prefill.client.hset(f"kvstatus:{namespace}:lease:dead-0", "deadline", 1)  # its lease is lost
    assert sweep(prefill.client, KeySchema(namespace)).swept == 1  # stage lease-lost
    raw = prefill.client
    for room, value in enumerate(sorted(CORRUPTED), start=100):
        key = f"kvstatus:{namespace}:{{{room}}}"
        raw.hset(key, mapping={"prefill-0": int(KVPoll.Failed), FATE_FIELD: value})
        raw.pexpire(key, 600_000)
    prefill.close()
    return {
        1: Stage.BOOTSTRAP,
        2: Stage.WAITING,
        3: Stage.TRANSFER,
        4: Stage.TRANSFER,
        5: Stage.TRANSFER,
        6: Stage.CANCELLED,
        7: Stage.CANCELLED,
        8: Stage.LEASE_LOST,
    }


def samples(loop: PassLoop) -> dict[str, list[Any]]:
    text = generate_latest(build_registry([loop])).decode()
    found: dict[str, list[Any]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            found.setdefault(s.name, []).append(s)
    return found


def test_the_exporter_counts_rooms_by_the_stage_of_their_first_failure(redis_server: RedisServer) -> None:
    namespace = fresh_namespace("fate-exp")
    stages = populate(redis_server.url, namespace)
    client = redis_server.client()
    loop = PassLoop(client, KeySchema(namespace), batch=7)  # several batches per pass
    result = loop.run_once()
    assert result is not None
    assert result.failures_by_stage == Counter(stages.values())
    found = samples(loop)
    by_stage = {s.labels["stage"]: s.value for s in found[METRIC]}
    assert by_stage == {"bootstrap": 1, "waiting": 1, "transfer": 3, "lease-lost": 1, "superseded": 0, "cancelled": 2}
    assert all(set(s.labels) == {"namespace", "stage"} for s in found[METRIC])  # no room id, no origin
    assert {s.labels["namespace"] for s in found[METRIC]} == {namespace}
    # What the rooms themselves say, read as kvstatus get reads them (the corrupted ones are skipped there too).
    skipped: list[int] = []
    views = list(iter_rooms(client, KeySchema(namespace), on_corrupt=lambda room, _: skipped.append(room)))
    assert Counter(v.failure.stage.value for v in views if v.failure is not None) == +Counter(by_stage)
    # A record kvstatus cannot read: the room is counted corrupted and skipped, as a status it cannot read is.
    assert sorted(skipped) == list(range(100, 100 + len(CORRUPTED)))
    assert [s.value for s in found["kvstatus_corrupted_rooms"]] == [len(CORRUPTED)]
    assert [s.value for s in found["kvstatus_rooms"]] == [len(views)] == [len(LIVE)]
    assert METRIC in METRICS


def test_the_stage_series_are_zero_until_a_room_fails(redis_server: RedisServer) -> None:
    namespace = fresh_namespace("fate-exp")
    with StatusStore.from_url(redis_server.url, namespace=namespace, participant="prefill-0") as store:
        store.update_many({room: KVPoll.Transferring for room in range(5)})
        loop = PassLoop(store.client, KeySchema(namespace))
        loop.run_once()
        assert {s.labels["stage"]: s.value for s in samples(loop)[METRIC]} == {stage.value: 0 for stage in Stage}
        store.update_status(3, KVPoll.Failed)
        loop.run_once()
        assert {s.labels["stage"]: s.value for s in samples(loop)[METRIC]} == {
            **{stage.value: 0 for stage in Stage},
            "transfer": 1,
        }


def test_the_board_detail_shows_the_first_failure(redis_server: RedisServer) -> None:
    namespace = fresh_namespace("fate-board")
    populate(redis_server.url, namespace)
    client = redis_server.client()
    board = Board(client, KeySchema(namespace), shown_url=redis_server.url)
    with StatusStore.from_url(redis_server.url, namespace=namespace, participant="decode-0") as store:
        for room in (1, 2, 3, 4, 5, 6, 7, 8):
            failure = store.failure(room)
            assert failure is not None
            assert board.room(room)["failure"] == failure.to_json(), room  # the CLI's JSON, written once
    detail = board.room(3)
    assert detail["failure"]["stage"] == "transfer" and detail["failure"]["origin"] == "prefill-0"
    assert detail["failure"]["reason"] == "failed in room 3" and detail["failure"]["at"] > 1.7e9
    assert board.room(5)["failure"]["origin"] == "decode-0"  # the first failure, not the later one
    cancelled = board.room(7)  # the record alone
    assert cancelled["participants"] == []
    assert cancelled["failure"]["stage"] == "cancelled" and cancelled["failure"]["reason"] == "drained"
    assert cancelled["failure"]["origin"] == "router-1"
    lost = board.room(8)["failure"]
    assert (lost["stage"], lost["origin"]) == ("lease-lost", "dead-0")
    assert board.room(10)["failure"] is None and board.room(20)["failure"] is None
    assert board.room(9) is None


def test_hostile_text_in_a_record_is_served_as_data(redis_server: RedisServer) -> None:
    """The JSON carries a tenant's text verbatim; the page escapes it (test_board_browser.py checks it renders)."""
    namespace = fresh_namespace("fate-board")
    client = redis_server.client()
    key = f"kvstatus:{namespace}:{{42}}"
    client.hset(
        key,
        mapping={
            "prefill-0": int(KVPoll.Failed),
            FATE_FIELD: f"1700000000000:cancelled:{HOSTILE_ORIGIN}:{HOSTILE_REASON}",
        },
    )
    client.pexpire(key, 600_000)
    board = Board(client, KeySchema(namespace), shown_url=redis_server.url)
    failure = board.room(42)["failure"]
    assert failure == {"stage": "cancelled", "origin": HOSTILE_ORIGIN, "reason": HOSTILE_REASON, "at": 1.7e9}


def test_a_corrupted_record_is_handled_as_every_corrupted_value(redis_server: RedisServer) -> None:
    namespace = fresh_namespace("fate-board")
    populate(redis_server.url, namespace)
    client = redis_server.client()
    key = f"kvstatus:{namespace}:{{99}}"
    client.hset(key, "prefill-0", "banana")  # a corrupted status, for comparison
    client.pexpire(key, 600_000)
    board = Board(client, KeySchema(namespace), shown_url=redis_server.url)
    assert board.loop.run_once() is not None
    summary = board.summary()
    assert summary["corrupted_rooms"] == len(CORRUPTED) + 1  # counted, and left out of the counts
    assert summary["rooms"] == len(LIVE)
    listed = {int(r["room"]) for r in board.page("0-0", 500, None, None)["rooms"]}
    assert listed.isdisjoint(range(99, 100 + len(CORRUPTED)))  # the page skips them, as it skips room 99
    assert listed >= LIVE - {7}  # (room 7 holds no entry, only its record: room_matches lists no such room)
    with pytest.raises(CorruptedValueError, match="holds 'banana', not a status"):
        board.room(99)
    for room in range(100, 100 + len(CORRUPTED)):
        with pytest.raises(CorruptedValueError, match=f"field {FATE_FIELD} holds .*not a failure record"):
            board.room(room)  # the detail names the key, as for a corrupted status (a 503 over HTTP)
    assert client.hget(f"kvstatus:{namespace}:{{100}}", FATE_FIELD) is not None  # left as it is
