"""One room, one fate, through SGLang's managers (the stand-in): a peer's failure or a router's cancel fails the
other side's open entry, and its ``failure_exception`` names the room's first failure, not "another rank"."""

from __future__ import annotations

import logging
import threading
import types
from datetime import datetime
from typing import Any, Callable, Iterator, Optional

import pytest
import redis

from kvstatus import KVPoll, StatusStore
from kvstatus.model import CancelOutcome
from kvstatus.sglang import install
from kvstatus.sglang.manager import FailureNotes, failure_text
from kvstatus.sglang.plugin import ENV_NAMESPACE, ENV_SHARED_FATE, ENV_URL, install_from_env
from tests.helpers.backends import fresh_namespace
from tests.servers import free_port
from tests.sglang.standin import (
    OPENED,
    CommonKVReceiver,
    CommonKVSender,
    DisaggregationMode,
    KVTransferError,
    make_manager,
    raise_failure,
)
from tests.sglang.support import room_command_counts

ROOM = 5151
UNKNOWN = "Failed due to an unknown reason from another rank"


def _failure(call: Callable[[], None]) -> KVTransferError:
    with pytest.raises(KVTransferError) as info:
        call()
    return info.value


def _managers(url: str, namespace: str, **options: Any) -> tuple[Any, Any]:
    prefill = make_manager(mode=DisaggregationMode.PREFILL)
    decode = make_manager(mode=DisaggregationMode.DECODE)
    for manager in (prefill, decode):
        install(manager, url, namespace=namespace, **options)
    return prefill, decode


@pytest.fixture
def pd(redis_server: Any) -> Iterator[types.SimpleNamespace]:
    """A prefill and a decode manager, installed on one namespace of a real Redis."""
    namespace = fresh_namespace("sgfate")
    prefill, decode = _managers(redis_server.url, namespace)
    yield types.SimpleNamespace(
        prefill=prefill,
        decode=decode,
        url=redis_server.url,
        namespace=namespace,
        raw=redis.Redis(host=redis_server.host, port=redis_server.port),
    )
    for manager in (prefill, decode):
        manager.request_status.close()


def _open(prefill: Any, decode: Any, room: int = ROOM) -> tuple[CommonKVSender, CommonKVReceiver]:
    """A request in flight: the decode waits for the KV, the prefill transfers it."""
    receiver = CommonKVReceiver(decode, room)
    decode.update_status(room, KVPoll.WaitingForInput)
    prefill.update_status(room, KVPoll.Bootstrapping)
    prefill.update_status(room, KVPoll.Transferring)
    return CommonKVSender(prefill, room), receiver


def _fail(manager: Any, room: int, reason: str) -> None:
    """What upstream does when a side fails: record the reason, then the status."""
    manager.record_failure(room, reason)
    manager.update_status(room, KVPoll.Failed)


@pytest.mark.real
def test_a_decode_failure_fails_the_prefill_which_names_it(pd: Any) -> None:
    sender, receiver = _open(pd.prefill, pd.decode)
    assert sender.poll() == KVPoll.Transferring
    _fail(pd.decode, ROOM, "KV receiver timed out")
    assert pd.prefill.check_status(ROOM) == KVPoll.Failed and sender.poll() == KVPoll.Failed
    record = StatusStore.from_url(pd.url, namespace=pd.namespace).failure(ROOM)
    error = _failure(sender.failure_exception)
    text = error.failure_reason
    assert text.startswith("failed at waiting by decode-tp0-pp0: KV receiver timed out (the room's first failure, at ")
    assert text == failure_text(record) and not error.is_from_another_rank
    stamp = text.rsplit("at ", 1)[1].removesuffix(", kvstatus)")
    assert round(datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() * 1000) == record.at_ms
    assert pd.prefill.failure_records == {}  # popped by failure_exception: nothing left behind
    # The decode reports its own reason, from its own record (the prefill's pop took nothing of it).
    assert receiver.poll() == KVPoll.Failed
    assert _failure(receiver.failure_exception).failure_reason == "KV receiver timed out"
    assert pd.decode.failure_records == {}


