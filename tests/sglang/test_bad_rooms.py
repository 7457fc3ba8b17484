"""A ``bootstrap_room`` kvstatus cannot store fails its own request, never the engine (stand-in, no sglang needed).

SGLang's dict took any hashable as a room; the store takes ints in [0, 2**63 - 1].
"""

from __future__ import annotations

import logging
from typing import Any

import fakeredis
import pytest
import redis

from kvstatus import KVPoll, Outcome, StatusStore
from kvstatus.errors import InvalidStatusError
from kvstatus.sglang import install
from kvstatus.sglang.mapping import INVALID_ROOM_RESULT
from tests.helpers.backends import fresh_namespace
from tests.sglang.standin import (
    CommonKVReceiver,
    CommonKVSender,
    DisaggregationMode,
    KVTransferError,
    NixlKVManager,
    make_manager,
)

BAD_ROOMS = [-1, 2**63, "42", None, True, 1.5, b"7", (4,), [3]]
REASON = "is not a room id kvstatus can store"


def _pair(**store_options: Any) -> tuple[Any, Any, fakeredis.FakeRedis]:
    server = fakeredis.FakeServer()
    namespace = fresh_namespace("sgbad")
    managers = []
    for mode in (DisaggregationMode.PREFILL, DisaggregationMode.DECODE):
        store = StatusStore(fakeredis.FakeRedis(server=server), namespace=namespace, policy="strict", **store_options)
        managers.append(make_manager(mode=mode))
        install(managers[-1], store)
    return managers[0], managers[1], fakeredis.FakeRedis(server=server)


@pytest.mark.parametrize("room", BAD_ROOMS, ids=repr)
def test_a_bad_room_fails_its_request_and_the_engine_goes_on(room: Any, caplog: pytest.LogCaptureFixture) -> None:
    prefill, decode, raw = _pair()
    caplog.set_level(logging.WARNING, logger="kvstatus.sglang")
    # The prefill: the sender's __init__ opens the room, the scheduler polls it, then asks why it failed.
    assert prefill.update_status(room, KVPoll.Bootstrapping) is INVALID_ROOM_RESULT
    assert INVALID_ROOM_RESULT == (Outcome.REFUSED_CREATE, KVPoll.Failed)
    sender = CommonKVSender(prefill, room)
    assert sender.poll() == KVPoll.Failed and sender.conclude_state == KVPoll.Failed
    with pytest.raises(KVTransferError) as info:
        sender.failure_exception()
    hashable = not isinstance(room, list)
    if hashable:  # an unhashable id cannot be a key of failure_records; the request fails all the same
        assert REASON in str(info.value) and "the request fails" in str(info.value)
    assert prefill.failure_records == {}  # popped by failure_exception: nothing left behind
    # The decode: its receiver polls check_status only (upstream's dict raised KeyError for a missing room).
    receiver = CommonKVReceiver(decode, room)
    assert receiver.poll() == KVPoll.Failed
    # Redis was not touched, and one warning per opening update was logged, naming the participant.
    assert raw.dbsize() == 0
    warnings = [r.getMessage() for r in caplog.records if r.name == "kvstatus.sglang"]
    assert len(warnings) == 2 and warnings[0].startswith("participant prefill-tp0-pp0: bootstrap_room ")
    # The engine goes on: the next request, on a good room, is served as ever.
    assert prefill.update_status(5, KVPoll.Bootstrapping).outcome is Outcome.CREATED
    assert CommonKVSender(prefill, 5).poll() == KVPoll.Bootstrapping


@pytest.mark.parametrize("room", BAD_ROOMS, ids=repr)
def test_every_read_answers_failed_and_every_write_is_refused(room: Any) -> None:
    prefill, _, raw = _pair()
    m = prefill.request_status
    assert room in m and m[room] == KVPoll.Failed and m.get(room) == KVPoll.Failed
    assert prefill.check_status(room) == KVPoll.Failed
    for status in KVPoll:
        assert m.update_status(room, status) is INVALID_ROOM_RESULT
    m[room] = KVPoll.Success
    assert m.pop(room) == KVPoll.Failed and m.pop(room, None) == KVPoll.Failed
    del m[room]  # nothing to remove, and no KeyError into the engine
    assert m.clear_room(room) is False
    assert room in m and raw.dbsize() == 0


