"""StatusStore: the room-status store on a blocking redis-py client."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any, Optional, TypeVar

from kvstatus.connection import connect
from kvstatus.consensus import RoomConsensus, consensus_calls
from kvstatus.deadline import DEADLINE, time_left
from kvstatus.errors import BackendUnavailableError, InvalidArgumentError
from kvstatus.keys import validate_name, validate_room
from kvstatus.leases import LeaseKeeper
from kvstatus.operations import as_functions
from kvstatus.requests import Call, Request
from kvstatus.rule import KVPoll, RoomView, UpdateResult
from kvstatus.storebase import (
    StoreBase,
    checked,
    may_resend,
    merge,
    noscript_resend,
    observe_error,
    observe_result,
    pool_exhausted,
    scripts_of,
)
from kvstatus.translate import REDIS_ERRORS
from kvstatus.waiting import wait_for

T = TypeVar("T")


class StatusStore(StoreBase):
    """Room statuses of one namespace, shared by every process that uses the same Redis.

    ``StatusStore(client, namespace=...)`` wraps an existing redis-py client
    (``Redis`` or ``RedisCluster``); :meth:`from_url` builds one. ``ttl`` is in
    seconds: every write leaves the room key at least that TTL, never
    shortening a longer one another writer left (one TTL per room key). Every
    method is one round trip (a read of an unchanged room none with ``near_cache``
    on, see :mod:`kvstatus.nearcache`), and returns or raises within the
    connection's ``deadline`` (seconds); safe to share between threads.
    """

    _connect = staticmethod(connect)
    _asynchronous = False
    _keeper_class = LeaseKeeper

    def update_status(self, room: int, status: KVPoll | int) -> UpdateResult:
        """Apply the update rule to this participant's entry; returns the outcome and resulting status."""
        return self._write(self._core.update_status(room, status), "update_status", (room,))

    def update_many(self, updates: Mapping[int, KVPoll | int]) -> dict[int, UpdateResult]:
        """Apply the rule to many rooms in one round trip (per node).

        Atomic per chunk of :data:`~kvstatus.operations.CHUNK_ROOMS` rooms (on a cluster: per slot within a
        chunk), not as a whole: other clients' commands run between chunks, and an error in one chunk leaves
        the others applied.
        """
        return self._write(self._core.update_many(updates), "update_many", updates)

    def check_status(self, room: int) -> KVPoll:
        """This participant's status; raises ``KeyError(room)`` when there is no entry, like upstream."""
        if self._near is not None:
            return self._near.check_status(room, self.participant)
        return self._send(self._core.check_status(room), "check_status")

    def get(self, room: int) -> Optional[KVPoll]:
        """This participant's status, or None."""
        if self._near is not None:
            return self._near.get(room, self.participant)
        return self._send(self._core.get(room), "get")

    def get_many(self, rooms: Iterable[int]) -> dict[int, Optional[KVPoll]]:
        """This participant's status in each room, in one round trip (per node; read in chunks of
        :data:`~kvstatus.operations.CHUNK_ROOMS` rooms, each a consistent snapshot)."""
        if self._near is not None:
            return self._near.get_many(rooms, self.participant)
        return self._send(self._core.get_many(rooms), "get_many")

    def clear(self, room: int) -> bool:
        """Remove this participant's entry and failure reason, leaving a tombstone; True if anything was removed."""
        return self._write(self._core.clear(room), "clear", (room,))

    def record_failure(self, room: int, reason: str) -> bool:
        """Record why this participant's entry failed; True if stored (first reason wins, needs an entry)."""
        return self._write(self._core.record_failure(room, reason), "record_failure", (room,))

    def room(self, room: int) -> RoomView:
        """Every participant's entry in ``room``, with reasons, the TTL left and the tombstone of recent clears
        (not with the near cache on: its views carry no tombstone)."""
        if self._near is not None:
            return self._near.room(room)
        return self._send(self._core.room(room), "room")

    def wait_for(self, room: int, statuses: KVPoll | int | Iterable[KVPoll | int], timeout: Optional[float],
                 *, participant: Optional[str] = None) -> Optional[KVPoll]:
        """Block until the entry of ``participant`` (default: this store's) in ``room`` has one of ``statuses``;
        return that status, or None when ``timeout`` seconds (None: no limit) pass first. Woken by Redis Pub/Sub
        (see :mod:`kvstatus.waiting`), re-reading every second and polling if the subscription breaks."""
        who = self.participant if participant is None else validate_name(participant, "participant")
        key = self._core.schema.room_key(validate_room(room))
        reader = self._uncached(who)
        return wait_for(self.client, key, who, statuses, timeout, read=lambda: reader.get(room))

    def room_status(self, room: int, participants: Iterable[str]) -> RoomConsensus:
        """The room's consensus over ``participants`` (see :mod:`kvstatus.consensus`), in one round trip."""
        return self._send(consensus_calls(self._core, [room], participants))[room]

    def room_statuses(self, rooms: Iterable[int], participants: Iterable[str]) -> dict[int, RoomConsensus]:
        """:meth:`room_status` of many rooms over the same participants, in one round trip."""
        return self._send(consensus_calls(self._core, rooms, participants))

    def acquire_lease(self) -> None:
        """Acquire the lease now (else the first write does), or renew it now if held; LeaseLostError if lost."""
        if self._keeper is None:
            raise InvalidArgumentError("this store has no lease: build it with lease_ttl=SECONDS")
        self._keeper.refresh()

    def close(self) -> None:
        """Release the lease (if any), close the near cache's connections (if any), then the client."""
        if self._keeper is not None:
            self._keeper.close()
        if self._near is not None:
            self._near.close()
        self.client.close()

    def __enter__(self) -> "StatusStore":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _write(self, request: Request[T], operation: str, rooms: Any) -> T:
        """Send a write: renew the lease first if it may have lapsed (LeaseLostError once it is lost), and drop
        ``rooms`` from the near cache afterwards, whatever happened (read-your-writes)."""
        if self._keeper is not None:
            self._keeper.ensure()
        try:
            return self._send(request, operation)
        finally:
            self._wrote(rooms)

    # The send loop; aio.py has the same lines with awaits. Decisions live in storebase.py.

    def _send(self, request: Request[T], operation: str = "other") -> T:
        """Send ``request`` (from the method ``operation``) and decode its replies; the observer, if any, is told."""
        if self._metrics is not None:
            return self._observed(request, operation)
        return self._deliver(request)

    def _observed(self, request: Request[T], operation: str) -> T:
        metrics = self._metrics
        assert metrics is not None
        started = time.perf_counter()
        try:
            result = self._deliver(request)
        except Exception as exc:
            observe_error(metrics, exc)
            raise
        finally:
            metrics.on_call(operation, time.perf_counter() - started)
        observe_result(metrics, operation, result)
        return result

    def _deliver(self, request: Request[T]) -> T:
        if self._functions:  # scripts="functions": every script call goes out as FCALL / FCALL_RO
            request = as_functions(request)
        token = DEADLINE.set(time.monotonic() + self._deadline + request.extra_seconds)
        try:
            if self._gate is None:
                return self._send_now(request)
            gate, limit = self._gate
            if not gate.acquire(timeout=max(0.0, time_left() or 0.0)):
                raise pool_exhausted(limit, self._deadline + request.extra_seconds)
            try:
                return self._send_now(request)
            finally:
                gate.release()
        finally:
            DEADLINE.reset(token)

    def _send_now(self, request: Request[T]) -> T:
        calls = request.calls
        if len(calls) == 1:  # the fast path: one command, straight to redis-py
            try:
                reply = self.client.execute_command(*calls[0].args)
            except Exception as exc:  # NOSCRIPT, a failover, an error: the full path, from this reply on
                return request.decode(self._replies(calls, [exc]))
            return request.decode([reply])
        return request.decode(self._replies(calls, None) if calls else [])

    def _replies(self, calls: list[Call], first: Optional[list[Any]]) -> list[Any]:
        for delay in self._failover_delays:
            try:
                return self._round_trip(calls, first)
            except BackendUnavailableError:
                if not may_resend(delay):
                    raise
                first = None
                time.sleep(delay)
                self._refresh_slots()
                self._resent()
        return self._round_trip(calls, first)

    def _round_trip(self, calls: list[Call], replies: Optional[list[Any]]) -> list[Any]:
        replies = self._io(calls) if replies is None else replies
        for as_eval in (False, True):
            indices, resend = noscript_resend(calls, replies, as_eval)
            if indices:
                for script in () if as_eval else scripts_of(resend):
                    self._load(script.source)
                self._resent()
                merge(replies, indices, self._io(resend))
        return checked(calls, replies)

    def _io(self, calls: list[Call]) -> list[Any]:
        """The replies of ``calls`` in one round trip, redis-py errors in place."""
        try:
            if len(calls) == 1:
                return [self.client.execute_command(*calls[0].args)]
            route = self._core.cluster
            with self.client.pipeline(transaction=False) as pipe:
                for call in calls:
                    if route and call.script is not None:
                        # redis-py's sync cluster pipeline would ask a node COMMAND GETKEYS for every script call.
                        pipe.execute_command(*call.args, target_nodes=self.client.get_node_from_key(call.args[3]))
                    else:
                        pipe.execute_command(*call.args)
                return pipe.execute(raise_on_error=False)
        except REDIS_ERRORS as exc:
            return [exc] * len(calls)

    def _load(self, source: str) -> None:
        try:
            self.client.script_load(source)
        except REDIS_ERRORS:
            pass  # the resend reports the failure, or runs the script by its source

    def _refresh_slots(self) -> None:
        if self._core.cluster:
            try:
                self.client.nodes_manager.initialize()
            except REDIS_ERRORS:
                pass  # the resend reports the failure if the cluster is still down
