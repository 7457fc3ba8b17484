"""Participant leases (:class:`LeaseCore`) and the peer watch's acts (:func:`act`), without I/O: the lease keeper
(:mod:`kvstatus._async.leases`) sends what they plan. When a lease is alive, lost or renewed before a write:
docs/guide.md, "Leases, the consensus view, sweeping and tombstones"."""

from __future__ import annotations

import logging
import math
import os
import secrets
import socket
import time
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any, Optional

from kvstatus import scripts
from kvstatus.errors import BackendError, LeaseLostError
from kvstatus.keys import KeySchema, incarnation_field, is_decode, reason_field, validate_address, validate_lease_ttl
from kvstatus.model import OPEN, KVPoll, LeaseOutcome, LeaseState, Outcome, Stage
from kvstatus.replies import stored_int, subscriber_counts, text
from kvstatus.requests import Call, Request, script_call
from kvstatus.rule import Entries, entries_request, lost_reason

if TYPE_CHECKING:  # the watch is handed in; importing it would stack this module on top of it
    from kvstatus.operations import StoreCore
    from kvstatus.peerwatch import PeerWatch, WatchPlan

log = logging.getLogger("kvstatus.leases")

RENEWALS_PER_TTL = 3
HOLDER_FIELD = "holder"
"""The lease record's field naming the holding process (``host:pid``; lua/lease.lua writes it at the acquire)."""
STALE_SHARE = 2 / 3
"""Share of the TTL after the last renewal was sent from which a write renews first, synchronously."""

HELD, LOST, RELEASED = LeaseOutcome.HELD.value, LeaseOutcome.LOST.value, LeaseOutcome.RELEASED.value


def this_process() -> str:
    """``host:pid`` of this process, as a lease record's holder names it."""
    host = "".join(ch for ch in socket.gethostname() if ch.isprintable() and not ch.isspace())[:200]
    return f"{host or 'localhost'}:{os.getpid()}"


