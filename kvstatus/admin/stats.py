"""Counting and auditing the rooms of a namespace (``kvstatus stats``), without the CLI.

One pass over :func:`kvstatus.admin.reads.iter_rooms`; memory is bounded by the
number of distinct participants and the ``oldest`` heap, not by the rooms.
"""

from __future__ import annotations

import heapq
from bisect import insort
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Optional

from kvstatus.admin.reads import DEFAULT_BATCH, Deaths, Progress, iter_rooms, read_deaths, server_ms
from kvstatus.keys import KeySchema
from kvstatus.model import OPEN, KVPoll, RoomView
from kvstatus.rule import reads
from kvstatus.stuck import DEFAULT_OLDER_THAN_SECONDS, stuck

TERMINAL = frozenset({KVPoll.Success, KVPoll.Failed})

# Upper bounds (seconds) of the TTL-left buckets; the last bucket is "more".
TTL_BUCKETS = (10, 60, 300, 600)


def ttl_bucket(ttl_ms: Optional[int]) -> str:
    """The label of the TTL-left bucket for ``ttl_ms`` (milliseconds; None: no TTL)."""
    if ttl_ms is None:
        return "no TTL"
    seconds = ttl_ms / 1000
    low = 0
    for high in TTL_BUCKETS:
        if seconds <= high:
            return f"{low}-{high}s"
        low = high
    return f">{low}s"


def bucket_labels() -> list[str]:
    labels, low = [], 0
    for high in TTL_BUCKETS:
        labels.append(f"{low}-{high}s")
        low = high
    return labels + [f">{low}s", "no TTL"]


@dataclass
class Stats:
    """What one pass over a namespace found.

    ``oldest`` lists the non-terminal rooms (some entry neither Success nor
    Failed) with the least TTL left: every write refreshes the TTL, so they are
    the ones that went longest without progress. ``ttl_ms`` values are milliseconds.

    ``stuck_rooms`` counts the rooms :func:`kvstatus.stuck.stuck` judges stuck for ``stuck_older_than_s``
    seconds or more at the pass's start (Redis' clock), ``stuck_by_holder`` by the participant (or
    ``"<role> (no entry)"``) holding each back; ``rooms_without_timeline`` the open rooms it cannot judge
    (no entry records a timeline). ``stuck_older_than_s`` is None when the pass did not judge (no clock given).
    """

    rooms: int = 0
    entries: int = 0
    by_status: Counter = field(default_factory=Counter)
    by_participant: dict[str, Counter] = field(default_factory=dict)
    ttl_left: Counter = field(default_factory=Counter)
    keys_without_ttl: int = 0
    keys_without_ttl_sample: list[int] = field(default_factory=list)
    oldest: list[RoomView] = field(default_factory=list)
    corrupted_rooms: int = 0
    corrupted_sample: list[str] = field(default_factory=list)
    lost_participants: list[str] = field(default_factory=list)
    rooms_on_lost_participants: int = 0
    stuck_older_than_s: Optional[float] = None
    stuck_rooms: int = 0
    stuck_by_holder: Counter = field(default_factory=Counter)
    stuck_dead_holders: list[str] = field(default_factory=list)  # sorted
    rooms_without_timeline: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "rooms": self.rooms,
            "entries": self.entries,
            "by_status": {s.name: self.by_status.get(s, 0) for s in KVPoll},
            "by_participant": {
                p: {s.name: c.get(s, 0) for s in KVPoll} for p, c in sorted(self.by_participant.items())
            },
            "ttl_left": {label: self.ttl_left.get(label, 0) for label in bucket_labels()},
            "keys_without_ttl": self.keys_without_ttl,
            "keys_without_ttl_sample": self.keys_without_ttl_sample,
            "corrupted_rooms": self.corrupted_rooms,
            "corrupted_sample": self.corrupted_sample,
            "lost_participants": self.lost_participants,
            "rooms_on_lost_participants": self.rooms_on_lost_participants,
            "stuck_older_than_s": self.stuck_older_than_s,
            "stuck_rooms": self.stuck_rooms,
            "stuck_by_holder": dict(sorted(self.stuck_by_holder.items())),
            "stuck_dead_holders": self.stuck_dead_holders,
            "rooms_without_timeline": self.rooms_without_timeline,
            "oldest_non_terminal": [
                {
                    "room": v.room,
                    "ttl_ms": v.ttl_ms,
                    "statuses": {n: None if s is None else s.name for n, s in reads(v).items()},
                }
                for v in self.oldest
            ],
        }


