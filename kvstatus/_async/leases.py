"""The lease keeper: keeps a :class:`~kvstatus.leasestate.LeaseCore` alive in the background, renews it
before a write when it may have lapsed, and runs the store's peer watch (:mod:`kvstatus.peerwatch`).
Every renewal and every look goes through the store's send path (its deadline, errors and metrics)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any, Optional

from kvstatus._async.presence import AsyncPresence
from kvstatus.cachestate import writes_sent
from kvstatus.concurrency import AsyncBackground, AsyncLock
from kvstatus.consensus import LeaseState, entries_request, lost_reason
from kvstatus.errors import PermissionDeniedError
from kvstatus.leasestate import LeaseCore, log
from kvstatus.naming import is_decode
from kvstatus.peerwatch import (
    PeerWatch,
    WatchPlan,
    awaited_reason,
    died_reason,
    fail_entries_request,
    orphan_reason,
    restart_reason,
)
from kvstatus.rule import OPEN, KVPoll, Outcome, Stage


class AsyncLeaseKeeper:
    """Keeps ``core`` held; ``send`` is the store's send (the deadline, the observer and the error
    translation apply to every renewal); ``watch``, if given, is looked at every ``watch.interval`` s;
    ``presence``, if given, stands while the lease is held, and the peers' are counted with it."""

    def __init__(
        self,
        core: LeaseCore,
        send: Callable[..., Awaitable[Any]],
        watch: Optional[PeerWatch] = None,
        presence: Optional[AsyncPresence] = None,
    ) -> None:
        self.core = core
        self.watch = watch
        self.presence = presence
        self._send = send
        self._lock = AsyncLock()
        self._watch_lock = AsyncLock()  # one look at a time: the background's and look()'s
        self._background = AsyncBackground()
        self._watch_failing = False

    async def ensure(self) -> None:
        """Before a write: acquire or renew when due; raise :class:`~kvstatus.errors.LeaseLostError` if lost."""
        core = self.core
        if core.fresh():
            return
        async with self._lock:
            if not core.lost and not core.fresh():
                await self._call("renew" if core.acquired and not core.released else "acquire")
        if core.lost:
            raise core.lost_error()

    async def refresh(self) -> None:
        """Acquire the lease, or renew it now; raise :class:`~kvstatus.errors.LeaseLostError` if it is lost."""
        async with self._lock:
            if not self.core.lost:
                await self._call("renew" if self.core.held else "acquire")
        if self.core.lost:
            raise self.core.lost_error()

    async def reacquire(self) -> None:
        """After the lease was lost: hold the name again as a new incarnation (its peers' watches then fail the
        entries of the lost one in their older rooms). Nothing to do while the lease is held."""
        async with self._lock:
            if self.core.lost or self.core.released:
                await self._background.stop()
                self._background = AsyncBackground()
                await self._call("acquire")

    async def _call(self, op: str) -> None:
        sent_at = time.monotonic()
        request = self.core.request(op)
        if self.watch is not None and op != "renew":  # the peers' watches learn of an acquire or release at once
            assert self.core.incarnation is not None
            request.calls += self.watch.mark_calls(self.core.incarnation, 0, released=op == "release")
        reply = await self._send(request, "lease")
        self.core.settle(op, sent_at, reply)
        if self.presence is not None:
            if self.core.held and op == "acquire":
                await self.presence.start()
            elif not self.core.held:
                await self.presence.stop()
        if op == "acquire" and not self._background.started:
            self._background.start(self._run, f"kvstatus-lease-{self.core.participant}")

    def _next_delay(self) -> float:
        delay = self.core.next_delay()
        if self.watch is not None:
            delay = min(delay, self.watch.next_delay())
            if self.presence is not None:
                delay = min(delay, self.watch.next_count_delay())
        return delay

    async def _run(self) -> None:
        core = self.core
        while not await self._background.wait(self._next_delay()):
            if self.presence is not None:
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
            if self.watch is not None and self.presence is not None and self.watch.next_count_delay() <= 0:
                await self._look(self.watch, count=True)
            if self.watch is not None and self.watch.next_delay() <= 0:
                await self._look(self.watch)

    async def look(self) -> int:
        """Look at the peers' lease marks now (the background does it every ``watch.interval`` s); returns how
        many of their entries it failed. Raises what the store's send raises."""
        assert self.watch is not None
        return await self._look_once(self.watch)

    async def _look(self, watch: PeerWatch, count: bool = False) -> None:
        """:meth:`look` (``count``: a count of the presences, and a look only when it finds a death), in the
        background: an error is logged once (and its end), then tried again."""
        try:
            if count:
                await self._count(watch)
            else:
                await self._look_once(watch)
        except Exception as exc:  # noqa: BLE001 - the watch outlives Redis errors; it looks again next time
            if not self._watch_failing:
                log.warning(
                    "participant %s: the peer watch failed (it retries every %g s): %s",
                    watch.participant,
                    watch.interval,
                    exc,
                )
            self._watch_failing = True
            watch.postpone(self.core.interval)  # a hung server: the renewals come first
            return
        if self._watch_failing:
            log.warning("participant %s: the peer watch works again", watch.participant)
            self._watch_failing = False

    async def _count(self, watch: PeerWatch) -> int:
        """Count the presences; look at once when a peer's is gone for good. Returns how many entries failed."""
        presence = self.presence
        if presence is None or presence.refused is not None or not self.core.held:
            return 0
        try:
            counts = await self._send(watch.count_request(), "watch")
        except PermissionDeniedError as exc:
            await presence.refuse(str(exc))
            return 0
        if counts.get(watch.participant, 0) < 1:
            await presence.renew()  # the server the peers are counted on does not have it (a failover)
        dead = watch.judge(counts, presence.generation)
        return await self._look_once(watch, tuple(dead)) if dead else 0

    async def _look_once(self, watch: PeerWatch, dead: tuple[str, ...] = ()) -> int:
        incarnation = self.core.incarnation
        if incarnation is None or not self.core.held:
            return 0  # not held (not acquired yet, lost or released): no mark to write, no rooms watched
        async with self._watch_lock:
            plan = watch.plan(await self._send(watch.look_request(incarnation), "watch"), dead)
            try:
                return await self._act(watch, plan)
            except BaseException:
                watch.unfinished(plan)
                raise

    async def _act(self, watch: PeerWatch, plan: WatchPlan) -> int:
        """Carry out ``plan``; returns how many peers' entries were failed."""
        failed = 0
        for name, rooms in plan.suspects.items():
            if rooms:
                entries = await self._send(entries_request(watch.core, rooms, [name]), "watch")
                watch.confirmed(name, entries.leases[0])
                if entries.leases[0] is LeaseState.LOST:
                    failed += await self._fail_gone(watch, entries, name, lost_reason(name))
        for name, rooms in plan.dead.items():
            if rooms:
                entries = await self._send(entries_request(watch.core, rooms, [name]), "watch")
                failed += await self._fail_gone(watch, entries, name, died_reason(name))
        for name, rooms in plan.restarted.items():
            # The new incarnation's epoch fences its own entries off: it may have written these rooms already.
            below, address = await self._send(watch.identity_request(name), "watch")
            outcomes = await self._fail(watch, rooms, name, Stage.SUPERSEDED, restart_reason(name), below)
            failed += outcomes.count(Outcome.FAILED)
            # Rooms it never wrote, or (unless its previous incarnation released its lease) in which that incarnation
            # reached Success (REFUSED_TERMINAL): what it owed this side after that went with it, as for a loss above.
            owed = (
                (Outcome.IGNORED_MISSING,)
                if name in plan.orderly
                else (Outcome.IGNORED_MISSING, Outcome.REFUSED_TERMINAL)
            )
            absent = [room for room, outcome in zip(rooms, outcomes) if outcome in owed]
            failed += await self._fail_awaiting(watch, absent, name, address, Stage.SUPERSEDED)
        if plan.orphans:
            failed += await self._fail_orphans(watch, plan.orphans, plan.orphan_seconds)
        if plan.forget:
            await self._send(watch.forget_request(plan.forget), "watch")
        return failed

    async def _fail_orphans(self, watch: PeerWatch, rooms: list[int], seconds: float) -> int:
        """Fail this store's own entry, still Bootstrapping, in those of ``rooms`` that no decode joined within
        ``seconds`` (one read a room; :mod:`kvstatus.peerwatch` 7); returns how many were failed."""
        core, failed = watch.core, 0
        for room in rooms:
            view = await self._send(core.room(room), "watch")
            own = view.participants.get(watch.participant)
            if own is None or own.status is not KVPoll.Bootstrapping or any(map(is_decode, view.participants)):
                watch.joined(room)
                continue
            try:
                await self._send(core.record_failure(room, orphan_reason(room, seconds)), "watch")
                result = await self._send(core.update_status(room, KVPoll.Failed), "watch")
            finally:
                writes_sent(core.schema, [room])  # this process's reads of the room see the failure at once
            watch.wrote(room, result.status)
            failed += result.outcome is Outcome.FAILED
        if failed:
            log.warning(
                "participant %s: %d of its rooms failed: no decode joined them within %g s",
                watch.participant,
                failed,
                seconds,
            )
        return failed

    async def _fail_gone(self, watch: PeerWatch, entries: Any, name: str, reason: str) -> int:
        """Fail the open entries (in ``entries``, just read) of ``name``, which lost its lease or died; returns how
        many entries were failed."""
        open_rooms = [room for i, room in enumerate(entries.rooms) if entries.statuses(i)[0] in OPEN]
        below = entries.epochs[0] + 1 if entries.epochs[0] else None  # not a later incarnation's
        outcomes = await self._fail(watch, open_rooms, name, Stage.LEASE_LOST, reason, below)
        failed = outcomes.count(Outcome.FAILED)
        # Rooms that wait on the peer by address and that it never wrote, or (unless it released its
        # lease: an orderly exit first sends what it owes) in which it reached Success: what it owed this
        # side after that (SGLang's decode waits for the prefill's completion message) will not come.
        done = None if watch.released(name) else KVPoll.Success
        absent = [room for i, room in enumerate(entries.rooms) if entries.statuses(i)[0] in (None, done)]
        if watch.awaits_any(absent):
            address = watch.peer_address(name)
            if address is None:
                address = (await self._send(watch.identity_request(name), "watch"))[1]
            failed += await self._fail_awaiting(watch, absent, name, address, Stage.LEASE_LOST, reason)
        return failed

    async def _fail_awaiting(
        self,
        watch: PeerWatch,
        rooms: list[int],
        name: str,
        address: Optional[str],
        stage: Stage,
        cause: Optional[str] = None,
    ) -> int:
        """Fail this store's own open entries in those of ``rooms`` (where ``name`` has no entry) that wait on
        ``name`` at its ``address`` (None: it has none, nothing to do), naming ``cause`` (what happened to ``name``;
        None: the stage says); returns how many were failed."""
        awaiting = [] if address is None else watch.awaiting(rooms, address)
        if address is None or not awaiting:
            return 0
        reason = (
            awaited_reason(name, address, stage) if cause is None else f"{cause}; this room waits on it at {address}"
        )
        outcomes = await self._fail(watch, awaiting, watch.participant, stage, reason, None)
        for room, outcome in zip(awaiting, outcomes):
            if outcome is Outcome.FAILED:
                watch.closed(room)
        return outcomes.count(Outcome.FAILED)

    async def _fail(
        self, watch: PeerWatch, rooms: list[int], name: str, stage: Stage, reason: str, below: Optional[int]
    ) -> list[Outcome]:
        """Fail ``name``'s open entries in ``rooms`` (logged), but those stamped ``below`` or later (an incarnation
        epoch; None: no fence); returns the outcome in each room, in order."""
        if not rooms:
            return []
        try:
            request = fail_entries_request(watch.core, rooms, name, stage, reason, below)
            outcomes: list[Outcome] = await self._send(request, "watch")
        finally:
            writes_sent(watch.core.schema, rooms)  # this process's reads of those rooms see the failure at once
        failed = outcomes.count(Outcome.FAILED)
        if failed:
            log.warning(
                "participant %s: %s; failed %s's open entries in %d of this participant's rooms (stage %s)",
                watch.participant,
                reason,
                name,
                failed,
                stage.value,
            )
        return outcomes

    async def close(self) -> None:
        """Stop renewing and release the lease (best effort: an unreachable Redis lets it expire instead); the
        release's mark tells the peers' watches at once, then the presence goes."""
        await self._background.stop()
        async with self._lock:
            if self.core.held:
                try:
                    await self._call("release")
                except Exception as exc:  # noqa: BLE001
                    log.warning("participant %s: lease release failed (it will expire): %s", self.core.participant, exc)
        if self.presence is not None:
            await self.presence.stop()
