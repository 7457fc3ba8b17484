"""The room-status store's public methods, on the one send path (:mod:`kvstatus._async.sender`), and ``wait_for``'s
driver (:func:`async_wait_for`); the sync :class:`StatusStore` is generated from this file by tools/unasync.py."""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from typing import Optional, TypeVar

from kvstatus._async.leases import AsyncLeaseKeeper, AsyncPresence
from kvstatus._async.nearcache import AsyncNearCache
from kvstatus._async.sender import AsyncSender
from kvstatus.backend import AsyncClient, can_track
from kvstatus.cachestate import NearCacheOptions
from kvstatus.concurrency import AsyncGate, AsyncSignal, async_checkpoint, async_sleep
from kvstatus.connection import connect_async
from kvstatus.deadline import DEADLINE, may_wait
from kvstatus.errors import BackendRefusedError, InvalidArgumentError, SupersededError
from kvstatus.keys import validate_name, validate_room
from kvstatus.model import CancelResult, FailureRecord, KVPoll, Outcome, RoomConsensus, RoomView, UpdateResult
from kvstatus.requests import Request
from kvstatus.rule import consensus_calls
from kvstatus.storebase import (
    CLOCK,
    POLL_INTERVAL_SECONDS,
    READ,
    RECEIVE,
    RECHECK_SECONDS,
    WATCH,
    StoreBase,
    check_timeout,
    step_deadline,
    target_statuses,
    wait_plan,
)

T = TypeVar("T")