class LeaseCore:
    """A store's lease, without I/O: the requests to send and what their replies mean. The record outlives the lease
    by ``keep_ms`` (the room TTL), so readers see a dead participant as lost as long as its entries can exist.
    ``ttl``: seconds; ``incarnation``: the current holder's random token (None before the first acquire);
    ``generation``: how many incarnations the name has had, this one included; ``epoch``: the incarnation's fence, Unix
    ms at its acquire by Redis' clock, above every earlier incarnation's (the store stamps its entries with it);
    ``lost``: True once Redis answered LOST or a write was refused as superseded; ``address``: ``host:port`` by which
    peers reach the holder, or None (written at each acquire)."""

    def __init__(
        self, schema: KeySchema, participant: str, ttl: float, keep_ms: int, address: Optional[str] = None
    ) -> None:
        self.participant = participant
        self.address = None if address is None else validate_address(address)
        self.ttl = validate_lease_ttl(ttl)
        self.key = schema.lease_key(participant)
        self._ttl_ms = str(round(self.ttl * 1000))
        self._keep_ms = str(max(keep_ms, round(self.ttl * 1000)))
        self.incarnation: Optional[str] = None
        self.generation: Optional[int] = None
        self.epoch: Optional[int] = None  # the incarnation's fence (lua/lease.lua): its writes are stamped with it
        self.on_epoch: Optional[Callable[[Optional[int]], None]] = None  # told each new epoch (the store's fence)
        self.acquired = False  # the current incarnation's acquire was answered HELD
        self.lost = self.released = self.taken_over = self.record_gone = False
        self._lost_generation: Optional[int] = 0  # the record's generation when it was lost; None: not read
        self._renewed_at = -math.inf  # monotonic time the last successful acquire/renew was *sent*
        self._retry_at = -math.inf  # after a failed renewal: monotonic time of the next try
        self._stale_after = self.ttl * STALE_SHARE
        self.interval = self.ttl / RENEWALS_PER_TTL
        self.renewals = 0

    @property
    def held(self) -> bool:
        """True while this store holds the lease as far as it knows (acquired, not lost, not released)."""
        return self.acquired and not self.lost and not self.released

    def fresh(self) -> bool:
        """True when a write may go ahead without renewing first (the write path's check, no I/O)."""
        return time.monotonic() < self._renewed_at + self._stale_after and not self.lost

    def request(self, op: str) -> Request[tuple[int, int, int]]:
        """The request of ``op`` ("acquire", "renew" or "release"); decodes to (code, generation, epoch)."""
        acquire: tuple[str, ...] = ()
        if op == "acquire":
            self.incarnation = secrets.token_hex(8)
            self.acquired = self.lost = self.released = self.taken_over = self.record_gone = False
            acquire = (self.address or "", this_process())
        assert self.incarnation is not None
        call = script_call(scripts.LEASE, [self.key], (op, self.incarnation, self._ttl_ms, self._keep_ms, *acquire))

        def decode(replies: list[Any]) -> tuple[int, int, int]:
            reply = replies[0]
            if not isinstance(reply, list) or len(reply) != 3 or reply[0] not in (HELD, LOST, RELEASED):
                raise BackendError(f"the lease script replied {reply!r}, expected [code 10..12, generation, epoch]")
            return int(reply[0]), int(reply[1]), int(reply[2])

        # Only the script's error fails the lease: a tenant's string at the index fails only the mark (issue 36).
        return Request([call], decode, strict=1)

    def holder_request(self, channel: str, numsub: str) -> Request[Optional[str]]:
        """Who else holds this participant's name alive: its record's ``holder`` (or "a process that did not say
        which") while Redis' clock says the lease is alive and a presence is subscribed on ``channel`` (counted with
        ``PUBSUB <numsub>``); None when nobody does (free, lost, released, or a crashed holder's presence is gone)."""
        calls = [
            Call(("HMGET", self.key, "state", "deadline", HOLDER_FIELD)),
            Call(("TIME",)),
            Call(("PUBSUB", numsub, channel), route=channel),
        ]

        def decode(replies: list[Any]) -> Optional[str]:
            (state, deadline, holder), (seconds, micros), counts = replies
            now_ms = int(seconds) * 1000 + int(micros) // 1000
            alive = text(state or b"") == "held" and (stored_int(deadline) or 0) >= now_ms
            if not alive or subscriber_counts(counts).get(channel, 0) < 1:
                return None
            return text(holder)[:300] if holder else "a process that did not say which"

        return Request(calls, decode)

    def settle(self, op: str, sent_at: float, reply: tuple[int, int, int]) -> None:
        """Take in the reply of ``op`` sent at monotonic time ``sent_at``."""
        code, generation, epoch = reply
        if code == HELD:
            self.acquired = True
            self._renewed_at = sent_at
            self.generation = generation
            self.renewals += op == "renew"
            if op == "acquire":
                self.epoch = epoch
                if self.on_epoch is not None:
                    self.on_epoch(epoch)
        elif code == RELEASED:
            self.released = True
        elif not self.lost:
            self.lost = True
            self.record_gone = generation == 0  # the script reads a missing hash as generation 0
            self._lost_generation = generation
            # Another incarnation's record: a later generation, or the same under another epoch (the record was lost
            # and other acquires counted back up to this one's).
            self.taken_over = (
                self.generation is not None and generation != 0 and (generation, epoch) != (self.generation, self.epoch)
            )
            log.warning("participant %s: lease lost (%s)", self.participant, self._why())

    def superseded(self) -> None:
        """A write found an entry stamped by a later incarnation: the name was taken over, the lease is lost."""
        if not self.lost:
            self.lost = self.taken_over = True
            self._lost_generation = None  # the record was not read: nothing says the server lost it
            log.warning("participant %s: lease lost (%s)", self.participant, self._why())

    def next_delay(self) -> float:
        """Seconds until the next background renewal is due."""
        return max(max(self._renewed_at + self.interval, self._retry_at) - time.monotonic(), 0.0)

    def lateness(self) -> float:
        """Seconds by which the background renewal due now is late (0.0 when on time or not due); more than an
        interval late: this process stalled (SIGSTOP, a native call holding the GIL, CPU starvation)."""
        if self._renewed_at == -math.inf or self._retry_at > self._renewed_at:
            return 0.0
        return max(time.monotonic() - (self._renewed_at + self.interval), 0.0)

    def postpone(self) -> None:
        """A background renewal failed: try again in one renewal interval."""
        self._retry_at = time.monotonic() + self.interval

    def _why(self) -> str:
        if self.record_gone:
            return (
                "its lease record is gone from Redis: the server lost it (e.g. a restart without persistence, a "
                "failover to a replica that never had it, FLUSHALL) or it expired, kept only for the room TTL "
                "after its last renewal; no other store holds the name"
            )
        if self.taken_over:
            lost_gen = self._lost_generation
            older = self.generation is not None and lost_gen is not None and lost_gen <= self.generation
            after = " after the server lost this store's lease record" if older else ""
            if lost_gen is None:
                after = ": a room this store wrote holds that incarnation's entry"
            return (
                f"another store took the name over with a new incarnation{after} (a restart under the same "
                "participant name)"
            )
        return (
            f"it was not renewed within its TTL of {self.ttl:g} s (the process was paused, e.g. SIGSTOP or a long "
            "GC pause, or Redis was unreachable), or it was released"
        )

    def lost_error(self) -> LeaseLostError:
        return LeaseLostError(
            f"participant {self.participant} lost its lease (incarnation {self.generation}, {self.incarnation}): "
            f"{self._why()}. A sweeper may have failed its entries; this store refuses writes from now on: create a "
            "new store (a new incarnation) to go on",
            participant=self.participant,
        )


