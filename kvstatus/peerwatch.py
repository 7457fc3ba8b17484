"""The peer watch, without I/O: which peers of this store's open rooms died or restarted, which of its rooms no
decode joined, and whose open entries to fail (:mod:`kvstatus.leasestate` plans the acts, the lease keeper sends
them). How a peer is judged dead: docs/design.md, "Who decides that a peer is dead"."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

from kvstatus import scripts
from kvstatus.errors import CorruptedValueError, PermissionDeniedError
from kvstatus.keys import ADDRESS_FIELD, MAX_NAME_LENGTH, role_of
from kvstatus.model import OPEN, KVPoll, LeaseOutcome, LeaseState
from kvstatus.replies import ReplyOrError, stored_int, subscriber_counts, text
from kvstatus.requests import Call, Request, script_call
from kvstatus.translate import checked, translate_error

if TYPE_CHECKING:  # a core is handed in; importing operations would stack this module on top of it
    from kvstatus.operations import StoreCore

WATCH_SECONDS = 1.0
"""Seconds between two looks at the peers' marks: a dead peer's rooms fail within its lease TTL plus this."""

PRESENCE_SECONDS = 0.25
"""Seconds between two counts of the presences (one ``PUBSUB NUMSUB`` each: 4 commands a second)."""
PRESENCE_GRACE = 0.5
"""Seconds a peer's presence must stay absent before it counts as dead (a reconnecting peer subscribes again sooner)."""

ORPHAN_SECONDS = 30.0
"""Seconds a prefill's Bootstrapping entry waits for a decode to join its room before it fails (upstream: 300 s)."""
ORPHAN_AFTER_DEATH_SECONDS = 3.0
"""The same while a decode of the namespace is dead or lost: what a router still sends it fails in seconds."""
MAX_ORPHANS_A_LOOK = 64
"""Rooms a look reads for orphans at most (one read each): the rest wait for the next look."""
DISCOVERY_ROOMS = 16
"""Open rooms a look reads for peers while the lease index cannot be used: this store's newest."""

RELEASED_MARK = "released"
_NAME = re.compile(rf"[A-Za-z0-9_.-]{{1,{MAX_NAME_LENGTH}}}")  # a participant, as kvstatus.keys validates one
STALE_LOOKS = 2.5
"""Looks a peer's mark may stay unchanged (or its lease TTL, if shorter) before the peer is a suspect (one read)."""


@dataclass
class WatchPlan:
    """What one look asks for, peer -> rooms: ``suspects`` (leases to check), ``dead`` (presence gone, no lease check),
    ``restarted`` (entries to fail); ``orderly``: restarted peers whose previous incarnation released its lease."""

    suspects: dict[str, list[int]] = field(default_factory=dict)
    dead: dict[str, list[int]] = field(default_factory=dict)
    orphans: list[int] = field(default_factory=list)
    orphan_seconds: float = ORPHAN_SECONDS
    restarted: dict[str, list[int]] = field(default_factory=dict)
    orderly: set[str] = field(default_factory=set)
    forget: list[str] = field(default_factory=list)

    def merge(self, more: WatchPlan, known: Optional[dict[str, _Peer]] = None) -> None:
        """Add ``more``'s suspects, deaths and restarts (only those of ``known`` peers, if given)."""
        for mine, theirs in zip((self.suspects, self.dead, self.restarted), (more.suspects, more.dead, more.restarted)):
            for name, rooms in theirs.items():
                if known is None or name in known:
                    mine[name] = list(dict.fromkeys([*mine.get(name, []), *rooms]))
        self.orderly |= {name for name in more.orderly & more.restarted.keys() if known is None or name in known}


@dataclass
class _Peer:
    mark: str  # as the lease index holds it (:meth:`PeerWatch.mark_calls`); "": learnt from a room's entries
    changed_at: float  # monotonic time the mark last changed
    lost: bool = False
    address: Optional[str] = None  # its lease's address, once read (a lost or restarted peer's)
    seen: bool = False  # its presence was counted since this store's own subscription took
    absent_since: Optional[float] = None  # monotonic time its presence was first counted absent
    dead: bool = False  # its presence says it died: watched in rooms opened later too


