"""``wait_for``'s driver: performs the actions of :func:`kvstatus.waits.wait_plan`, each step (the watch's
connect, handshake and arm; each read, on the store's send path) within :func:`kvstatus.waits.step_deadline`
(docs/guide.md, "Waiting for a status: `wait_for`")."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Optional

from redis import exceptions as rx

from kvstatus.backend import AsyncClient, WatchPool
from kvstatus.concurrency import (
    BROKEN,
    AsyncLock,
    AsyncSignal,
    async_checkpoint,
    async_run_blocking,
    async_sleep,
    async_start_reader,
)
from kvstatus.connection import SlotMoved, Topology
from kvstatus.deadline import DEADLINE
from kvstatus.invalidation import LinkLost, sync_twin
from kvstatus.model import KVPoll
from kvstatus.waits import (
    CLOCK,
    POLL_INTERVAL_SECONDS,
    READ,
    RECEIVE,
    RECHECK_SECONDS,
    WATCH,
    Ticket,
    WatchHub,
    WatchRefused,
    check_timeout,
    step_deadline,
    target_statuses,
    wait_plan,
)


class AsyncRoomWatch:
    """One wait's :class:`~kvstatus.waits.Ticket` for room ``key`` on its backend's hub of the key's node
    (opened by the first wait that needs it). ``refused``: why the server or the ACL refused to track (asked
    once: the wait then polls); ``error``: why the last attempt failed otherwise (asked again)."""

    def __init__(self, client: AsyncClient, pool: WatchPool, key: str) -> None:
        self.client = client
        self.key = key
        self.pool = pool
        self.hub: Optional[WatchHub] = None
        self.ticket: Optional[Ticket] = None
        self.signal = AsyncSignal()
        self.refused = ""
        self.error = ""

    async def ready(self, until: float) -> bool:
        """Watch the key: join the node's hub (opening it if needed) and arm unless armed, by monotonic
        ``until``; False if not now. A hub another wait opened that breaks under this arm (its connection was
        killed while idle, and the hub had not read the close yet) is replaced at once, once."""
        watched, again = await self._arm(until)
        if again:
            watched, _ = await self._arm(until)
        return watched

    async def _arm(self, until: float) -> tuple[bool, bool]:
        """One try of :meth:`ready`: whether the key is watched, and whether to try again at once (the hub was
        open before this try and broke under it, and ``until`` has not passed)."""
        if self.refused:
            return False, False
        reused = False
        try:
            ticket = self.ticket
            if ticket is None or self.hub is None or self.hub.broken:
                ticket, reused = await self._join(until)
            if not ticket.armed:
                assert self.hub is not None
                self.hub.arm(ticket)
                if not await self._until(lambda: ticket.answered, until - time.monotonic()):
                    raise LinkLost("the server did not answer the watch in time")
                if ticket.error:
                    raise (WatchRefused if ticket.refused else LinkLost)(ticket.error)
            return True, False
        except (rx.ResponseError, WatchRefused) as exc:  # NOPERM on CLIENT TRACKING, HELLO 3 or EXISTS
            self.refused = str(exc)
        except (*BROKEN, LinkLost, SlotMoved) as exc:
            self.error = str(exc)
            reused = reused and self.hub is not None and bool(self.hub.broken) and time.monotonic() < until
        self.close()
        return False, reused

    async def _join(self, until: float) -> tuple[Ticket, bool]:
        """The ticket of the key on the node's hub, and whether the hub was open before this call."""
        self.close()
        node = Topology(self.client).node_name(self.key)
        hub = self.pool.hub(node)
        reused = hub is not None
        if hub is None:
            async with self.pool.opening(AsyncLock):  # one connection per node, whatever the number of waits
                hub = self.pool.hub(node)
                reused = hub is not None
                if hub is None:
                    hub = await self._open(node)
        if hub.broken:
            raise LinkLost(hub.broken)
        self.hub = hub
        self.ticket = hub.join(self.key, self.signal.set)
        return self.ticket, reused

    async def _open(self, node: str) -> WatchHub:
        topology = Topology(self.client)
        data = topology.new_data_connection(node)
        if topology.sentinel:  # its connections learn the master's address by connecting
            await data.connect()
            await data.disconnect()
        hub = WatchHub(sync_twin(data))
        await async_run_blocking(hub.open, hub.close)  # cancelled: closed once the open ends
        async_start_reader(hub)
        if not self.pool.add(node, hub):
            hub.close()
            raise LinkLost("the store is closed")
        return hub

    async def _until(self, done: Callable[[], bool], seconds: float) -> bool:
        """Sleep until ``done()`` or the hub broke, for up to ``seconds``; whether ``done()``."""
        ends = time.monotonic() + seconds
        while True:
            self.signal.clear()
            if done():
                return True
            hub = self.hub
            if hub is None or hub.broken:
                raise LinkLost(hub.broken if hub is not None else "the watch was closed")
            left = ends - time.monotonic()
            if left <= 0:
                return False
            await self.signal.wait(left)

    async def changed(self, seconds: float) -> Optional[bool]:
        """Whether the room changed within ``seconds`` (returns once it did); None if the watch broke."""
        ticket = self.ticket
        if ticket is None:
            return None
        try:
            return await self._until(lambda: ticket.changed, seconds)
        except LinkLost as exc:
            self.error = str(exc)
            self.close()
            return None

    def close(self) -> None:
        """Leave the hub (its connection stays, for the client's other waits)."""
        hub, ticket, self.hub, self.ticket = self.hub, self.ticket, None, None
        if hub is not None and ticket is not None:
            hub.leave(ticket)


async def async_wait_for(
    client: AsyncClient,
    pool: WatchPool,
    key: str,
    participant: str,
    statuses: KVPoll | int | Iterable[KVPoll | int],
    timeout: Optional[float],
    read: Callable[[], Awaitable[Optional[KVPoll]]],
    deadline: float,
    recheck: float = RECHECK_SECONDS,
    poll_interval: float = POLL_INTERVAL_SECONDS,
) -> Optional[KVPoll]:
    """Wait until ``participant``'s entry in room ``key`` is one of ``statuses``; return it, or None after
    ``timeout`` seconds (None: no limit). ``read()`` reads the entry on the store's send path; ``deadline``
    (seconds) bounds each step, a watch and the read that follows it sharing one."""
    plan = wait_plan(participant, target_statuses(statuses), check_timeout(timeout), recheck, poll_interval)
    ends = time.monotonic() + check_timeout(timeout)
    watch = AsyncRoomWatch(client, pool, key)
    reply: object = None
    watched: Optional[float] = None  # the deadline of the watch a read follows: the two are one step
    try:
        while True:
            async_checkpoint()  # a cancel that a step swallowed (see there) ends the wait here
            try:
                action = plan.send(reply)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            if action[0] == CLOCK:
                reply = time.monotonic()
            elif action[0] == WATCH:
                until = watched = step_deadline(ends, deadline)
                step = DEADLINE.set(until)
                try:
                    reply = await watch.ready(until)
                finally:
                    DEADLINE.reset(step)
            elif action[0] == READ:
                until = step_deadline(ends, deadline) if watched is None else watched
                watched = None
                step = DEADLINE.set(until)  # the send path keeps the earlier one
                try:
                    reply = await read()
                finally:
                    DEADLINE.reset(step)
            elif action[0] == RECEIVE:
                reply = await watch.changed(action[1])
            else:
                await async_sleep(action[1])
                reply = None
    finally:
        plan.close()
        watch.close()