# ---- the peer watch's acts

Steps = Generator[Request[Any], Any, Any]
"""Requests out; in, each decoded reply (``send``) or the send's error (``throw``: ``finally`` blocks run first)."""


def orphan_reason(room: int, seconds: float) -> str:
    return (
        f"no decode joined room {room} within {seconds:g} s: the decode it was sent to is dead or never got the request"
    )


def died_reason(participant: str) -> str:
    return f"participant {participant} died: its connection to Redis closed"


def act(watch: PeerWatch, plan: WatchPlan) -> Steps:
    """Carry out ``plan``; returns how many entries were failed."""
    failed = 0
    for name, rooms in plan.suspects.items():
        if rooms:
            entries = yield entries_request(watch.core, rooms, [name])
            state = entries.leases[0]
            if state is LeaseState.ALIVE:  # by Redis' clock; silent for its TTL by this one's: expired
                silent = yield watch.silence_request(name)
                if silent is not None and (yield watch.expire_request(name, *silent)):
                    state = LeaseState.LOST
            watch.confirmed(name, state)
            if state is LeaseState.LOST:
                failed += yield from _fail_gone(watch, entries, name, lost_reason(name))
    for name, rooms in plan.dead.items():
        if rooms:
            entries = yield entries_request(watch.core, rooms, [name])
            failed += yield from _fail_gone(watch, entries, name, died_reason(name))
    for name, rooms in plan.restarted.items():
        # The new incarnation's epoch fences its own entries off: it may have written these rooms already.
        below, address = yield watch.identity_request(name)
        reason = f"participant {name} restarted; this entry was its previous incarnation's"
        outcomes = yield from _fail(watch, rooms, name, Stage.SUPERSEDED, reason, below)
        failed += outcomes.count(Outcome.FAILED)
        # As for a loss (_fail_gone): rooms it never wrote, or reached Success in (REFUSED_TERMINAL) unless orderly.
        done = None if name in plan.orderly else Outcome.REFUSED_TERMINAL
        absent = [room for room, outcome in zip(rooms, outcomes) if outcome in (Outcome.IGNORED_MISSING, done)]
        waited = f"participant {name} restarted; this room waited on its previous incarnation at {address}"
        failed += yield from _fail_awaiting(watch, absent, address, Stage.SUPERSEDED, waited)
    failed += yield from _fail_orphans(watch, plan.orphans, plan.orphan_seconds)
    if plan.forget:
        yield watch.forget_request(plan.forget)
    return failed


