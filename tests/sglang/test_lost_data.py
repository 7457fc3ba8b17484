"""A Redis that forgets (issue 36, High 1): restarted without persistence with rooms in flight, the stand-in
managers never raise KeyError into the engine, both sides of a room read Failed naming the data loss, and no
side writes its entry into the lost room again (kvstatus.sglang.outage.OpenRooms)."""

from __future__ import annotations

import threading
from typing import Any, Optional

import pytest
import redis

from kvstatus import KVPoll, Outcome
from kvstatus.sglang import install
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
ROOM = 3636
LOST = "kvstatus: Redis lost its data: participant "


def _pair(url: str, lease_ttl: Optional[float]) -> tuple[Any, Any, str]:
    namespace = fresh_namespace("lost")
    prefill, decode = make_manager(mode=DisaggregationMode.PREFILL), make_manager(mode=DisaggregationMode.DECODE)
    OPENED.extend((prefill, decode))
    for manager in (prefill, decode):
        install(manager, url, namespace=namespace, lease_ttl=lease_ttl)  # None: no lease
    return prefill, decode, namespace


def _fields(server: RedisServer, namespace: str) -> dict[bytes, bytes]:
    raw = redis.Redis(host=server.host, port=server.port)
    try:
        return raw.hgetall(f"kvstatus:{namespace}:{{{ROOM}}}")  # type: ignore[return-value]
    finally:
        raw.close()


def _reason(manager: Any, end: Any) -> str:
    with pytest.raises(KVTransferError) as info:
        end.failure_exception()
    assert manager.failure_records == {}
    return str(info.value.failure_reason)


@pytest.mark.parametrize("lease_ttl", [None, 3.0], ids=["no-lease", "lease"])
def test_a_redis_restarted_empty_fails_both_sides_and_recreates_nothing(
    server: RedisServer, lease_ttl: Optional[float]
) -> None:
    prefill, decode, namespace = _pair(server.url, lease_ttl)
    receiver = CommonKVReceiver(decode, ROOM)  # the decode's Bootstrapping
    decode.update_status(ROOM, KVPoll.WaitingForInput)
    prefill.update_status(ROOM, KVPoll.Bootstrapping)
    prefill.update_status(ROOM, KVPoll.Transferring)
    sender = CommonKVSender(prefill, ROOM)
    assert sender.poll() == KVPoll.Transferring and receiver.poll() == KVPoll.WaitingForInput
    server.restart()  # the same port, no data

    def engine_step() -> bool:
        # What the engine's threads do next: poll both sides (the receiver calls check_status with no `in`: a
        # KeyError there stops SGLang's scheduler), the prefill's transfer ends, the decode writes again.
        polled = sender.poll(), receiver.poll()
        prefill.update_status(ROOM, KVPoll.Success)
        decode.update_status(ROOM, KVPoll.WaitingForInput)
        return polled == (KVPoll.Failed, KVPoll.Failed)

    assert eventually(engine_step, what="both sides read Failed")
    assert _fields(server, namespace) == {}  # nobody wrote an entry into the lost room
    assert decode.update_status(ROOM, KVPoll.WaitingForInput).status == KVPoll.Failed  # refused, without I/O
    assert prefill.request_status.get(ROOM) == KVPoll.Failed and ROOM in decode.request_status
    assert _fields(server, namespace) == {}
    sent, received = _reason(prefill, sender), _reason(decode, receiver)
    assert sent.startswith(LOST + "prefill-tp0-pp0's entry in room 3636 is gone"), sent
    assert received.startswith(LOST + "decode-tp0-pp0's entry in room 3636 is gone"), received
    # The engine removed the rooms: a new request on the same id opens it again.
    assert decode.update_status(ROOM, KVPoll.Bootstrapping).outcome is Outcome.CREATED
    assert decode.check_status(ROOM) == KVPoll.Bootstrapping
    for manager in (prefill, decode):
        manager.request_status.close()


