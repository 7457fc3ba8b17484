"""Redis failing under installed managers (the stand-in): the rooms fail with the error as their reason, the
engine's calls never raise, an outage costs one failed call and then none, and the managers recover by themselves
(kvstatus.sglang.outage)."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from typing import Any

import pytest

from kvstatus import KVPoll, Outcome
from kvstatus.sglang import install
from kvstatus.sglang.outage import OUTAGE_SECONDS
from tests.helpers.backends import fresh_namespace
from tests.nearcache.helpers import eventually
from tests.servers import RedisServer
from tests.sglang.standin import (
    OPENED,
    CommonKVReceiver,
    CommonKVSender,
    DisaggregationMode,
    KVTransferError,
    make_manager,
)

pytestmark = pytest.mark.real
ROOM = 6161
DOWN = "kvstatus: Redis could not be reached for this room's status ("
SLACK = 2.0  # seconds a loaded 2-core box may add to a bound (scheduling), far below what a missed bound costs


def _pair(url: str) -> tuple[Any, Any]:
    namespace = fresh_namespace("outage")
    prefill, decode = make_manager(mode=DisaggregationMode.PREFILL), make_manager(mode=DisaggregationMode.DECODE)
    OPENED.extend((prefill, decode))
    for manager in (prefill, decode):
        install(manager, url, namespace=namespace)
    return prefill, decode


def _counted(target: Any, method: str) -> list[int]:
    """Count the calls made to ``target``'s ``method`` (an instance attribute over it), e.g. a store's ``get`` or
    its sender's ``send`` (everything the store sends to Redis, the near cache's fills and checks included)."""
    calls, original = [], getattr(target, method)

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return original(*args, **kwargs)

    setattr(target, method, counting)
    return calls


def _messages(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.levelname for r in caplog.records if r.name == "kvstatus.sglang" and text in r.getMessage()]


def test_redis_down_fails_the_rooms_not_the_engine(server: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    prefill, decode = _pair(server.url + "?retries=0")
    receiver = CommonKVReceiver(decode, ROOM)
    decode.update_status(ROOM, KVPoll.WaitingForInput)
    prefill.update_status(ROOM, KVPoll.Bootstrapping)
    sender = CommonKVSender(prefill, ROOM)
    assert sender.poll() == KVPoll.Bootstrapping
    caplog.set_level(logging.INFO, logger="kvstatus.sglang")
    server.stop()

    assert sender.poll() == KVPoll.Failed  # `in` then check_status: neither raises
    assert prefill.update_status(ROOM, KVPoll.Transferring).outcome.name == "REFUSED_CREATE"  # nothing known written
    assert prefill.update_status(ROOM + 1, KVPoll.Bootstrapping).status == KVPoll.Failed
    with pytest.raises(KVTransferError) as info:
        sender.failure_exception()  # its clear() pops the room: no exception either
    assert info.value.failure_reason.startswith(DOWN + "BackendRefusedError")
    assert not info.value.is_from_another_rank
    assert receiver.poll() == KVPoll.Failed
    with pytest.raises(KVTransferError) as info:
        receiver.failure_exception()
    assert info.value.failure_reason.startswith(DOWN)
    prefill.record_failure(ROOM, "late reason")  # upstream's record stays local; no exception
    assert prefill.failure_records.pop(ROOM) == "late reason"
    assert prefill.failure_records.pop(ROOM + 1).startswith(DOWN)  # the request that could not open its room
    assert prefill.failure_records == {}
    assert _messages(caplog, "Redis failed a status call") == ["ERROR", "ERROR"]  # one per manager, not per call

    server.start()  # the same port, no data
    # After the window a background probe tries Redis; the engine's calls answer without I/O until it answers.
    assert eventually(lambda: prefill.request_status.outage.error is None, what="the probe's answer")
    assert ROOM not in prefill.request_status
    prefill.update_status(ROOM, KVPoll.Bootstrapping)
    assert prefill.check_status(ROOM) == KVPoll.Bootstrapping
    assert eventually(lambda: decode.request_status.outage.error is None, what="the decode's probe")
    assert _messages(caplog, "Redis answers status calls again") == ["WARNING", "WARNING"]  # each manager's probe
    for manager in (prefill, decode):
        manager.request_status.close()


def test_a_hung_redis_costs_one_deadline_then_no_call(server: RedisServer) -> None:
    prefill, _ = _pair(server.url + "?retries=0&deadline=0.5")
    rooms = range(100, 150)
    for room in rooms:
        prefill.update_status(room, KVPoll.Bootstrapping)
    gets = _counted(prefill.request_status.store, "get")
    assert server.pid is not None
    os.kill(server.pid, signal.SIGSTOP)
    try:
        statuses = [prefill.check_status(room) for room in rooms]
    finally:
        os.kill(server.pid, signal.SIGCONT)
    assert statuses == [KVPoll.Failed] * len(rooms)
    assert len(gets) == 1  # the one that met the deadline; the outage answered the other 49 without I/O
    reasons = {prefill.failure_records.get(room, "")[: len(DOWN)] for room in rooms}
    assert reasons == {DOWN}
    assert eventually(lambda: prefill.request_status.outage.error is None, what="the probe's answer")
    # Redis answers again (a second get), but a room the engine was told had failed stays Failed until removed.
    assert prefill.check_status(rooms[0]) == KVPoll.Failed and len(gets) == 2
    assert prefill.request_status.pop(rooms[0]) == KVPoll.Bootstrapping  # the entry Redis kept, removed
    prefill.update_status(rooms[0], KVPoll.Bootstrapping)  # the room's next request
    assert prefill.check_status(rooms[0]) == KVPoll.Bootstrapping
    prefill.request_status.close()


def test_a_room_failed_during_an_outage_stays_failed_for_every_thread(server: RedisServer) -> None:
    """What the e2e tier hit: during an outage a transfer thread reads Failed and drops its part (here: the
    decode's Success); once Redis answers, the scheduler must not find the room open and wait out SGLang's 300 s
    timeout. Every read of the room, on any thread and by any method, answers Failed with the outage's reason
    until the room is removed; the rooms the outage did not touch read Redis, and the fast path comes back
    once the failed room is gone."""
    prefill, decode = _pair(server.url + "?retries=0&deadline=0.5")
    untouched = ROOM + 1
    receiver = CommonKVReceiver(decode, ROOM)  # the scheduler's side of the room
    for room in (ROOM, untouched):
        decode.update_status(room, KVPoll.WaitingForInput)
    statuses = decode.request_status
    assert server.pid is not None
    os.kill(server.pid, signal.SIGSTOP)
    try:
        seen: list[KVPoll] = []
        thread = threading.Thread(target=lambda: seen.append(statuses.get(ROOM)))  # a transfer thread
        thread.start()
        thread.join()
    finally:
        os.kill(server.pid, signal.SIGCONT)
    assert seen == [KVPoll.Failed]
    assert eventually(lambda: statuses.outage.error is None, what="the probe's answer")
    assert decode.update_status(ROOM, KVPoll.Transferring).outcome is Outcome.ADVANCED  # Redis answers again
    assert ROOM in statuses and statuses[ROOM] == KVPoll.Failed and statuses.get(ROOM) == KVPoll.Failed
    assert statuses._fresh is statuses._door  # the dict-speed path is on: it skips the room failed here
    assert receiver.poll() == KVPoll.Failed
    with pytest.raises(KVTransferError) as info:
        receiver.failure_exception()
    assert info.value.failure_reason.startswith(DOWN)  # the outage's reason, not "unknown"
    assert statuses[untouched] == KVPoll.WaitingForInput
    assert ROOM not in statuses  # the receiver's clear() removed it: the room's lifecycle is over
    assert statuses._fresh is statuses._door  # and the dict-speed path is on again
    decode.update_status(ROOM, KVPoll.Bootstrapping)  # a new request in the room reads Redis again
    assert statuses[ROOM] == KVPoll.Bootstrapping
    for manager in (prefill, decode):
        manager.request_status.close()


def test_the_pp_consensus_fails_with_the_cause(server: RedisServer) -> None:
    namespace = fresh_namespace("outage")
    ranks = [make_manager(pp_rank=rank, pp_size=2) for rank in range(2)]
    for manager in ranks:
        install(manager, server.url + "?retries=0", namespace=namespace)
        manager.update_status(ROOM, KVPoll.Bootstrapping)
    sender = CommonKVSender(ranks[0], ROOM)
    assert sender.poll_pp_consensus() == KVPoll.Bootstrapping
    server.stop()
    assert sender.poll_pp_consensus() == KVPoll.Failed
    with pytest.raises(KVTransferError) as info:
        sender.failure_exception()
    assert info.value.failure_reason.startswith(DOWN)
    for manager in ranks:
        manager.request_status.close()


def test_a_pp_rank_failed_during_an_outage_stays_failed_in_the_consensus(server: RedisServer) -> None:
    """The PP reads keep the outage's answer too: once Redis answers, ``collect`` and ``collect_many`` on rank 0
    still show its own entry Failed in the room it failed, the other rank's as Redis holds it."""
    namespace = fresh_namespace("outage")
    ranks = [make_manager(pp_rank=rank, pp_size=2) for rank in range(2)]
    for manager in ranks:
        install(manager, server.url + "?retries=0&deadline=0.5", namespace=namespace)
        manager.update_status(ROOM, KVPoll.Bootstrapping)
    statuses = ranks[0].request_status
    assert server.pid is not None
    os.kill(server.pid, signal.SIGSTOP)
    try:
        assert ranks[0].check_status_pp_consensus(ROOM) == KVPoll.Failed
    finally:
        os.kill(server.pid, signal.SIGCONT)
    assert eventually(lambda: statuses.outage.error is None, what="the probe's answer")
    assert statuses.collect(ROOM) == [KVPoll.Failed, KVPoll.Bootstrapping]
    assert statuses.collect_many([ROOM]) == {ROOM: [KVPoll.Failed, KVPoll.Bootstrapping]}
    consensus = statuses.consensus(ROOM)
    assert consensus.status == KVPoll.Failed and consensus.reason is not None and consensus.reason.startswith(DOWN)
    assert ranks[1].request_status.collect(ROOM) == [KVPoll.Bootstrapping, KVPoll.Bootstrapping]  # rank 1 was not told
    for manager in ranks:
        manager.request_status.close()


def test_a_frozen_server_ends_the_polls_served_from_memory_within_their_bounds(server: RedisServer) -> None:
    """SIGSTOP under a manager whose rooms are in its near cache (the default): polls are answered from memory
    only while the cache's links are proven live (``max_staleness``), then one read waits out the deadline and
    the outage fails the rooms; no call blocks past the deadline, and the manager recovers by itself."""
    prefill, _ = _pair(server.url + "?retries=0&deadline=1")  # a short deadline: a short test
    status_map = prefill.request_status
    near, deadline = status_map.store.near_cache, status_map.store.options.deadline
    rooms = range(200, 216)
    for room in rooms:
        prefill.update_status(room, KVPoll.Bootstrapping)
    assert [prefill.check_status(room) for room in rooms] == [KVPoll.Bootstrapping] * len(rooms)
    sends = _counted(status_map.store._sender, "send")
    assert server.pid is not None
    os.kill(server.pid, signal.SIGSTOP)
    frozen, slowest, first_failed = time.monotonic(), 0.0, None
    try:
        while first_failed is None or time.monotonic() - first_failed < OUTAGE_SECONDS / 2:
            started = time.monotonic()
            statuses = {prefill.check_status(room) for room in rooms}
            slowest = max(slowest, time.monotonic() - started)
            assert statuses <= {KVPoll.Bootstrapping, KVPoll.Failed}
            if first_failed is None and KVPoll.Failed in statuses:
                first_failed = time.monotonic()
                assert first_failed - frozen <= near.state.options.max_staleness + deadline + SLACK
            elif first_failed is not None:
                assert statuses == {KVPoll.Failed}  # the outage answers, without I/O
            assert time.monotonic() - frozen < 60, "the rooms never failed"
    finally:
        os.kill(server.pid, signal.SIGCONT)
    assert slowest <= deadline + SLACK
    assert len(sends) == 1  # the read that met the deadline; memory and then the outage answered the rest
    time.sleep(OUTAGE_SECONDS)
    assert prefill.check_status(rooms[0]) == KVPoll.Failed  # the engine was told so: it stays until removed
    for room in rooms:
        status_map.pop(room)
    prefill.update_status(rooms[0], KVPoll.Bootstrapping)  # the room's next request
    assert eventually(lambda: prefill.check_status(rooms[0]) == KVPoll.Bootstrapping, what="the recovery")
    status_map.close()


def test_a_defect_below_the_map_fails_the_room_not_the_engine(
    server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """What no store call should raise (the KeyError('') that once killed SGLang's transfer thread) fails the
    room with the error as its reason, is logged once per kind with its traceback, and never reaches the engine."""
    prefill, decode = _pair(server.url)
    decode.update_status(ROOM, KVPoll.WaitingForInput)
    prefill.update_status(ROOM, KVPoll.Bootstrapping)
    sender = CommonKVSender(prefill, ROOM)
    store = prefill.request_status.store

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise KeyError("")

    store.get = store.room = broken  # the map's reads, whichever path it takes
    caplog.set_level(logging.INFO, logger="kvstatus.sglang")
    assert sender.poll() == KVPoll.Failed and prefill.check_status(ROOM + 1) == KVPoll.Failed
    with pytest.raises(KVTransferError) as info:
        sender.failure_exception()
    assert info.value.failure_reason == "kvstatus: internal error (KeyError: ''); the room fails"
    logged = [r for r in caplog.records if "a defect (please report it)" in r.getMessage()]
    assert len(logged) == 1 and logged[0].levelname == "ERROR" and logged[0].exc_info is not None
    del store.get, store.room  # fixed: the next call reads again (a defect starts no outage)
    prefill.update_status(ROOM + 2, KVPoll.Bootstrapping)
    assert prefill.check_status(ROOM + 2) == KVPoll.Bootstrapping
    assert decode.check_status(ROOM) == KVPoll.WaitingForInput
    for manager in (prefill, decode):
        manager.request_status.close()


def test_a_hung_redis_holds_the_poll_thread_for_one_call_over_many_windows(server: RedisServer) -> None:
    """Issue 36 (Medium 9): a SIGSTOPped Redis, polled for several outage windows. Only the call that started the
    outage reaches Redis from the poll thread (one deadline); every window after it ends in a probe on another
    thread, never in a call on the poll thread that waits out the deadline again."""
    prefill, _ = _pair(server.url + "?retries=0&deadline=0.5")
    status_map = prefill.request_status
    rooms = range(300, 316)
    for room in rooms:
        prefill.update_status(room, KVPoll.Bootstrapping)
    poll_thread, on_poll_thread = threading.get_ident(), []
    sender = status_map.store._sender
    send = sender.send

    def counting(*args: Any, **kwargs: Any) -> Any:
        if threading.get_ident() == poll_thread:
            on_poll_thread.append(1)
        return send(*args, **kwargs)

    sender.send = counting
    deadline = status_map.store.options.deadline
    assert server.pid is not None
    os.kill(server.pid, signal.SIGSTOP)
    try:
        # Poll for four windows after the first failure (a loop bound, not an assert on time).
        failed_at = None
        while failed_at is None or time.monotonic() - failed_at < 4 * (OUTAGE_SECONDS + deadline):
            statuses = {prefill.check_status(room) for room in rooms}
            assert statuses <= {KVPoll.Bootstrapping, KVPoll.Failed}
            if failed_at is None and KVPoll.Failed in statuses:
                failed_at = time.monotonic()
            time.sleep(0.01)
    finally:
        os.kill(server.pid, signal.SIGCONT)
    assert len(on_poll_thread) == 1  # the call that met the deadline and started the outage
    assert status_map.outage.probes >= 2  # the windows after it were ended by probes, off the poll thread
    assert eventually(lambda: status_map.outage.error is None, what="the probe's answer")
    assert len(on_poll_thread) == 1
    status_map.close()