class AsyncStatusStore(StoreBase):
    """Room statuses of one namespace, shared by every process that uses the same Redis.

    ``AsyncStatusStore(client, namespace=...)`` wraps an existing redis-py client (``Redis`` or ``RedisCluster``);
    :meth:`from_url` builds one. ``ttl`` is in seconds (:attr:`ttl`). Every method is one round trip (a read of an
    unchanged room none with ``near_cache`` on, see :mod:`kvstatus.cachestate`), and returns or raises within the
    connection's ``deadline`` (seconds); safe to share among the tasks (threads, for the sync store) of one process."""

    _connect = staticmethod(connect_async)
    _sender_class = AsyncSender
    _gate_class = AsyncGate
    _near_class = AsyncNearCache
    _keeper_class = AsyncLeaseKeeper
    _presence_class = AsyncPresence
    client: AsyncClient
    _sender: AsyncSender
    _near: Optional[AsyncNearCache]
    _keeper: Optional[AsyncLeaseKeeper]

    async def update_status(self, room: int, status: KVPoll | int) -> UpdateResult:
        """Apply the update rule to this participant's entry; returns the outcome and resulting status. A store with
        a lease raises :class:`~kvstatus.errors.SupersededError` when a later incarnation of its participant wrote
        the entry (nothing written; the store refuses writes from then on)."""
        result = await self._write(lambda: self._core.update_status(room, status), "update_status", (room,))
        if result.outcome is Outcome.REFUSED_SUPERSEDED:
            self._refused({room: result})
        self._opened({room: result})
        return result

    async def update_many(self, updates: Mapping[int, KVPoll | int]) -> dict[int, UpdateResult]:
        """Apply the rule to many rooms in one round trip (per node); returns each room's result. Atomic per chunk of
        rooms, not as a whole (docs/guide.md, "Batches and atomicity"). Rooms whose entry a later incarnation wrote
        raise :class:`~kvstatus.errors.SupersededError` after the batch, with every room's result in ``results``."""
        results = await self._write(lambda: self._core.update_many(updates), "update_many", updates)
        self._opened(results)
        if self._core.epoch is not None:
            self._refused(results)
        return results

    async def check_status(self, room: int) -> KVPoll:
        """This participant's status; raises ``KeyError(room)`` when there is no entry, like upstream."""
        if self._near is not None:
            return await self._near.check_status(room, self._reader)
        return await self._sender.send(self._core.check_status(room), "check_status")

    async def get(self, room: int) -> Optional[KVPoll]:
        """This participant's status, or None."""
        if self._near is not None:
            return await self._near.get(room, self._reader)
        return await self._sender.send(self._core.get(room), "get")

    async def get_many(self, rooms: Iterable[int]) -> dict[int, Optional[KVPoll]]:
        """This participant's status in each room, in one round trip (per node; read in chunks of
        :data:`~kvstatus.operations.CHUNK_ROOMS` rooms, each a consistent snapshot)."""
        if self._near is not None:
            return await self._near.get_many(rooms, self._reader)
        return await self._sender.send(self._core.get_many(rooms), "get_many")

    async def clear(self, room: int) -> bool:
        """Remove this participant's entry and failure reason, leaving a tombstone; True if anything was removed."""
        cleared = await self._write(lambda: self._core.clear(room), "clear", (room,))
        self._closed((room,))
        return cleared.removed

    async def pop(self, room: int) -> Optional[KVPoll]:
        """Remove this participant's entry (as :meth:`clear`) and return the status it held, or None, in one
        round trip (SGLang's ``request_status.pop(room)``)."""
        cleared = await self._write(lambda: self._core.pop(room), "pop", (room,))
        self._closed((room,))
        return cleared.status

    async def record_failure(self, room: int, reason: str) -> bool:
        """Record why this participant's entry failed; True if stored (first reason wins, needs an entry)."""
        return await self._write(lambda: self._core.record_failure(room, reason), "record_failure", (room,))

    async def room(self, room: int) -> RoomView:
        """Every participant's entry in ``room``, with reasons, the TTL left and the tombstone of recent clears
        (not with the near cache on: its views carry no tombstone and no timelines)."""
        if self._near is not None:
            return await self._near.room(room)
        return await self._sender.send(self._core.room(room), "room")

    async def failure(self, room: int) -> Optional[FailureRecord]:
        """The room's first failure (:mod:`kvstatus.rule`): when, at which stage, raised by whom, why; None if
        it has not failed. What a participant whose read answered Failed by shared fate reports as the cause."""
        if self._near is not None:
            return (await self._near.room(room)).failure
        return await self._sender.send(self._core.failure(room), "failure")

    async def cancel(self, room: int, reason: str, *, origin: Optional[str] = None) -> CancelResult:
        """Fail ``room`` for every participant, with ``reason`` (stage ``cancelled``, from ``origin``, default this
        store's participant); returns the outcome (``ALREADY_SERVED``: every entry Success, nothing written) and
        the entries failed. Rules: docs/guide.md ("One room, one fate"), :func:`kvstatus.rule.cancel_outcome`."""
        return (await self.cancel_many([room], reason, origin=origin))[validate_room(room)]

    async def cancel_many(
        self, rooms: Iterable[int], reason: str, *, origin: Optional[str] = None
    ) -> dict[int, CancelResult]:
        """:meth:`cancel` of many rooms in one round trip (per node; atomic per chunk, as :meth:`update_many`)."""
        if isinstance(rooms, Iterator):
            rooms = list(rooms)  # read twice: by the request, and by the near cache's drop afterwards
        request = self._core.cancel(rooms, reason, self.participant if origin is None else origin)
        results = await self._write(lambda: request, "cancel", rooms)
        self._closed(results)
        return results

    async def wait_for(
        self,
        room: int,
        statuses: KVPoll | int | Iterable[KVPoll | int],
        timeout: Optional[float],
        *,
        participant: Optional[str] = None,
    ) -> Optional[KVPoll]:
        """Wait until the entry of ``participant`` (default: this store's) in ``room`` has one of ``statuses``;
        return that status, or None when ``timeout`` seconds (None: no limit) pass first. Raises
        :class:`~kvstatus.errors.BackendUnavailableError` when a read meets a hung server: each ends by
        ``min(deadline, timeout)`` seconds, given at least 0.5 s. How it watches:
        docs/guide.md ("Waiting for a status: `wait_for`")."""
        who = self.participant if participant is None else validate_name(participant, "participant")
        room = validate_room(room)
        cache = self._near if self._near is not None else self._waits_cache()
        if cache is not None:
            read = functools.partial(cache.get, room, (who, self.shared_fate))
        else:
            read = functools.partial(self.uncached(who).get, room)
        return await async_wait_for(cache, room, statuses, timeout, read, self.options.deadline)

    def _waits_cache(self) -> Optional[AsyncNearCache]:
        """The near cache the waits of a store without its own watch on (one per backend, namespace and process), or
        None where Redis cannot track reads (fakeredis)."""
        if not can_track(self.client):
            return None

        def make() -> AsyncNearCache:  # its own sender: the store's observer sees no cache it did not turn on
            sender = AsyncSender(
                self.client,
                self.options,
                cluster=self._core.cluster,
                functions=False,
                metrics=None,
                gate=self.backend.gate(AsyncGate),
            )
            return AsyncNearCache(self.client, self.schema, NearCacheOptions(), sender)

        # Per process: a forked child must not read on its parent's links (one socket, two readers).
        name = f"wait cache {self.schema.base} pid {os.getpid()}"
        return self.backend.shared(name, AsyncNearCache, make, AsyncNearCache.shut)

    async def room_status(self, room: int, participants: Iterable[str]) -> RoomConsensus:
        """The room's consensus over ``participants`` (see :mod:`kvstatus.rule`), in one round trip."""
        return (await self._sender.send(consensus_calls(self._core, [room], participants), "room_status"))[room]

    async def room_statuses(self, rooms: Iterable[int], participants: Iterable[str]) -> dict[int, RoomConsensus]:
        """:meth:`room_status` of many rooms over the same participants, in one round trip."""
        return await self._sender.send(consensus_calls(self._core, rooms, participants), "room_statuses")

    async def acquire_lease(self, *, again: bool = False) -> None:
        """Acquire the lease now (else the first write does), or renew it now if held; LeaseLostError if lost.
        ``again``: once it is lost, hold the name as a new incarnation instead (peers then fail the lost
        incarnation's open entries in their rooms; see :mod:`kvstatus.peerwatch`)."""
        if self._keeper is None:
            raise InvalidArgumentError("this store has no lease: build it with lease_ttl=SECONDS")
        if again:
            await self._keeper.reacquire()
        await self._keeper.refresh()

    async def look_at_peers(self) -> int:
        """Look at the peers' leases now (else done every second in the background, :mod:`kvstatus.peerwatch`):
        fail the open entries of dead or restarted peers in this store's open rooms; returns how many it failed."""
        if self._keeper is None:
            raise InvalidArgumentError("this store has no lease, so no peer watch: build it with lease_ttl=SECONDS")
        return await self._keeper.look()

    async def live_holder(self) -> Optional[str]:
        """Another live process that holds this store's participant name: its ``host:pid`` (from its lease record)
        while its lease is alive and its presence subscribed; None when none does (a crashed holder's presence is
        gone, so a restart takes the name over). One round trip; needs a lease (``lease_ttl``)."""
        if self._keeper is None or self._watch is None:
            raise InvalidArgumentError("this store has no lease: build it with lease_ttl=SECONDS")
        request = self._keeper.core.holder_request(self._watch.channel, self._watch.numsub)
        return await self._sender.send(request, "lease")

    async def close(self) -> None:
        """Release the lease (if any), close the near cache's and the waits' connections, then the client."""
        if self._keeper is not None:
            await self._keeper.close()
        if self._near is not None:
            await self._near.close()
        self.backend.close()
        await self.client.aclose()

    async def __aenter__(self) -> AsyncStatusStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def _write(self, build: Callable[[], Request[T]], operation: str, rooms: Iterable[int]) -> T:
        """Send the write ``build()`` makes, renewing first a lease that may have lapsed (LeaseLostError once lost;
        built before that too, so bad arguments raise first); drop ``rooms`` from the near cache, whatever happened."""
        keeper = self._keeper
        if keeper is not None and not keeper.core.fresh():
            build()
            await keeper.ensure()
        try:
            return await self._sender.send(build(), operation)
        except SupersededError:
            self._lose_to_successor()
            raise
        finally:
            self._wrote(rooms)

    async def _send(self, request: Request[T], operation: str = "other") -> T:
        """Send ``request`` on this store's send path (for the admin tools: sweeps, listings)."""
        return await self._sender.send(request, operation)