class PeerWatch:
    """A store's open rooms and its view of the peers' lease marks; the requests of a watch, without I/O. ``lease_ttl``,
    ``keep`` (how long a lease record outlives its last renewal): seconds. ``drop_cached(rooms)`` makes this process's
    near caches drop rooms the watch failed. :meth:`wrote` and :meth:`closed` run on any thread (single dict
    operations, atomic under the GIL); the rest on the keeper's."""

    def __init__(
        self, core: StoreCore, lease_ttl: float, keep: float, drop_cached: Callable[[list[int]], None]
    ) -> None:
        self.core, self.drop_cached = core, drop_cached
        self.participant = core.participant
        self.key = core.schema.lease_index_key
        self.keep, self.interval = keep, WATCH_SECONDS
        self._keep_ms = str(round(keep * 1000))  # the lease index's TTL, renewed with each mark
        self.stale_after = min(lease_ttl, STALE_LOOKS * WATCH_SECONDS)
        self._open: dict[int, float] = {}  # room -> monotonic time this store first wrote it open
        self._awaits: dict[int, str] = {}  # room -> the address of the peer it waits on (awaits())
        self.judges_orphans = role_of(self.participant) == "prefill"
        self._bootstrapping: dict[int, float] = {}  # room -> monotonic time this store's entry opened Bootstrapping
        self._peers: dict[str, _Peer] = {}
        self._unfinished = WatchPlan()  # what a look could not carry out (Redis failed it): planned again next time
        self._looked_at = self._previous_look = self._counted_at = -float("inf")
        self._looks = 0
        self.channel = core.schema.presence_channel(self.participant)
        self.numsub = "SHARDNUMSUB" if core.cluster else "NUMSUB"  # how a presence is counted
        self._generation = 0  # of this store's own presence when its peers' were last counted
        self.index_refused: Optional[str] = None  # why the lease index could not be used at the last look
        self._silent: dict[str, tuple[str, str, float]] = {}  # a suspect alive by Redis' clock: its last renewal

    def wrote(self, room: int, status: Optional[KVPoll]) -> None:
        """This store's entry in ``room`` is now ``status`` (None: none)."""
        if status in OPEN:
            self._open.setdefault(room, time.monotonic())
            if status is KVPoll.Bootstrapping and self.judges_orphans:
                self._bootstrapping.setdefault(room, time.monotonic())
            else:
                self._bootstrapping.pop(room, None)
        else:
            self.closed(room)

    def closed(self, room: int) -> None:
        """This store's entry in ``room`` was cleared, popped or cancelled."""
        self._open.pop(room, None)
        self._awaits.pop(room, None)
        self._bootstrapping.pop(room, None)

    def joined(self, room: int) -> None:
        """A decode has an entry in ``room``, or this store's own entry left Bootstrapping: no orphan to judge."""
        self._bootstrapping.pop(room, None)

    def awaits(self, room: int, address: str) -> None:
        """``room`` waits on the peer at ``address`` (``host:port``): see :meth:`~kvstatus.StatusStore.awaits`."""
        self._awaits[room] = address

    def awaiting(self, rooms: list[int], address: str) -> list[int]:
        return [room for room in rooms if self._awaits.get(room) == address]

    def awaits_any(self, rooms: list[int]) -> bool:
        return bool(self._awaits) and any(room in self._awaits for room in rooms)

    def released(self, name: str) -> bool:
        """True when ``name``'s last mark says it released its lease (an orderly exit, not a death)."""
        peer = self._peers.get(name)
        return peer is not None and peer.mark.endswith(RELEASED_MARK)

    def peer_address(self, name: str) -> Optional[str]:
        """The address read from ``name``'s lease record, if read before (:meth:`identity_request`)."""
        peer = self._peers.get(name)
        return None if peer is None else peer.address

    def next_delay(self) -> float:
        """Seconds until the next look is due."""
        return max(self._looked_at + self.interval - time.monotonic(), 0.0)

    def next_count_delay(self) -> float:
        """Seconds until the next count of the presences is due."""
        return max(self._counted_at + PRESENCE_SECONDS - time.monotonic(), 0.0)

    def count_request(self) -> Request[dict[str, int]]:
        """Count this store's presence and each known peer's in one command; decodes to ``{participant: count}``."""
        self._counted_at = time.monotonic()
        channels = {self.core.schema.presence_channel(name): name for name in (self.participant, *self._peers)}
        call = Call(("PUBSUB", self.numsub, *channels), route=self.channel)

        def decode(replies: list[ReplyOrError]) -> dict[str, int]:
            counts = subscriber_counts(replies[0])
            return {name: counts.get(channel, 0) for channel, name in channels.items()}

        return Request([call], decode)

    def judge(self, counts: dict[str, int], generation: int) -> list[str]:
        """The peers that died by ``counts`` (just read by :meth:`count_request`) while this store's own presence
        is its subscription number ``generation``: seen present, then absent for :data:`PRESENCE_GRACE`."""
        now = time.monotonic()
        if counts.get(self.participant, 0) < 1 or generation != self._generation:
            # Own subscription uncounted or new (a restart, a failover, a reconnect): what was seen may be elsewhere.
            self._generation = generation
            for peer in self._peers.values():
                peer.seen, peer.absent_since = False, None
            if counts.get(self.participant, 0) < 1:
                return []
        dead = []
        for name, peer in self._peers.items():
            if counts.get(name, 0) > 0:
                peer.seen, peer.absent_since, peer.dead = True, None, False
                if self.index_refused is not None:
                    peer.changed_at = now  # no mark changes: a present peer is a live one
            elif peer.seen and not peer.mark.endswith(RELEASED_MARK):
                if peer.absent_since is None:
                    peer.absent_since = now
                elif now - peer.absent_since >= PRESENCE_GRACE:
                    peer.seen, peer.absent_since, peer.dead = False, None, True
                    dead.append(name)
        return dead

    def mark_calls(self, incarnation: str, looks: int, released: bool = False) -> list[Call]:
        """The calls writing this store's mark: its lease ``incarnation`` and a counter that changes each time."""
        mark = f"{incarnation}:{RELEASED_MARK if released else looks}"
        return [Call(("HSET", self.key, self.participant, mark)), Call(("PEXPIRE", self.key, self._keep_ms))]

    def postpone(self, seconds: float) -> None:
        """A look or a count failed (Redis unreachable or hung): the next of each in ``seconds`` (or its interval)."""
        now = time.monotonic()
        self._looked_at = now + max(seconds - self.interval, 0.0)
        self._counted_at = now + max(seconds - PRESENCE_SECONDS, 0.0)

    def look_request(self, incarnation: str) -> Request[dict[str, str]]:
        """Write this store's mark and read the others' in one round trip; decodes to ``{participant: mark}``."""
        self._looks += 1
        calls = [*self.mark_calls(incarnation, self._looks), Call(("HGETALL", self.key))]
        if self.index_refused is not None:  # no marks name the peers: the newest open rooms' entries do
            recent = list(self._open.copy())[-DISCOVERY_ROOMS:]  # one C call: the store's threads may write
            calls += [Call(("HGETALL", key)) for key in self.core.schema.room_keys(recent)]

        def decode(replies: list[Any]) -> dict[str, str]:
            refused = _refusal(calls[:3], replies[:3])
            if refused is not None:  # a tenant's string at the index, an ACL: the peers as last known
                self.index_refused = f"the lease index {self.key} could not be used ({refused})"
                now = time.monotonic()
                for room in replies[3:]:
                    for name in map(text, room if isinstance(room, dict) else ()):
                        if name != self.participant and name not in self._peers and _NAME.fullmatch(name):
                            self._peers[name] = _Peer("", now)  # a participant's status field: a peer to watch
                return {name: peer.mark for name, peer in self._peers.items()}
            self.index_refused, marks = None, replies[2] or {}
            return {text(name): text(value) for name, value in marks.items() if text(name) != self.participant}

        return Request(calls, decode, strict=0)

    def plan(self, marks: dict[str, str], dead: tuple[str, ...] = ()) -> WatchPlan:
        """Judge the peers' ``marks`` (just read): who to check, who restarted, which marks are stale; ``dead``:
        the peers :meth:`judge` found dead just before, whose open entries fail in every open room."""
        now = time.monotonic()
        self._previous_look, self._looked_at = self._looked_at, now
        plan = WatchPlan()
        horizon = now - self.core.ttl_ms / 1000  # older open rooms' keys are gone (a caller never concluded them)
        for room in [room for room, at in self._open.copy().items() if at < horizon]:
            self.closed(room)
        opened = self._open.copy()  # one C call: the store's threads may write meanwhile
        rooms = list(opened)
        for name, mark in marks.items():
            peer = self._peers.get(name)
            if peer is None or mark != peer.mark:
                if peer is None:
                    peer = self._peers[name] = _Peer(mark, now)
                elif mark.partition(":")[0] != peer.mark.partition(":")[0]:  # another incarnation
                    before = [room for room, at in opened.items() if at < self._previous_look]
                    if before:
                        plan.restarted[name] = before
                        if peer.mark.endswith(RELEASED_MARK):
                            plan.orderly.add(name)
                    peer.dead = False  # a new incarnation's presence is its own
                peer.mark, peer.changed_at, peer.lost = mark, now, False
                self._silent.pop(name, None)
                if mark.endswith(RELEASED_MARK):
                    plan.suspects[name] = rooms
                elif name in dead:
                    plan.dead[name] = rooms
            elif now - peer.changed_at > self.keep:
                plan.forget.append(name)  # its lease record is gone by now (kept as long as the rooms)
            elif name in dead:
                plan.dead[name] = rooms
            elif peer.dead or peer.lost:  # watched in the rooms opened since
                fresh = [room for room, at in opened.items() if at >= self._previous_look]
                if fresh:
                    (plan.dead if peer.dead else plan.suspects)[name] = fresh
            elif now - peer.changed_at > self.stale_after:
                plan.suspects[name] = rooms
        for name in [name for name in self._peers if name not in marks or name in plan.forget]:
            del self._peers[name]
        if self._bootstrapping:
            dead_decode = any((p.dead or p.lost) and role_of(name) == "decode" for name, p in self._peers.items())
            plan.orphan_seconds = ORPHAN_AFTER_DEATH_SECONDS if dead_decode else ORPHAN_SECONDS
            waiting = self._bootstrapping.copy()  # one C call: the store's threads may write meanwhile
            plan.orphans = [room for room, at in waiting.items() if now - at >= plan.orphan_seconds]
            del plan.orphans[MAX_ORPHANS_A_LOOK:]
        redo, self._unfinished = self._unfinished, WatchPlan()
        plan.merge(redo, self._peers)
        return plan

    def unfinished(self, plan: WatchPlan) -> None:
        """Carrying out ``plan`` failed (Redis unreachable or hung): the next look plans its peers' failures again."""
        self._unfinished.merge(plan)

    def confirmed(self, name: str, state: LeaseState) -> None:
        """The lease record of suspect ``name`` was read: LOST marks it lost (watched in rooms opened later)."""
        peer = self._peers.get(name)
        if peer is not None:
            peer.lost = state is LeaseState.LOST

    def identity_request(self, name: str) -> Request[tuple[Optional[int], Optional[str]]]:
        """What ``name``'s lease record says now: the epoch of the incarnation that holds it (None: no record), the
        fence of a sweep of its previous incarnation's entries, and its address (None: none, or not one)."""

        def decode(replies: list[Any]) -> tuple[Optional[int], Optional[str]]:
            raw_epoch, raw_address = replies[0]
            epoch = stored_int(raw_epoch)  # None: no record, or not one lua/lease.lua wrote (" 7", "1e300"): no fence
            address = None if raw_address is None else text(raw_address)
            peer = self._peers.get(name)
            if peer is not None:
                peer.address = address
            return (epoch if epoch and epoch > 0 else None), address

        return Request([Call(("HMGET", self.core.schema.lease_key(name), "epoch", ADDRESS_FIELD))], decode)

    def silence_request(self, name: str) -> Request[Optional[tuple[str, str]]]:
        """Read suspect ``name``'s lease record (alive by Redis' clock, its mark stale): its (incarnation, seen) once
        that renewal is older than its lease TTL by this process' monotonic clock, else None; :meth:`expire_request`
        then expires it (a step back of Redis' clock keeps a lease alive the step longer: docs/operations.md)."""

        def decode(replies: list[Any]) -> Optional[tuple[str, str]]:
            inc, seen, ttl = (None if value is None else text(value) for value in replies[0])
            ttl_ms = stored_int(ttl)
            if inc is None or seen is None or ttl_ms is None:
                self._silent.pop(name, None)
                return None
            first = self._silent.get(name)
            if first is None or first[:2] != (inc, seen):
                self._silent[name] = (inc, seen, time.monotonic())
                return None
            return (inc, seen) if time.monotonic() - first[2] > ttl_ms / 1000 else None

        return Request([Call(("HMGET", self.core.schema.lease_key(name), "inc", "seen", "ttl"))], decode)

    def expire_request(self, name: str, incarnation: str, seen: str) -> Request[bool]:
        """Expire ``name``'s lease record if it still names ``incarnation``, held, last renewed at ``seen``
        (lua/lease.lua's "expire"); decodes to True when the lease is lost (now, or before)."""
        call = script_call(scripts.LEASE, [self.core.schema.lease_key(name)], ("expire", incarnation, seen))
        return Request([call], lambda replies: int(replies[0][0]) == LeaseOutcome.LOST.value)

    def forget_request(self, names: list[str]) -> Request[object]:
        """Drop the marks of peers whose lease records are gone (a refused index is no error)."""
        calls = [Call(("HDEL", self.key, *names))]
        return Request(calls, lambda replies: _refusal(calls, replies) or replies[0], strict=0)


def _refusal(calls: list[Call], replies: Sequence[object]) -> Optional[Exception]:
    """The first reply of ``calls`` by which Redis refused the lease index (another type, an ACL), or None; any other
    error (a server that did not answer in time) is raised as its kvstatus error."""
    errors = [(call, reply) for call, reply in zip(calls, replies) if isinstance(reply, Exception)]
    for call, reply in errors:
        if not isinstance(translate_error(reply, call), (CorruptedValueError, PermissionDeniedError)):
            checked([call], [reply])
    return errors[0][1] if errors else None