def is_terminal(view: RoomView) -> bool:
    """True when every entry reads Success or Failed (:func:`kvstatus.rule.reads`: a room that failed is done)."""
    return all(status in TERMINAL for status in reads(view).values())


def without_timeline(view: RoomView) -> bool:
    """True for a room :func:`kvstatus.stuck.stuck` cannot judge: an open entry, no first failure, and no entry
    recording a timeline (its writers run without ``timeline=True``)."""
    return (
        view.failure is None
        and any(entry.status in OPEN for entry in view.participants.values())
        and not any(view.timelines.values())
    )


class StatsBuilder:
    """Builds a :class:`Stats` one room at a time; :func:`collect_stats` and incremental passes share it."""

    def __init__(
        self,
        *,
        oldest: int = 5,
        sample: int = 10,
        deaths: Deaths = Deaths(),
        now_ms: Optional[int] = None,
        older_than: float = DEFAULT_OLDER_THAN_SECONDS,
    ) -> None:
        """``now_ms``: Redis' clock (Unix ms) at the pass's start, to judge stuck rooms; None judges none.
        ``deaths``: the leases, to count and name the rooms dead or restarted participants left."""
        self.stats = Stats(lost_participants=deaths.lost, stuck_older_than_s=None if now_ms is None else older_than)
        self._deaths = deaths
        self._now_ms = now_ms
        self._older_than = older_than
        self._oldest = oldest
        self._sample = sample
        self._heap: list[tuple[int, int, RoomView]] = []  # (-ttl_ms, room, view): the `oldest` smallest TTLs

    def corrupt(self, room: int, message: str) -> None:
        """Count a room holding a value kvstatus does not write (keeping up to ``sample`` messages)."""
        stats = self.stats
        stats.corrupted_rooms += 1
        if len(stats.corrupted_sample) < self._sample:
            stats.corrupted_sample.append(message)

    def add(self, view: RoomView) -> None:
        stats = self.stats
        stats.rooms += 1
        for name, status in reads(view).items():
            if status is None:
                continue
            stats.entries += 1
            stats.by_status[status] += 1
            stats.by_participant.setdefault(name, Counter())[status] += 1
        left = self._deaths.left(view)
        if left:
            stats.rooms_on_lost_participants += 1  # stuck: an open entry whose participant is gone
        if self._now_ms is not None:
            found = stuck(view, self._now_ms, self._older_than, left)
            if found is not None:
                stats.stuck_rooms += 1
                stats.stuck_by_holder[found.holder] += 1
                if found.dead and found.holder not in stats.stuck_dead_holders:
                    insort(stats.stuck_dead_holders, found.holder)
            elif without_timeline(view):
                stats.rooms_without_timeline += 1
        stats.ttl_left[ttl_bucket(view.ttl_ms)] += 1
        if view.ttl_ms is None:
            stats.keys_without_ttl += 1
            if len(stats.keys_without_ttl_sample) < self._sample:
                stats.keys_without_ttl_sample.append(view.room)
        elif self._oldest > 0 and not is_terminal(view):
            heap = self._heap
            item = (-view.ttl_ms, view.room, view)
            if len(heap) < self._oldest:
                heapq.heappush(heap, item)
            elif item > heap[0]:
                heapq.heapreplace(heap, item)

    def finish(self) -> Stats:
        self.stats.oldest = [view for _, _, view in sorted(self._heap, reverse=True)]
        return self.stats


def collect_stats(
    client: Any,
    schema: KeySchema,
    *,
    oldest: int = 5,
    sample: int = 10,
    batch: int = DEFAULT_BATCH,
    progress: Optional[Progress] = None,
    older_than: float = DEFAULT_OLDER_THAN_SECONDS,
) -> Stats:
    """Count rooms by status and participant and audit TTLs in one SCAN pass.

    Rooms holding values kvstatus does not write are counted as corrupted
    (with up to ``sample`` messages) instead of stopping the audit. Rooms with
    an open entry a dead participant left (its lease is lost, or it restarted under the same name:
    :meth:`~kvstatus.admin.reads.Deaths.left`) are counted as stuck (``rooms_on_lost_participants``; the
    lease records are read first), and held by the dead one. Rooms whose timelines have not moved
    for ``older_than`` seconds are counted by holder (``stuck_by_holder``), judged at Redis' clock read once
    before the scan.
    """
    deaths = read_deaths(client, schema)
    builder = StatsBuilder(oldest=oldest, sample=sample, deaths=deaths, now_ms=server_ms(client), older_than=older_than)
    for view in iter_rooms(client, schema, batch, progress, builder.corrupt):
        builder.add(view)
    return builder.finish()