def test_nixl_check_status_fails_a_bad_room_instead_of_waiting() -> None:
    manager = make_manager(NixlKVManager)
    install(manager, StatusStore(fakeredis.FakeRedis(), namespace="ns", policy="strict"))
    assert manager.check_status(-1) == KVPoll.Failed  # its default for a missing room is WaitingForInput
    assert manager.check_status(12) == KVPoll.WaitingForInput


def test_bad_ids_from_a_peer_never_grow_failure_records() -> None:
    prefill, _, _ = _pair()
    for room in range(-1, -200, -1):  # e.g. ABORT messages with bad ids: update_status(room, Failed)
        assert prefill.update_status(room, KVPoll.Failed) is INVALID_ROOM_RESULT
    assert prefill.failure_records == {}
    # A symptom recorded first (upstream's "Duplicate decode bootstrap room") gives way to the cause.
    prefill.record_failure(-5, "Duplicate decode bootstrap room")
    prefill.update_status(-5, KVPoll.Failed)
    assert REASON in prefill.failure_records[-5]
    long = "x" * 10_000
    prefill.update_status(long, KVPoll.Bootstrapping)
    assert len(prefill.failure_records[long]) < 200  # a huge id is cut in the reason and the log


@pytest.mark.parametrize("lease_ttl", [None, 5])
def test_pp_consensus_of_a_bad_room_is_failed(lease_ttl: Any) -> None:
    server = fakeredis.FakeServer()
    namespace = fresh_namespace("sgbadpp")
    ranks = [make_manager(pp_rank=r, pp_size=2) for r in range(2)]
    for m in ranks:
        install(
            m,
            StatusStore(fakeredis.FakeRedis(server=server), namespace=namespace, policy="strict", lease_ttl=lease_ttl),
        )
    rank0 = ranks[0]
    for room in BAD_ROOMS:
        assert rank0.check_status_pp_consensus(room) == KVPoll.Failed
        assert rank0.request_status.collect(room) == [KVPoll.Failed, KVPoll.Failed]
        consensus = rank0.request_status.consensus(room)
        assert consensus.status == KVPoll.Failed and REASON in consensus.reason
    for m in ranks:
        m.update_status(9, KVPoll.Bootstrapping)
    got = rank0.request_status.collect_many([9, -1, "9", 9])
    assert got == {9: [KVPoll.Bootstrapping] * 2, -1: [KVPoll.Failed] * 2, "9": [KVPoll.Failed] * 2}
    for m in ranks:
        m.request_status.close()


@pytest.mark.real
def test_bad_rooms_through_the_near_cache(redis_server: Any) -> None:
    namespace = fresh_namespace("sgbadnc")
    manager = make_manager()
    install(manager, redis_server.url, namespace=namespace, near_cache=True)
    raw = redis.Redis(host=redis_server.host, port=redis_server.port)
    for room in BAD_ROOMS:
        assert manager.update_status(room, KVPoll.Bootstrapping) is INVALID_ROOM_RESULT
        assert CommonKVSender(manager, room).poll() == KVPoll.Failed
        assert manager.check_status(room) == KVPoll.Failed
    manager.update_status(3, KVPoll.Bootstrapping)
    assert CommonKVSender(manager, 3).poll() == KVPoll.Bootstrapping
    rooms = [key.decode() for key in raw.scan_iter(match=f"kvstatus:{namespace}:{{*}}")]
    assert rooms == [f"kvstatus:{namespace}:{{3}}"]  # the bad ids wrote no room
    manager.request_status.close()


@pytest.mark.parametrize("status", [[1], {}, "1", 1.5, 7, None], ids=repr)
def test_a_bad_status_is_the_callers_error_never_a_type_error(status: Any) -> None:
    """A status the store refuses raises InvalidStatusError, as ``store.update_status`` does; on a room id the store
    cannot hold, the room's answer wins. An unhashable status raised TypeError from the map's own checks."""
    prefill, _, raw = _pair()
    with pytest.raises(InvalidStatusError):
        prefill.request_status.update_status(5, status)
    assert prefill.request_status.update_status(-1, status) is INVALID_ROOM_RESULT
    assert raw.dbsize() == 0