async def async_wait_for(
    cache: Optional[AsyncNearCache],
    room: int,
    statuses: KVPoll | int | Iterable[KVPoll | int],
    timeout: Optional[float],
    read: Callable[[], Awaitable[Optional[KVPoll]]],
    deadline: float,
    recheck: float = RECHECK_SECONDS,
    poll_interval: float = POLL_INTERVAL_SECONDS,
) -> Optional[KVPoll]:
    """``wait_for``'s driver: performs :func:`kvstatus.storebase.wait_plan`'s actions, watching the validated ``room``
    on ``cache`` (None: poll every ``poll_interval`` seconds) and bounding each ``read()`` by ``deadline`` seconds
    (:func:`kvstatus.storebase.step_deadline`). Returns the status reached, or None after ``timeout`` seconds."""
    plan = wait_plan(target_statuses(statuses), check_timeout(timeout), recheck, poll_interval)
    ends = time.monotonic() + check_timeout(timeout)
    signal = AsyncSignal()
    wake = signal.set
    watching = False
    reply: object = None
    try:
        while True:
            async_checkpoint()  # a cancel that a step swallowed (see there) ends the wait here
            try:
                action = plan.send(reply)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            reply = None
            if action[0] == CLOCK:
                reply = time.monotonic()
            elif action[0] == WATCH:
                signal.clear()  # before the read: a change after it wakes the wait
                if not watching and cache is not None:
                    watching = cache.watch(room, wake)
                reply = watching and cache is not None and cache.tracking
            elif action[0] == READ:
                step = DEADLINE.set(step_deadline(ends, deadline))  # the send path keeps the earlier one
                try:
                    reply = await _read_through_restart(read, poll_interval)
                finally:
                    DEADLINE.reset(step)
            elif action[0] == RECEIVE:
                await signal.wait(action[1])
            else:
                await async_sleep(action[1])
    finally:
        plan.close()
        if watching and cache is not None:
            cache.unwatch(room, wake)


async def _read_through_restart(read: Callable[[], Awaitable[Optional[KVPoll]]], pause: float) -> Optional[KVPoll]:
    """``read()``, asked again every ``pause`` seconds while the server refuses the connection (a restart) until the
    step's deadline; then the refusal is raised."""
    while True:
        try:
            return await read()
        except BackendRefusedError:
            if not may_wait(pause):
                raise
        await async_sleep(pause)
