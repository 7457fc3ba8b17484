"""``wait_for``'s driver: performs the actions of :func:`kvstatus.waitplan.wait_plan`.

Every step keeps a deadline (:func:`kvstatus.waitplan.step_deadline`): the watch's connect, handshake and
arm, and each read (sent through the store's send path), end by the store's deadline, and by the wait's own
end (a step always gets at least ``MIN_STEP_SECONDS``), so a wait against a hung server raises
:class:`~kvstatus.errors.BackendUnavailableError` about when its timeout ends instead of blocking for the
server's pause.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any, Optional

from redis import exceptions as rx

from kvstatus.concurrency import BROKEN, async_readable, async_run_blocking, async_sleep
from kvstatus.deadline import DEADLINE
from kvstatus.invalidation import LinkLost, sync_twin
from kvstatus.keywatch import KeyWatch, WatchRefused, pool_of
from kvstatus.rule import KVPoll
from kvstatus.topology import SlotMoved, Topology
from kvstatus.waitplan import (
    CLOCK,
    POLL_INTERVAL_SECONDS,
    READ,
    RECEIVE,
    RECHECK_SECONDS,
    WATCH,
    check_timeout,
    step_deadline,
    target_statuses,
    wait_plan,
)


class AsyncRoomWatch:
    """A :class:`~kvstatus.keywatch.KeyWatch` on the node of room ``key``, taken from the client's pool or
    opened, and armed, within deadlines; :meth:`close` gives a healthy one back to the pool.

    ``refused`` says why the server or the ACL refused to track (asked once: the wait then polls);
    ``error`` why the last attempt failed otherwise (a broken connection, a moved slot: asked again).
    """

    def __init__(self, client: Any, key: str) -> None:
        self.client = client
        self.key = key
        self.pool = pool_of(client)
        self.watch: Optional[KeyWatch] = None
        self.node = ""
        self.refused = ""
        self.error = ""

    async def ready(self, until: float) -> bool:
        """Watch the key: connect if needed, and arm unless armed, by monotonic ``until``; False if not now."""
        if self.refused:
            return False
        if self.watch is None:
            self.node = Topology(self.client).node_name(self.key)
            self.watch = self.pool.take(self.node)
            if self.watch is not None:
                self.watch.retarget(self.key)
                if await self._arm(until):
                    return True  # else the idle connection had died (a restart, a timeout): open a new one
        return False if self.refused else await self._arm(until)

    async def _arm(self, until: float) -> bool:
        try:
            watch = self.watch
            if watch is None:
                topology = Topology(self.client)
                self.node = topology.node_name(self.key)
                data = topology.new_data_connection(self.node)
                if topology.sentinel:  # its connections learn the master's address by connecting
                    await data.connect()
                    await data.disconnect()
                watch = KeyWatch(sync_twin(data), self.key)
                await async_run_blocking(watch.open, watch.close)  # cancelled: closed once the open ends
                self.watch = watch
            if not watch.armed:
                watch.arm()
                while watch.answers < watch.asked:
                    if not await async_readable(watch, until - time.monotonic()):
                        raise LinkLost("the server did not answer the watch in time")
                    watch.take()
            return True
        except (rx.ResponseError, WatchRefused) as exc:  # NOPERM on CLIENT TRACKING, HELLO 3 or EXISTS
            self.refused = str(exc)
        except (*BROKEN, LinkLost, SlotMoved) as exc:
            self.error = str(exc)
        except BaseException:
            self._discard()  # a cancel while an arm is unanswered: the connection cannot be given back
            raise
        self._discard()
        return False

    async def changed(self, seconds: float) -> Optional[bool]:
        """Whether the room changed within ``seconds`` (returns once it did); None if the watch broke."""
        watch = self.watch
        if watch is None:
            return None
        try:
            if not watch.changed and await async_readable(watch, seconds):
                watch.take()
            return watch.changed
        except LinkLost as exc:
            self.error = str(exc)
            self._discard()
            return None

    def _discard(self) -> None:
        watch, self.watch = self.watch, None
        if watch is not None:
            watch.close()

    def close(self) -> None:
        """End the wait: the connection goes back to the pool (or is closed, see :meth:`WatchPool.give`)."""
        watch, self.watch = self.watch, None
        if watch is not None:
            self.pool.give(self.node, watch)


async def async_wait_for(
    client: Any,
    key: str,
    participant: str,
    statuses: Any,
    timeout: Optional[float],
    read: Callable[[], Awaitable[Optional[KVPoll]]],
    deadline: float,
    recheck: float = RECHECK_SECONDS,
    poll_interval: float = POLL_INTERVAL_SECONDS,
) -> Optional[KVPoll]:
    """Wait until ``participant``'s entry in room ``key`` is one of ``statuses``; return it, or None after
    ``timeout`` seconds (None: no limit). ``read()`` returns the entry's status through the store's send
    path; ``deadline`` (seconds) bounds each step as it bounds a store call: a watch and the read that follows
    it share one, so against a hung server the wait raises about ``deadline`` seconds after a step began."""
    plan = wait_plan(participant, target_statuses(statuses), check_timeout(timeout), recheck, poll_interval)
    ends = time.monotonic() + check_timeout(timeout)
    watch = AsyncRoomWatch(client, key)
    reply: Any = None
    watched: Optional[float] = None  # the deadline of the watch a read follows: the two are one step
    try:
        while True:
            try:
                kind, argument = plan.send(reply)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            if kind == CLOCK:
                reply = time.monotonic()
            elif kind == WATCH:
                until = watched = step_deadline(ends, deadline)
                step = DEADLINE.set(until)
                try:
                    reply = await watch.ready(until)
                finally:
                    DEADLINE.reset(step)
            elif kind == READ:
                until = step_deadline(ends, deadline) if watched is None else watched
                watched = None
                step = DEADLINE.set(until)  # the send path keeps the earlier one
                try:
                    reply = await read()
                finally:
                    DEADLINE.reset(step)
            elif kind == RECEIVE:
                reply = await watch.changed(argument)
            else:
                await async_sleep(argument)
                reply = None
    finally:
        plan.close()
        watch.close()