def _fail_orphans(watch: PeerWatch, rooms: list[int], seconds: float) -> Steps:
    """Fail this store's own Bootstrapping entry in the ``rooms`` no decode joined in ``seconds``; returns how many."""
    core, failed = watch.core, 0
    for room in rooms:
        view = yield core.room(room)
        own = view.participants.get(watch.participant)
        if own is None or own.status is not KVPoll.Bootstrapping or any(map(is_decode, view.participants)):
            watch.joined(room)
            continue
        try:
            yield core.record_failure(room, orphan_reason(room, seconds))
            result = yield core.update_status(room, KVPoll.Failed)
        finally:
            watch.drop_cached([room])  # this process's reads of the room see the failure at once
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


def _fail_gone(watch: PeerWatch, entries: Entries, name: str, reason: str) -> Steps:
    """Fail the open entries (in ``entries``, just read) of ``name``, lost or dead; returns how many were failed."""
    open_rooms = [room for i, room in enumerate(entries.rooms) if entries.statuses(i)[0] in OPEN]
    below = entries.epochs[0] + 1 if entries.epochs[0] else None  # not a later incarnation's
    outcomes = yield from _fail(watch, open_rooms, name, Stage.LEASE_LOST, reason, below)
    failed: int = outcomes.count(Outcome.FAILED)
    # Rooms it never wrote, or reached Success in unless it released its lease: docs/guide.md, "A peer that never
    # wrote the room".
    done = None if watch.released(name) else KVPoll.Success
    absent = [room for i, room in enumerate(entries.rooms) if entries.statuses(i)[0] in (None, done)]
    if watch.awaits_any(absent):
        address = watch.peer_address(name)
        if address is None:
            address = (yield watch.identity_request(name))[1]
        waits = f"{reason}; this room waits on it at {address}"
        failed += yield from _fail_awaiting(watch, absent, address, Stage.LEASE_LOST, waits)
    return failed


def _fail_awaiting(watch: PeerWatch, rooms: list[int], address: Optional[str], stage: Stage, reason: str) -> Steps:
    """Fail with ``reason`` this store's own open entries in those of ``rooms`` (the peer has no entry there) that wait
    on the peer at ``address`` (None: no room does); returns how many were failed."""
    awaiting = [] if address is None else watch.awaiting(rooms, address)
    outcomes = yield from _fail(watch, awaiting, watch.participant, stage, reason, None)
    for room, outcome in zip(awaiting, outcomes):
        if outcome is Outcome.FAILED:
            watch.closed(room)
    return outcomes.count(Outcome.FAILED)


def _fail(watch: PeerWatch, rooms: list[int], name: str, stage: Stage, reason: str, below: Optional[int]) -> Steps:
    """Fail ``name``'s open entries in ``rooms`` (logged), but those stamped ``below`` or later (an incarnation
    epoch; None: no fence); returns the outcome in each room, in order."""
    if not rooms:
        return []
    try:
        outcomes: list[Outcome] = yield fail_entries_request(watch.core, rooms, name, stage, reason, below)
    finally:
        watch.drop_cached(rooms)  # this process's reads of those rooms see the failure at once
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


def fail_entries_request(
    core: StoreCore, rooms: list[int], participant: str, stage: Stage, reason: str, below: Optional[int] = None
) -> Request[list[Outcome]]:
    """The calls failing ``participant``'s open entries in ``rooms`` with ``reason``, first failure at ``stage``
    (lua/sweep.lua, per chunk and slot), but those stamped ``below`` (an epoch; None: no fence) or later; decodes to
    the outcome in each room, in order."""
    keys = core.schema.room_keys(rooms)
    args: tuple[str, ...] = (participant, reason_field(participant), reason, stage.value)
    if below is not None:
        args += (incarnation_field(participant), str(below))
    groups = core.chunks(keys)
    calls = [script_call(scripts.SWEEP, [keys[i] for i in group], args) for group in groups]

    def decode(replies: list[Any]) -> list[Outcome]:
        outcomes = [Outcome.UNCHANGED] * len(keys)
        for group, reply in zip(groups, replies):
            for i, code in zip(group, reply):
                outcomes[i] = Outcome(code)
        return outcomes

    return Request(calls, decode)
