"""Change detection between two passes over a namespace (``kvstatus watch``), without the CLI.

A :class:`Snapshot` keeps one small tuple per room (participant, status), so
100k live rooms cost a few tens of MB and one SCAN pass per refresh. :func:`diff`
names the rooms that changed (the text view); :func:`entry_events` the entries
(``kvstatus watch --json``: one :class:`EntryEvent` per participant whose status
changed), from snapshots taken with ``detail=True`` (reasons, first failures and
timeline steps kept too).
"""

from __future__ import annotations

import hashlib
import itertools
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, NamedTuple, Optional

from kvstatus.admin.reads import DEFAULT_BATCH, Progress, iter_rooms, server_ms
from kvstatus.admin.views import failed_by_fate
from kvstatus.errors import BackendUnavailableError
from kvstatus.keys import KeySchema
from kvstatus.model import FailureRecord, KVPoll, RoomView
from kvstatus.rule import reads

RoomState = tuple[tuple[str, Optional[int]], ...]

NEW, ADVANCED, FAILED, CLEARED = "new", "advanced", "failed", "cleared"
KINDS = (NEW, ADVANCED, FAILED, CLEARED)


@dataclass(frozen=True)
class Change:
    """One room that changed between two snapshots; ``before``/``after`` map participant -> status name."""

    kind: str
    room: int
    before: dict[str, Optional[str]]
    after: dict[str, Optional[str]]

    def to_json(self) -> dict[str, Any]:
        return {"event": self.kind, "room": self.room, "before": self.before, "after": self.after}


class RoomDetail(NamedTuple):
    """What a detailed snapshot keeps of a room beside its statuses: its first failure, the entries' failure
    reasons, and when each entry reached its current status (its last timeline step, Unix ms by Redis' clock)."""

    failure: Optional[FailureRecord]
    reasons: dict[str, str]
    reached: dict[str, int]


def room_state(view: RoomView) -> RoomState:
    """(participant, status) of each entry, the status its reads answer (:func:`kvstatus.rule.reads`): an open
    entry in a room that failed is Failed, as ``get`` shows it."""
    return tuple((name, None if s is None else int(s)) for name, s in reads(view).items())


def room_detail(view: RoomView) -> Optional[RoomDetail]:
    reasons = {name: e.reason for name, e in view.participants.items() if e.reason is not None}
    reached = {name: steps[-1].at_ms for name, steps in view.timelines.items() if steps}
    if view.failure is not None:  # who reads Failed by the room's fate reached it at its first failure
        reached.update(dict.fromkeys(failed_by_fate(view), view.failure.at_ms))
    if view.failure is None and not reasons and not reached:
        return None
    return RoomDetail(view.failure, reasons, reached)


@dataclass
class Snapshot:
    """Every room's entries at one moment, the counts by status, and how many rooms were skipped as corrupted.

    ``at_ms``: Redis' clock when the pass ended (None when not read); ``details``: per room, what
    :class:`RoomDetail` keeps (only in a snapshot taken with ``detail=True``, only rooms with something to keep).
    """

    rooms: dict[int, RoomState]
    by_status: Counter
    corrupted: int = 0
    at_ms: Optional[int] = None
    details: dict[int, RoomDetail] = field(default_factory=dict)

    @classmethod
    def take(
        cls,
        client: Any,
        schema: KeySchema,
        batch: int = DEFAULT_BATCH,
        progress: Optional[Progress] = None,
        detail: bool = False,
    ) -> Snapshot:
        rooms: dict[int, RoomState] = {}
        by_status: Counter = Counter()
        corrupted: list[int] = []
        details: dict[int, RoomDetail] = {}
        for view in iter_rooms(client, schema, batch, progress, lambda room, _: corrupted.append(room), False):
            state = room_state(view)
            rooms[view.room] = state
            by_status.update(KVPoll(s) for _, s in state if s is not None)
            kept = room_detail(view) if detail else None
            if kept is not None:
                details[view.room] = kept
        return cls(rooms, by_status, len(corrupted), server_ms(client), details)


def _names(state: RoomState) -> dict[str, Optional[str]]:
    return {name: None if s is None else KVPoll(s).name for name, s in state}


def classify(before: Optional[RoomState], after: Optional[RoomState]) -> Optional[str]:
    """The kind of change from ``before`` to ``after`` (None: missing), or None if nothing changed.

    A room in which some entry newly became Failed counts as failed; a room
    that lost an entry or all of them counts as cleared; any other change
    (a status moved, a participant joined) as advanced.
    """
    if before == after:
        return None
    if before is None:
        return NEW
    if after is None:
        return CLEARED
    old, new = dict(before), dict(after)
    if any(s == KVPoll.Failed and old.get(name) != KVPoll.Failed for name, s in new.items()):
        return FAILED
    if old.keys() - new.keys():
        return CLEARED
    return ADVANCED


