"""Change detection between two passes over a namespace (``kvstatus watch``), without the CLI.

A :class:`Snapshot` keeps one small tuple per room (participant, status), so
100k live rooms cost a few tens of MB and one SCAN pass per refresh.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

from kvstatus.admin.scan import DEFAULT_BATCH, Progress, iter_rooms
from kvstatus.keys import KeySchema
from kvstatus.rule import KVPoll

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


@dataclass
class Snapshot:
    """Every room's entries at one moment, the counts by status, and how many rooms were skipped as corrupted."""

    rooms: dict[int, RoomState]
    by_status: Counter
    corrupted: int = 0

    @classmethod
    def take(
        cls, client: Any, schema: KeySchema, batch: int = DEFAULT_BATCH, progress: Optional[Progress] = None
    ) -> Snapshot:
        rooms: dict[int, RoomState] = {}
        by_status: Counter = Counter()
        corrupted: list[int] = []
        for view in iter_rooms(client, schema, batch, progress, lambda room, _: corrupted.append(room), False):
            state = tuple((name, None if e.status is None else int(e.status)) for name, e in view.participants.items())
            rooms[view.room] = state
            by_status.update(KVPoll(s) for _, s in state if s is not None)
        return cls(rooms, by_status, len(corrupted))


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


def watch_changes(
    client: Any,
    schema: KeySchema,
    interval: float,
    *,
    count: Optional[int] = None,
    batch: int = DEFAULT_BATCH,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[tuple[Snapshot, list[Change]]]:
    """Yield (snapshot, changes since the previous one) every ``interval`` seconds, ``count`` times or forever.

    The first snapshot comes with no changes. The generator sleeps only
    between snapshots, so a consumer that stops iterating stops at once.
    """
    previous: Optional[Snapshot] = None
    taken = 0
    while count is None or taken < count:
        if previous is not None:
            sleep(interval)
        snap = Snapshot.take(client, schema, batch)
        yield snap, (list(diff(previous, snap)) if previous is not None else [])
        previous = snap
        taken += 1
