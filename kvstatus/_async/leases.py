"""The lease keeper: renews a :class:`~kvstatus.leasestate.LeaseCore` (in the background, and before a write when it
may have lapsed) and runs the peer watch, through the store's send path; and the holder's presence, a subscription
that Redis drops when the process dies (docs/design.md, "Who decides that a peer is dead"). Nothing is published."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Optional, Protocol, TypeVar

from redis import exceptions as rx

from kvstatus.concurrency import AsyncBackground, AsyncLock, AsyncRedisConnection, async_close_link, async_pending
from kvstatus.connection import Topology
from kvstatus.deadline import DEADLINE, enter_deadline
from kvstatus.errors import PermissionDeniedError
from kvstatus.leasestate import LeaseCore, act, log
from kvstatus.peerwatch import PeerWatch, WatchPlan
from kvstatus.requests import Request

if TYPE_CHECKING:
    from kvstatus.backend import AsyncClient

T = TypeVar("T")

RETRY_SECONDS = 0.2
"""Seconds between two tries to subscribe again while the server cannot be reached."""
SUBSCRIBE_SECONDS = 2.0
"""Seconds one subscribe may take at most (or the store's deadline, if shorter): the renewals wait behind it."""
_MESSAGES = (b"message", b"smessage", "message", "smessage")


class AsyncPresence:
    """The presence of one participant on ``channel``; ``deadline``: seconds a (re)subscribe may take. ``generation``
    counts the subscriptions that took (peers trust what they saw since the last); ``refused``: why the server or the
    ACL refused it (then peers judge this participant by its lease alone)."""

    def __init__(self, client: AsyncClient, channel: str, *, cluster: bool, deadline: float) -> None:
        self.topology = Topology(client)
        self.channel = channel
        self.command = "SSUBSCRIBE" if cluster else "SUBSCRIBE"
        self.deadline = deadline
        self.generation = 0
        self.refused: Optional[str] = None
        self._conn: Optional[AsyncRedisConnection] = None
        self._retry_at = -float("inf")
        self._stopped = True

    @property
    def subscribed(self) -> bool:
        """True while the subscription is believed to stand (the last :meth:`check` found it open)."""
        return self._conn is not None

    async def check(self) -> None:
        """Drain what arrived, without blocking; subscribe again if the connection is gone (at most every
        :data:`RETRY_SECONDS`). Never raises: a failure is retried at the next check."""
        if self.refused is not None or self._stopped:
            return
        conn = self._conn
        if conn is not None:
            try:
                while await async_pending(conn):
                    reply = await conn.read_response(push_request=True)
                    if not isinstance(reply, list) or not reply or reply[0] not in _MESSAGES:
                        raise rx.ConnectionError(f"the subscription ended ({reply!r})")  # e.g. sunsubscribe
                return
            except rx.TimeoutError:
                return  # nothing to read within a capped wait: the subscription stands (only a closed one is lost)
            except Exception:  # noqa: BLE001 - the connection failed or closed: subscribe again
                await self.drop()
        if time.monotonic() >= self._retry_at:
            await self._subscribe()

    async def renew(self) -> None:
        """The peers' server does not count this subscription (a failover moved the primary): subscribe again."""
        if self._conn is not None and time.monotonic() >= self._retry_at:
            await self.drop()
            await self._subscribe()

    async def _subscribe(self) -> None:
        self._retry_at = time.monotonic() + RETRY_SECONDS
        token = enter_deadline(min(self.deadline, SUBSCRIBE_SECONDS))
        conn: Optional[AsyncRedisConnection] = None
        reply: object = None
        try:
            conn = self.topology.new_data_connection(self.topology.node_name(self.channel))
            await conn.connect()
            await conn.send_command(self.command, self.channel)
            reply = await conn.read_response(push_request=True)  # a push on RESP3
        except rx.ResponseError as exc:  # NOPERM, an unknown command: this server or user has no presence
            await self.refuse(str(exc))
        except Exception as exc:  # noqa: BLE001 - unreachable or hung: tried again at a later check
            log.debug("presence on %s: subscribe failed: %s", self.channel, exc)
        finally:
            DEADLINE.reset(token)
        if isinstance(reply, list) and len(reply) == 3:
            self._conn = conn
            self.generation += 1
        elif conn is not None:
            async_close_link(conn)

    async def refuse(self, why: str) -> None:
        """The server or the ACL refuses presence (its subscribe, or the peers' count): none from now on."""
        self.refused = why
        await self.drop()
        log.warning(
            "presence on %s refused (%s): peers judge this participant by its lease alone, and it judges them so; "
            "grant the recipe's subscribe and pubsub commands and its presence channel to see a death within a second",
            self.channel,
            why,
        )

    async def drop(self) -> None:
        """Close the subscription (Redis forgets this presence at once)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            async_close_link(conn)

    async def start(self) -> None:
        """Subscribe now (an acquire: the holder is present from its first write on)."""
        self._stopped = False
        self._retry_at = -float("inf")
        await self.check()

    async def stop(self) -> None:
        """Unsubscribe until :meth:`start`: a released or lost lease has no presence."""
        self._stopped = True
        await self.drop()


class AsyncSend(Protocol):
    """The store's send (:meth:`kvstatus._async.sender.AsyncSender.send`): sends ``request`` as ``operation``."""

    async def __call__(self, request: Request[T], operation: str) -> T: ...


class AsyncLeaseKeeper:
    """Keeps ``core`` held through ``send``, the store's send (its deadline, observer and errors); ``watch`` is looked
    at every ``watch.interval`` s; ``presence`` stands while held and counts the peers'."""

    def __init__(self, core: LeaseCore, send: AsyncSend, watch: PeerWatch, presence: AsyncPresence) -> None:
        self.core = core
        self.watch = watch
        self.presence = presence
        self._send = send
        self._lock = AsyncLock()
        self._watch_lock = AsyncLock()  # one look at a time: the background's and look()'s
        self._background = AsyncBackground()
        self._watch_failing = False
        self._index_refused = False  # the peer watch's lease index could not be used at its last look (warned)

    async def ensure(self) -> None:
        """Before a write: acquire or renew when due; raise :class:`~kvstatus.errors.LeaseLostError` if lost."""
        await self.refresh(when_stale=True)

    async def refresh(self, when_stale: bool = False) -> None:
        """Acquire the lease, or renew it now (``when_stale``: only if not :meth:`LeaseCore.fresh`); raise
        :class:`~kvstatus.errors.LeaseLostError` if it is lost."""
        async with self._lock:
            if not self.core.lost and not (when_stale and self.core.fresh()):
                await self._call("renew" if self.core.held else "acquire")
        if self.core.lost:
            raise self.core.lost_error()

    async def reacquire(self) -> None:
        """After the lease was lost or released: hold the name again as a new incarnation (nothing to do if held)."""
        async with self._lock:
            if self.core.lost or self.core.released:
                await self._background.stop()
                self._background = AsyncBackground()
                await self._call("acquire")

    async def _call(self, op: str) -> None:
        sent_at = time.monotonic()
        request = self.core.request(op)
        if op != "renew":  # the peers' watches learn of an acquire or release at once
            assert self.core.incarnation is not None
            request.calls += self.watch.mark_calls(self.core.incarnation, 0, released=op == "release")
        reply = await self._send(request, "lease")
        self.core.settle(op, sent_at, reply)
        if self.core.held and op == "acquire":
            await self.presence.start()
        elif not self.core.held:
            await self.presence.stop()
        if op == "acquire" and not self._background.started:
            self._background.start(self._run, f"kvstatus-lease-{self.core.participant}")

    async def _run(self) -> None:
        core, watch = self.core, self.watch
        while not await self._background.wait(min(core.next_delay(), watch.next_delay(), watch.next_count_delay())):
            if not core.held:
                await self.presence.stop()
            await self.presence.check()
            if core.next_delay() <= 0:
                late = core.lateness()
                if late > core.interval:
                    log.warning(
                        "participant %s: lease renewal %.1f s late: this process stalled (SIGSTOP, a native call "
                        "holding the GIL, CPU starvation); its lease lapses after %g s without a renewal",
                        core.participant,
                        late,
                        core.ttl,
                    )
                try:
                    async with self._lock:
                        if core.lost or core.released:
                            return
                        await self._call("renew")
                except Exception as exc:  # noqa: BLE001 - the keeper outlives Redis errors; writes report them
                    log.warning("participant %s: lease renewal failed: %s", core.participant, exc)
                    core.postpone()
                if core.lost:
                    return
            if watch.next_count_delay() <= 0:
                await self._look(count=True)
            if watch.next_delay() <= 0:
                await self._look()

    async def look(self, dead: tuple[str, ...] = ()) -> int:
        """Look at the peers' lease marks now (the background does it every ``watch.interval`` s), failing the ``dead``
        peers' entries too; returns how many of their entries it failed. Raises what the store's send raises."""
        watch, incarnation = self.watch, self.core.incarnation
        if incarnation is None or not self.core.held:
            return 0  # not held (not acquired yet, lost or released): no mark to write, no rooms watched
        async with self._watch_lock:
            plan = watch.plan(await self._send(watch.look_request(incarnation), "watch"), dead)
            if (watch.index_refused is not None) != self._index_refused:  # warned once, and once when it ends
                self._index_refused = watch.index_refused is not None
                if watch.index_refused is not None:
                    log.warning(
                        "participant %s: %s; its peers are judged by their presence and their leases alone, and a "
                        "restart under a peer's name is not seen, until the key is removed",
                        watch.participant,
                        watch.index_refused,
                    )
                else:
                    log.warning("participant %s: the lease index %s works again", watch.participant, watch.key)
            try:
                return await self._act(plan)
            except BaseException:
                watch.unfinished(plan)
                raise

    async def _look(self, count: bool = False) -> None:
        """:meth:`look` (or with ``count``, :meth:`_count`) in the background: an error is logged once, then retried."""
        try:
            if count:
                await self._count()
            else:
                await self.look()
        except Exception as exc:  # noqa: BLE001 - the watch outlives Redis errors; it looks again next time
            if not self._watch_failing:
                log.warning(
                    "participant %s: the peer watch failed (it retries every %g s): %s",
                    self.watch.participant,
                    self.watch.interval,
                    exc,
                )
            self._watch_failing = True
            self.watch.postpone(self.core.interval)  # a hung server: the renewals come first
            return
        if self._watch_failing:
            log.warning("participant %s: the peer watch works again", self.watch.participant)
            self._watch_failing = False

    async def _count(self) -> int:
        """Count the presences; look at once when a peer's is gone for good. Returns how many entries failed."""
        watch, presence = self.watch, self.presence
        if presence.refused is not None or not self.core.held:
            return 0
        try:
            counts = await self._send(watch.count_request(), "watch")
        except PermissionDeniedError as exc:
            await presence.refuse(str(exc))
            return 0
        if counts.get(watch.participant, 0) < 1:
            await presence.renew()  # the server the peers are counted on does not have it (a failover)
        dead = watch.judge(counts, presence.generation)
        return await self.look(tuple(dead)) if dead else 0

    async def _act(self, plan: WatchPlan) -> int:
        """Send the steps of :func:`kvstatus.leasestate.act` for ``plan``; returns how many entries were failed."""
        steps = act(self.watch, plan)
        try:
            request = next(steps)
            while True:
                try:
                    reply = await self._send(request, "watch")
                except BaseException as exc:  # noqa: BLE001 - the steps' cleanup runs, then it is raised again
                    request = steps.throw(exc)
                else:
                    request = steps.send(reply)
        except StopIteration as stop:
            return int(stop.value)

    async def close(self) -> None:
        """Stop renewing, release the lease (best effort: else it expires; the mark tells the peers), unsubscribe."""
        await self._background.stop()
        async with self._lock:
            if self.core.held:
                try:
                    await self._call("release")
                except Exception as exc:  # noqa: BLE001
                    log.warning("participant %s: lease release failed (it will expire): %s", self.core.participant, exc)
        await self.presence.stop()