def diff(before: Snapshot, after: Snapshot) -> Iterator[Change]:
    """Rooms that changed from ``before`` to ``after``, ordered by room id."""
    for room in sorted(before.rooms.keys() | after.rooms.keys()):
        old, new = before.rooms.get(room), after.rooms.get(room)
        kind = classify(old, new)
        if kind is not None:
            yield Change(kind, room, _names(old or ()), _names(new or ()))


def room_hash(room: int) -> str:
    """A stable stand-in for a room id in shared logs: the first 16 hex digits of SHA-256 of its decimal form."""
    return hashlib.sha256(str(room).encode("ascii")).hexdigest()[:16]


@dataclass(frozen=True)
class EntryEvent:
    """One entry whose status changed between two snapshots (``kvstatus watch --json``; docs/cli.md has the schema).

    ``status``/``previous_status``: KVPoll names, None when the entry is gone (cleared, or expired with its room)
    or new. ``at_ms``: Redis' clock when the pass that saw the change ended; ``reached_at_ms``: when the entry
    reached ``status``, from its timeline (None without one). For a Failed entry, ``reason`` is its own failure
    reason and ``failure`` the room's first failure (None when not recorded)."""

    room: int
    participant: str
    status: Optional[str]
    previous_status: Optional[str]
    at_ms: Optional[int]
    reached_at_ms: Optional[int] = None
    reason: Optional[str] = None
    failure: Optional[FailureRecord] = None
    gone: bool = False

    @property
    def kind(self) -> str:
        """ "cleared": the entry is gone (cleared, or expired with its room); "status": it has a new status."""
        return "cleared" if self.gone else "status"

    def to_json(self, hash_rooms: bool = False) -> dict[str, Any]:
        return {
            "event": self.kind,
            "room": room_hash(self.room) if hash_rooms else self.room,
            "participant": self.participant,
            "status": self.status,
            "previous_status": self.previous_status,
            "at_ms": self.at_ms,
            "reached_at_ms": self.reached_at_ms,
            "reason": self.reason,
            "failure": None if self.failure is None else self.failure.to_json(),
        }


_GONE = object()


def _name(status: object) -> Optional[str]:
    return KVPoll(status).name if isinstance(status, int) else None


def entry_events(before: Snapshot, after: Snapshot) -> Iterator[EntryEvent]:
    """The entries whose status changed from ``before`` to ``after`` (by room id, then participant); the
    reasons, failures and timeline steps come from ``after``'s details (a snapshot taken with ``detail=True``)."""
    for room in sorted(before.rooms.keys() | after.rooms.keys()):
        old, new = dict(before.rooms.get(room, ())), dict(after.rooms.get(room, ()))
        if old == new:
            continue
        detail = after.details.get(room)
        for name in sorted(old.keys() | new.keys()):
            was, now = old.get(name, _GONE), new.get(name, _GONE)
            if was == now:
                continue
            failed = now == KVPoll.Failed
            yield EntryEvent(
                room,
                name,
                status=_name(now),
                previous_status=_name(was),
                at_ms=after.at_ms,
                reached_at_ms=None if detail is None or now is _GONE else detail.reached.get(name),
                reason=detail.reasons.get(name) if detail is not None and failed else None,
                failure=detail.failure if detail is not None and failed else None,
                gone=now is _GONE,
            )


def watch_changes(
    client: Any,
    schema: KeySchema,
    interval: float,
    *,
    count: Optional[int] = None,
    batch: int = DEFAULT_BATCH,
    sleep: Callable[[float], None] = time.sleep,
    detail: bool = False,
    unavailable: Optional[Callable[[Optional[BackendUnavailableError]], None]] = None,
) -> Iterator[tuple[Snapshot, list[Change]]]:
    """Yield (snapshot, changes since the previous one) every ``interval`` seconds, ``count`` times or forever.

    The first snapshot comes with no changes. The generator sleeps only
    between snapshots, so a consumer that stops iterating stops at once.
    ``detail``: take detailed snapshots (:func:`entry_events` reads their details).
    With ``unavailable``, a refresh after the first that finds Redis unavailable (a restart, a failover) calls
    ``unavailable(error)`` and counts as a refresh, and every later snapshot calls ``unavailable(None)`` first;
    without it, or at the first refresh, the error is raised.
    """
    previous: Optional[Snapshot] = None
    for taken in itertools.count():
        if count is not None and taken >= count:
            return
        if taken:
            sleep(interval)
        try:
            snap = Snapshot.take(client, schema, batch, detail=detail)
        except BackendUnavailableError as error:
            if previous is None or unavailable is None:
                raise
            unavailable(error)
            continue
        if previous is not None and unavailable is not None:
            unavailable(None)
        yield snap, (list(diff(previous, snap)) if previous is not None else [])
        previous = snap