@pytest.mark.real
def test_a_cancel_fails_both_sides_and_each_names_the_canceller(pd: Any) -> None:
    sender, receiver = _open(pd.prefill, pd.decode)
    router = StatusStore.from_url(pd.url, namespace=pd.namespace, participant="router-1")
    assert router.cancel(ROOM, "client went away").outcome is CancelOutcome.CANCELLED
    assert pd.prefill.check_status(ROOM) == KVPoll.Failed == pd.decode.check_status(ROOM)
    assert sender.poll() == KVPoll.Failed and receiver.poll() == KVPoll.Failed
    for failure_exception in (sender.failure_exception, receiver.failure_exception):
        text = _failure(failure_exception).failure_reason
        assert text.startswith("cancelled by router-1: client went away (the room's first failure, at ")
    assert pd.prefill.failure_records == {} == pd.decode.failure_records


@pytest.mark.real
def test_a_prefill_that_finished_keeps_its_success(pd: Any) -> None:
    sender, receiver = _open(pd.prefill, pd.decode)
    pd.prefill.update_status(ROOM, KVPoll.Success)
    _fail(pd.decode, ROOM, "decode ran out of memory")
    assert sender.poll() == KVPoll.Success and pd.prefill.check_status(ROOM) == KVPoll.Success
    assert pd.prefill.failure_records == {}
    assert receiver.poll() == KVPoll.Failed


FILL = {"hgetall": 1, "pttl": 1}
"""What the near cache reads for a room it does not hold (one round trip)."""


@pytest.mark.real
@pytest.mark.parametrize(
    "near_cache, healthy, first_failed, failed",
    [
        # The default: polls of an unchanged room cost nothing; a change costs one fill, the cause included.
        (None, {}, FILL, {}),
        # Without the near cache: two reads a poll (`in`, check_status); the first Failed read looks the cause up
        # (one HGET).
        (False, {"hmget": 40}, {"hmget": 20, "hget": 1}, {"hmget": 20}),
    ],
    ids=["defaults", "near-cache-off"],
)
def test_the_cause_costs_one_read_once_and_nothing_on_a_healthy_poll(
    redis_server: Any,
    near_cache: Optional[bool],
    healthy: dict[str, int],
    first_failed: dict[str, int],
    failed: dict[str, int],
) -> None:
    raw = redis.Redis(host=redis_server.host, port=redis_server.port)
    namespace = fresh_namespace("sgcost")
    prefill, decode = _managers(redis_server.url, namespace, near_cache=near_cache)
    base = prefill.request_status.store.prefix + ":" + namespace + ":"
    try:
        sender, _ = _open(prefill, decode)
        sender.poll()  # the first poll after the writes reads the room
        check = prefill.check_status
        assert room_command_counts(raw, base, lambda: [sender.poll() for _ in range(20)]) == healthy
        _fail(decode, ROOM, "gone")
        # The first Failed read finds the cause; later reads find it recorded.
        assert room_command_counts(raw, base, lambda: [check(ROOM) for _ in range(20)]) == first_failed
        with prefill.failure_lock:
            assert prefill.failure_records.pop(ROOM).startswith("failed at waiting by decode-tp0-pp0: gone")
        # Once taken, a room that keeps reading Failed is not looked up again, and grows nothing.
        assert room_command_counts(raw, base, lambda: [check(ROOM) for _ in range(20)]) == failed
        assert prefill.failure_records == {}
    finally:
        for manager in (prefill, decode):
            manager.request_status.close()


@pytest.mark.real
def test_records_stay_bounded_and_a_reused_room_starts_clean(pd: Any) -> None:
    notes = pd.prefill.request_status.on_failed.__self__
    assert isinstance(notes, FailureNotes)
    notes.limit = 3
    rooms = list(range(100, 110))
    for room in rooms:
        _open(pd.prefill, pd.decode, room)
        _fail(pd.decode, room, f"decode failed room {room}")
        for _ in range(3):
            assert pd.prefill.check_status(room) == KVPoll.Failed
    # No failure_exception took them: only the last 3 looked-up rooms keep a record.
    assert sorted(pd.prefill.failure_records) == rooms[-3:] and list(notes.noted) == rooms[-3:]
    # A reason the manager recorded itself is never overwritten (first root cause wins).
    own = rooms[0]
    pd.prefill.record_failure(own, "own cause")
    assert pd.prefill.check_status(own) == KVPoll.Failed and pd.prefill.failure_records[own] == "own cause"
    # A new request on a room does not inherit the previous request's cause.
    room = rooms[-1]
    pd.prefill.request_status.pop(room)
    pd.decode.request_status.pop(room)
    pd.prefill.update_status(room, KVPoll.Bootstrapping)
    assert room not in pd.prefill.failure_records and room not in notes.noted
    assert pd.prefill.check_status(room) == KVPoll.Bootstrapping