def test_a_write_first_after_the_loss_does_not_recreate_the_entry(server: RedisServer) -> None:
    """The decode writes before anyone reads: its WaitingForInput finds no entry and would create one. The map
    removes what it created, the room reads Failed naming the loss, and its later writes are refused."""
    prefill, decode, namespace = _pair(server.url, None)
    receiver = CommonKVReceiver(decode, ROOM)
    prefill.update_status(ROOM, KVPoll.Bootstrapping)
    raw = redis.Redis(host=server.host, port=server.port)
    raw.flushall()  # what a restart without persistence leaves, with the connections kept
    raw.close()
    result = decode.update_status(ROOM, KVPoll.WaitingForInput)
    assert result.status == KVPoll.Failed and result.outcome is not Outcome.CREATED
    assert _fields(server, namespace) == {}
    assert receiver.poll() == KVPoll.Failed
    assert _reason(decode, receiver).startswith(LOST + "decode-tp0-pp0's entry in room 3636 is gone")
    # The prefill's Success finds no entry either: refused, and its poll answers Failed with the same cause.
    assert prefill.update_status(ROOM, KVPoll.Success).status == KVPoll.Failed
    sender = CommonKVSender(prefill, ROOM)
    assert sender.poll() == KVPoll.Failed
    assert _reason(prefill, sender).startswith(LOST + "prefill-tp0-pp0's entry")
    assert _fields(server, namespace) == {}
    for manager in (prefill, decode):
        manager.request_status.close()


def test_a_room_that_was_never_open_here_is_no_loss(server: RedisServer) -> None:
    """Only an open room can be lost: a late Failed after the engine's pop, and a read of a room this manager
    never wrote, answer as before (nothing written, no entry)."""
    prefill, _, namespace = _pair(server.url, None)
    prefill.update_status(ROOM, KVPoll.Bootstrapping)
    assert prefill.request_status.pop(ROOM) == KVPoll.Bootstrapping
    assert prefill.update_status(ROOM, KVPoll.Failed).outcome is Outcome.IGNORED_MISSING
    assert ROOM not in prefill.request_status and prefill.request_status.get(ROOM + 1) is None
    with pytest.raises(KeyError):
        prefill.request_status[ROOM + 1]  # the dict's own answer for a room that was never there
    assert prefill.failure_records == {}
    prefill.request_status.close()


class _HeldReply:
    """A stand-in for the map's store whose ``update_status`` to ``held`` waits for :attr:`release` once Redis
    has answered: the reply of one thread handled after another thread's, as the GIL may order them."""

    def __init__(self, store: Any, held: KVPoll) -> None:
        self._store, self.held = store, held
        self.answered, self.release = threading.Event(), threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def update_status(self, room: int, status: KVPoll) -> Any:
        result = self._store.update_status(room, status)
        if status == self.held:
            self.answered.set()
            assert self.release.wait(30)
        return result


def _hold(manager: Any, status: KVPoll) -> tuple[_HeldReply, threading.Thread]:
    """Start ``manager.update_status(ROOM, status)`` in a thread whose reply is held (:class:`_HeldReply`)."""
    held = _HeldReply(manager.request_status.store, status)
    manager.request_status.store = held
    thread = threading.Thread(target=manager.update_status, args=(ROOM, status))
    thread.start()
    assert held.answered.wait(30)
    return held, thread


def test_a_first_write_whose_reply_is_handled_after_another_threads_is_no_loss(server: RedisServer) -> None:
    """The e2e tier's false "Redis lost its data": the scheduler's Bootstrapping (CREATED in Redis) and the
    bootstrap thread's WaitingForInput, run by Redis in that order, their replies handled the other way round.
    The CREATED is the room's first write, not a loss: the entry stays, nothing fails."""
    prefill, _, namespace = _pair(server.url, None)
    held, thread = _hold(prefill, KVPoll.Bootstrapping)
    assert prefill.update_status(ROOM, KVPoll.WaitingForInput).status == KVPoll.WaitingForInput
    held.release.set()
    thread.join(30)
    assert prefill.failure_records == {}
    assert ROOM in prefill.request_status and prefill.check_status(ROOM) == KVPoll.WaitingForInput
    assert _fields(server, namespace)[b"prefill-tp0-pp0"] == b"2"
    prefill.request_status.close()


def test_a_write_sent_before_the_engine_removed_the_room_does_not_open_it_again(server: RedisServer) -> None:
    """A transfer thread's write answered after the scheduler's pop: the room is not open again, so the next
    lifecycle of the same room id (a retracted request) starts with no loss."""
    prefill, _, namespace = _pair(server.url, None)
    prefill.update_status(ROOM, KVPoll.Bootstrapping)
    held, thread = _hold(prefill, KVPoll.WaitingForInput)
    assert prefill.request_status.pop(ROOM) == KVPoll.WaitingForInput
    held.release.set()
    thread.join(30)
    assert prefill.update_status(ROOM, KVPoll.Bootstrapping).outcome is Outcome.CREATED
    assert prefill.failure_records == {} and prefill.check_status(ROOM) == KVPoll.Bootstrapping
    assert _fields(server, namespace)[b"prefill-tp0-pp0"] == b"1"
    prefill.request_status.close()
