"""Participant leases: a store holds one for its participant and keeps it alive in the background.

:class:`LeaseCore` is the logic (requests and state, no I/O); the keeper that performs it is written once in
:mod:`kvstatus._async.leases` (an asyncio task) and generated for threads (:mod:`kvstatus._sync.leases`). When a
lease is alive, lost for good or renewed before a write: docs/guide.md, "Leases, the consensus view, sweeping and
tombstones". The record outlives the lease by the store's room TTL, so readers (the consensus view, the sweeper,
``kvstatus participants``) see a dead participant as lost for as long as its entries can exist.
"""

from __future__ import annotations

import logging
import math
import os
import secrets
import socket
import time
from collections.abc import Callable
from typing import Any, Optional

from kvstatus import scripts
from kvstatus.arguments import validate_lease_ttl
from kvstatus.errors import BackendError, LeaseLostError
from kvstatus.keys import KeySchema, validate_address
from kvstatus.model import LeaseOutcome
from kvstatus.replies import stored_int, subscriber_counts, text
from kvstatus.requests import Call, Request, script_call

log = logging.getLogger("kvstatus.leases")

RENEWALS_PER_TTL = 3
HOLDER_FIELD = "holder"
"""The lease record's field naming the holding process (``host:pid``; lua/lease.lua writes it at the acquire)."""
ADDRESS_FIELD = "addr"
"""The lease record's field of the holder's address (``host:port``; lua/lease.lua writes it at the acquire)."""
# The write path renews synchronously once this share of the TTL went by since the last renewal was sent.
STALE_SHARE = 2 / 3

HELD, LOST, RELEASED = LeaseOutcome.HELD.value, LeaseOutcome.LOST.value, LeaseOutcome.RELEASED.value


def this_process() -> str:
    """``host:pid`` of this process, as a lease record's holder names it."""
    host = "".join(ch for ch in socket.gethostname() if ch.isprintable() and not ch.isspace())[:200]
    return f"{host or 'localhost'}:{os.getpid()}"


class LeaseCore:
    """A store's lease, without I/O: the requests to send and what their replies mean.

    Attributes: ``participant``; ``ttl`` (seconds); ``incarnation`` (the
    random token of the current holder, None before the first acquire);
    ``generation`` (how many incarnations the name has had, this one
    included); ``epoch`` (the incarnation's fence, Unix ms at its acquire by Redis' clock and above
    every earlier incarnation's: the store stamps its entries with it); ``lost`` (True once Redis answered
    LOST, or a write was refused as superseded); ``released``; ``address`` (``host:port`` by which peers
    reach the holder, or None: written into the record at each acquire, see :mod:`kvstatus.peerwatch`).
    """

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
        self.lost = False
        self.released = False
        self.taken_over = False
        self.record_gone = False
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
        """The :class:`~kvstatus.operations.Request` of ``op`` ("acquire", "renew", "release"); decodes to (code, gen)."""
        if op == "acquire":
            self.incarnation = secrets.token_hex(8)
            self.acquired = self.lost = self.released = self.taken_over = self.record_gone = False
        assert self.incarnation is not None
        args: tuple[str, ...] = (op, self.incarnation, self._ttl_ms, self._keep_ms)
        if op == "acquire":
            args += (self.address or "", this_process())
        call = script_call(scripts.LEASE, [self.key], args)

        def decode(replies: list[Any]) -> tuple[int, int, int]:
            reply = replies[0]
            if not isinstance(reply, list) or len(reply) != 3 or reply[0] not in (HELD, LOST, RELEASED):
                raise BackendError(f"the lease script replied {reply!r}, expected [code 10..12, generation, epoch]")
            return int(reply[0]), int(reply[1]), int(reply[2])

        # Only the lease script's error fails the request: a peer-watch mark sent with it (kvstatus._async.leases)
        # meets a tenant's string at the lease index, and the lease must still be held (issue 36).
        return Request([call], decode, strict=1)

    def holder_request(self, channel: str, numsub: str) -> Request[Optional[str]]:
        """Who holds this participant's name alive, as another process: its record's ``holder`` (or "a process
        that did not say which") while the lease is alive by Redis' clock and a presence is subscribed on
        ``channel`` (counted with ``PUBSUB <numsub>``); None when nobody does (free, lost, released, or a
        crashed holder whose presence is gone: a restart takes the name over)."""
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
            # gen 0: no record at all (the script reads a missing hash as generation 0).
            self.record_gone = generation == 0
            self._lost_generation = generation
            # Another incarnation's record: a later generation, or the same one under another epoch (the server
            # lost the record, and another store's acquires brought the count back to this one's).
            self.taken_over = (
                self.generation is not None
                and generation != 0
                and (generation != self.generation or epoch != self.epoch)
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
        """Seconds by which the background renewal due now is late (0.0 when on time or not due). More than one
        renewal interval late means this process did not run its keeper: it stalled (SIGSTOP, a native call
        holding the GIL, CPU starvation), and the lease lapses once the stall reaches its TTL."""
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


def silence_request(
    key: str, silent: dict[str, tuple[str, str, float]], name: str, now: Callable[[], float]
) -> Request[Optional[tuple[str, str]]]:
    """Read ``name``'s lease record ``key`` (a peer whose lease Redis says is alive, but whose mark went stale):
    its (incarnation, seen) once that renewal was its last for longer than its lease TTL by ``now`` (a monotonic
    clock), else None. ``silent`` keeps each peer's last renewal read and when it was first read. A peer watch then
    expires the lease (:func:`expire_request`): Redis' clock is no judge of that, as a step back keeps a lease
    alive the step longer (docs/operations.md)."""

    def decode(replies: list[Any]) -> Optional[tuple[str, str]]:
        inc, seen, ttl = (None if value is None else text(value) for value in replies[0])
        ttl_ms = stored_int(ttl)
        if inc is None or seen is None or ttl_ms is None:
            silent.pop(name, None)
            return None
        first = silent.get(name)
        if first is None or first[:2] != (inc, seen):
            silent[name] = (inc, seen, now())
            return None
        return (inc, seen) if now() - first[2] > ttl_ms / 1000 else None

    return Request([Call(("HMGET", key, "inc", "seen", "ttl"))], decode)


def expire_request(key: str, incarnation: str, seen: str) -> Request[bool]:
    """Expire the lease record ``key`` if it still names ``incarnation``, held, last renewed at ``seen``
    (lua/lease.lua's "expire"); decodes to True when the lease is lost (now, or before)."""
    call = script_call(scripts.LEASE, [key], ("expire", incarnation, seen))
    return Request([call], lambda replies: int(replies[0][0]) == LOST)
