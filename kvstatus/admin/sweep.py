"""The sweeper (``kvstatus sweep``): fail every open entry of a participant whose lease is lost.

1. The lost participants are read from their lease records
   (:func:`kvstatus.admin.reads.lost_participants`). A participant that never
   held a lease has no record and is never swept: only stores built with
   ``lease_ttl`` can be declared dead.
2. The rooms are walked with SCAN in batches of ``batch`` keys (bounded
   memory, every cluster primary). Per batch, one round trip reads the lost
   participants' entries *and* their lease states again (the read of the
   consensus view, :func:`kvstatus.rule.entries_request`), so a
   participant that came back under a new incarnation meanwhile is left alone.
3. For each participant still lost, its entries in Bootstrapping,
   WaitingForInput or Transferring are failed by ``lua/sweep.lua``: per room,
   atomically, an open entry becomes Failed (the update rule's FAILED row;
   under ``strict`` no late write of the dead participant can undo it) with
   the reason "participant P lost its lease", unless an earlier reason is
   kept. Success, Failed and missing entries are never touched, nor is any
   other participant's entry, nor the room's TTL.

Running it from several places at once is safe and idempotent: the script
re-reads each entry atomically, so an entry is failed once and every later
sweep finds it terminal. It writes nothing when no lease is lost (then it
does not even scan the rooms).

A key it cannot read (a string where a room hash or a lease record belongs, a
status kvstatus does not write) is skipped and counted (``skipped``, with a
sample naming the keys); the sweep goes on with every other room and
participant. A batch holding such a key is read again room by room.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Optional

from kvstatus._sync.store import StatusStore
from kvstatus.admin.reads import DEFAULT_BATCH, Progress, iter_room_keys, list_leases
from kvstatus.errors import CorruptedValueError
from kvstatus.keys import KeySchema
from kvstatus.leasestate import fail_entries_request
from kvstatus.model import OPEN, LeaseState, Outcome, Stage
from kvstatus.rule import MAX_PARTICIPANTS, Entries, entries_request, lost_reason

SAMPLE = 5
"""How many skipped keys a sweep names (``skipped_sample``)."""


@dataclass
class SweepResult:
    """What one sweep did. ``swept``: entries it failed; ``rooms``: rooms holding one of them; ``raced``:
    open entries that were terminal or gone by the time the script ran (another sweeper, or the participant)."""

    lost: list[str] = field(default_factory=list)
    scanned: int = 0
    swept: int = 0
    rooms: int = 0
    raced: int = 0
    by_participant: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    not_swept: dict[str, str] = field(default_factory=dict)
    """Participants named in ``participants`` that are not lost: name -> "alive" or "no lease record"."""
    other_lost: list[str] = field(default_factory=list)
    """Lost participants left alone because ``participants`` did not name them."""
    skipped: int = 0
    """Keys skipped because they hold what kvstatus does not write (see the module); ``skipped_sample`` names some."""
    skipped_sample: list[str] = field(default_factory=list)

    def skip(self, message: str) -> None:
        """Count a skipped key; keep the first :data:`SAMPLE` messages naming one."""
        self.skipped += 1
        if len(self.skipped_sample) < SAMPLE:
            self.skipped_sample.append(message)

    def to_json(self) -> dict[str, Any]:
        return {
            "lost_participants": self.lost,
            "keys_scanned": self.scanned,
            "entries_failed": self.swept,
            "rooms": self.rooms,
            "raced": self.raced,
            "by_participant": self.by_participant,
            "not_swept": self.not_swept,
            "other_lost_participants": self.other_lost,
            "skipped_keys": self.skipped,
            "skipped_sample": self.skipped_sample,
            "seconds": round(self.seconds, 3),
        }


def sweep(
    client: Any,
    schema: KeySchema,
    *,
    batch: int = DEFAULT_BATCH,
    progress: Optional[Progress] = None,
    participants: Optional[list[str]] = None,
) -> SweepResult:
    """Fail the open entries of every participant whose lease is lost (only those in ``participants`` if given).

    ``progress(keys_scanned)`` is called after each batch. Returns what was done; raises
    :class:`~kvstatus.errors.KVStatusError` when Redis fails (a partial sweep is safe to run again).
    """
    started = time.monotonic()
    skipped: list[str] = []
    leases = {info.participant: info for info in list_leases(client, schema, on_corrupt=skipped.append)}
    every_lost = sorted(name for name, info in leases.items() if info.lost)
    lost, not_swept, other_lost = every_lost, {}, []
    if participants is not None:
        named = set(participants)
        lost = [name for name in every_lost if name in named]
        other_lost = [name for name in every_lost if name not in named]
        not_swept = {
            name: leases[name].state if name in leases else "no lease record"
            for name in dict.fromkeys(participants)
            if name not in lost
        }
    result = SweepResult(
        lost=lost, by_participant={name: 0 for name in lost}, not_swept=not_swept, other_lost=other_lost
    )
    for message in skipped:
        result.skip(message)
    if not lost:
        result.seconds = time.monotonic() - started
        return result
    store = StatusStore(client, namespace=schema.namespace, prefix=schema.prefix)
    chunks = [lost[i : i + MAX_PARTICIPANTS] for i in range(0, len(lost), MAX_PARTICIPANTS)]
    for keys in iter_room_keys(client, schema, batch):
        rooms = [room for room in map(schema.room_of, keys) if room is not None]
        swept_rooms: set[int] = set()
        for names in chunks:
            for entries in _read(store, rooms, names, result):
                _sweep_entries(store, entries, result, swept_rooms)
        result.rooms += len(swept_rooms)
        result.scanned += len(keys)
        if progress is not None:
            progress(result.scanned)
    result.seconds = time.monotonic() - started
    return result


def _read(store: StatusStore, rooms: list[int], names: list[str], result: SweepResult) -> list[Entries]:
    """The entries of ``names`` in ``rooms``: one read, or, when one of the keys holds what kvstatus does not write,
    one read per room, the unreadable rooms skipped and counted in ``result``."""
    try:
        return [store._send(entries_request(store._core, rooms, names))]
    except CorruptedValueError:
        pass
    found = []
    for room in rooms:
        try:
            found.append(store._send(entries_request(store._core, [room], names)))
        except CorruptedValueError as exc:
            result.skip(f"room {room} (key {store._core.schema.room_key(room)}): {exc}")
    return found


def _sweep_entries(store: StatusStore, entries: Entries, result: SweepResult, swept_rooms: set[int]) -> None:
    """Fail the open entries of each lost participant of ``entries``; one that cannot be swept is counted."""
    for j, name in enumerate(entries.names):
        if entries.leases[j] != LeaseState.LOST:
            continue  # it holds a lease again (a new incarnation): leave it alone
        targets = [room for i, room in enumerate(entries.rooms) if entries.statuses(i)[j] in OPEN]
        if not targets:
            continue
        # The fence: an entry stamped by a later incarnation (it took the name over after this read) stays.
        below = entries.epochs[j] + 1 if entries.epochs[j] else None
        request = fail_entries_request(store._core, targets, name, Stage.LEASE_LOST, lost_reason(name), below)
        try:
            outcomes = store._send(request)
        except CorruptedValueError as exc:  # a room turned into junk since the read: the others still go
            result.skip(f"participant {name}'s rooms {targets[:3]}{'...' if len(targets) > 3 else ''}: {exc}")
            continue
        for room, outcome in zip(targets, outcomes):
            if outcome is Outcome.FAILED:
                result.swept += 1
                result.by_participant[name] += 1
                swept_rooms.add(room)
            else:
                result.raced += 1