@pytest.mark.real
def test_shared_fate_off_keeps_each_manager_on_its_own_entry(
    redis_server: Any, caplog: pytest.LogCaptureFixture
) -> None:
    namespace = fresh_namespace("sgfate")
    env = {ENV_URL: redis_server.url, ENV_NAMESPACE: namespace, ENV_SHARED_FATE: "0"}
    caplog.set_level(logging.INFO, logger="kvstatus.sglang")
    prefill, decode = make_manager(), make_manager(mode=DisaggregationMode.DECODE)
    maps = [install_from_env(manager, env) for manager in (prefill, decode)]
    lines = [r.getMessage() for r in caplog.records if r.name == "kvstatus.sglang"]
    assert len(lines) == 2 and all(line.endswith(" s (generation 1), shared fate off, timeline on") for line in lines)
    assert all(", lease 10 s " in line for line in lines)  # the plugin's default lease
    sender, _ = _open(prefill, decode)
    _fail(decode, ROOM, "KV receiver timed out")
    assert sender.poll() == KVPoll.Transferring and prefill.check_status(ROOM) == KVPoll.Transferring
    assert prefill.failure_records == {}
    # A cancel writes Failed into every open entry: read alone, the entry is Failed, and the cause is named.
    StatusStore.from_url(redis_server.url, namespace=namespace, participant="router-1").cancel(ROOM, "drained")
    assert sender.poll() == KVPoll.Failed
    assert _failure(sender.failure_exception).failure_reason.startswith(
        "failed at waiting by decode-tp0-pp0: KV receiver"
    )
    for status_map in maps:
        status_map.close()


@pytest.mark.real
def test_shared_fate_is_on_by_default_through_the_plugin(redis_server: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="kvstatus.sglang")
    env = {ENV_URL: redis_server.url, ENV_NAMESPACE: fresh_namespace("sgfate")}
    for value in ("", "1", "yes"):
        status_map = install_from_env(make_manager(), {**env, ENV_SHARED_FATE: value})
        assert status_map.store.shared_fate is True
        status_map.close()
    lines = [r.getMessage() for r in caplog.records if r.name == "kvstatus.sglang"]
    assert len(lines) == 3 and all(line.endswith(", shared fate on, timeline on") for line in lines)


@pytest.mark.real
def test_a_failed_pp_rank_is_named_by_rank_0(redis_server: Any) -> None:
    namespace = fresh_namespace("sgfate")
    ranks = [make_manager(pp_rank=rank, pp_size=2) for rank in range(2)]
    for manager in ranks:
        install(manager, redis_server.url, namespace=namespace)
        manager.update_status(ROOM, KVPoll.Bootstrapping)
        manager.update_status(ROOM, KVPoll.Transferring)
    _fail(ranks[1], ROOM, "rank 1 lost its transfer")
    sender = CommonKVSender(ranks[0], ROOM)
    assert sender.poll_pp_consensus() == KVPoll.Failed
    text = _failure(sender.failure_exception).failure_reason
    assert text.startswith("failed at transfer by prefill-tp0-pp1: rank 1 lost its transfer (the room's first")
    for manager in ranks:
        manager.request_status.close()


def test_a_cause_that_cannot_be_read_gives_a_clear_local_reason() -> None:
    """Redis went away between the read that answered Failed and the look-up: no exception into the engine."""
    dead = StatusStore.from_url(f"redis://127.0.0.1:{free_port()}/0?retries=0", namespace="x", participant="p")
    records: dict[Any, str] = {}
    notes = FailureNotes(records, threading.Lock(), dead)
    notes.failed(ROOM)
    assert records[ROOM].startswith(
        "the room reads Failed in kvstatus (a participant failed it, or it was cancelled), but its first failure "
        "could not be read: BackendRefusedError: "
    )
    notes.failed(ROOM + 1, "participant prefill-tp0-pp1 lost its lease")  # what the PP consensus said instead
    assert records[ROOM + 1] == "participant prefill-tp0-pp1 lost its lease"
    notes.failed(-1)  # an id the store cannot hold: its reason was recorded when its request opened
    assert -1 not in records


def test_a_reason_that_cannot_reach_redis_stays_local_and_logs(caplog: pytest.LogCaptureFixture) -> None:
    manager = make_manager()
    install(manager, f"redis://127.0.0.1:{free_port()}/0?retries=0", namespace="x", check=False)
    OPENED.append(manager)  # its outage probe retries the dead port until closed
    caplog.set_level(logging.WARNING, logger="kvstatus.sglang")
    manager.record_failure(ROOM, "transfer failed")  # upstream's record; the copy in Redis fails quietly
    assert manager.failure_records == {ROOM: "transfer failed"}
    assert [r.levelname for r in caplog.records if "Redis failed a status call" in r.getMessage()] == ["ERROR"]
    assert _failure(lambda: raise_failure(manager, ROOM)).failure_reason == "transfer failed"  # failure_exception's end


@pytest.mark.real
def test_the_plugins_defaults_record_each_rooms_timeline(redis_server: Any) -> None:
    """What a deployment gets with KVSTATUS_SGLANG_URL alone: every entry's timeline, removed with the entry."""
    env = {ENV_URL: redis_server.url, ENV_NAMESPACE: fresh_namespace("sgtimeline")}
    prefill, decode = make_manager(), make_manager(mode=DisaggregationMode.DECODE)
    maps = [install_from_env(manager, env) for manager in (prefill, decode)]
    assert all(status_map.store.timeline for status_map in maps)
    _open(prefill, decode)
    prefill.update_status(ROOM, KVPoll.Success)
    decode.update_status(ROOM, KVPoll.Success)
    plain = StatusStore.from_url(redis_server.url, namespace=env[ENV_NAMESPACE])  # the maps' near cache keeps none
    view = plain.room(ROOM)
    assert [s.status for s in view.timelines["prefill-tp0-pp0"]] == [
        KVPoll.Bootstrapping,
        KVPoll.Transferring,
        KVPoll.Success,
    ]
    assert [s.status for s in view.timelines["decode-tp0-pp0"]] == [
        KVPoll.Bootstrapping,  # the receiver's constructor
        KVPoll.WaitingForInput,
        KVPoll.Success,
    ]
    for manager in (prefill, decode):
        manager.request_status.pop(ROOM)
    assert plain.room(ROOM).timelines == {} and not plain.room(ROOM).exists
    plain.close()
    for status_map in maps:
        status_map.close()


@pytest.mark.real
def test_upstreams_no_reason_placeholder_gives_way_to_the_rooms_first_failure(pd: Any) -> None:
    """Seen in the e2e tier: a cancel fails the prefill's entry by shared fate, its sender tells the decode "Failed"
    over ZMQ without a reason, and the decode records upstream's placeholder before its own read of the room. The
    client must see the cancel, not "it might be dead"."""
    sender, receiver = _open(pd.prefill, pd.decode)
    StatusStore.from_url(pd.url, namespace=pd.namespace, participant="router-1").cancel(ROOM, "client went away")
    pd.decode.record_failure(ROOM, "Failed to get kvcache from prefill instance, it might be dead")
    pd.decode.update_status(ROOM, KVPoll.Failed)
    error = _failure(receiver.failure_exception)
    assert "cancelled by router-1: client went away" in error.failure_reason
    # A reason of the manager's own is kept as it is, placeholder or not when the room has no first failure.
    _, other = _open(pd.prefill, pd.decode, ROOM + 1)
    pd.decode.record_failure(ROOM + 1, "Failed to get kvcache from prefill instance, it might be dead")
    assert _failure(other.failure_exception).failure_reason.endswith("it might be dead")
