"""How long the open rooms have been waiting, from their timelines (pure Python; the exporter's pass fills it).

For every room still open (an open entry, no first failure) whose entries record timelines
(:mod:`kvstatus.timeline`): the age of the oldest room per open status (now minus the room's first step,
for each status one of its open entries holds), and a histogram of the seconds each open entry has sat in
its current status (:func:`kvstatus.timeline.since_current`), per status. Times at Redis' clock.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

from kvstatus.model import OPEN, KVPoll, RoomView
from kvstatus.timeline import current_steps, since_current

OPEN_STATUSES: tuple[KVPoll, ...] = tuple(sorted(OPEN))
BUCKETS: tuple[float, ...] = (0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, math.inf)
"""Upper bounds (seconds) of the time-in-status histogram: 10 buckets, so 12 series per open status."""


@dataclass
class OpenTimes:
    """``oldest``: seconds per open status (0 when none); ``counts`` per status per bucket (not cumulative)."""

    oldest: dict[KVPoll, float] = field(default_factory=lambda: dict.fromkeys(OPEN_STATUSES, 0.0))
    counts: dict[KVPoll, list[int]] = field(default_factory=lambda: {s: [0] * len(BUCKETS) for s in OPEN_STATUSES})
    sums: dict[KVPoll, float] = field(default_factory=lambda: dict.fromkeys(OPEN_STATUSES, 0.0))

    def add(self, view: RoomView, now_ms: int) -> None:
        if view.failure is not None:
            return
        firsts = [steps[0].at_ms for steps in view.timelines.values() if steps]
        if not firsts:
            return
        age = max(0, now_ms - min(firsts)) / 1000
        for name, entry in view.participants.items():
            status = entry.status
            if status is None or status not in OPEN:
                continue
            self.oldest[status] = max(self.oldest[status], age)
            seconds = since_current(current_steps(view.timelines.get(name, ()), status), now_ms)
            if seconds is not None:
                self.counts[status][bisect.bisect_left(BUCKETS, seconds)] += 1
                self.sums[status] += seconds

    def cumulative(self, status: KVPoll) -> list[tuple[str, float]]:
        """Prometheus' (le, cumulative count) pairs of ``status``."""
        total, found = 0, []
        for bound, count in zip(BUCKETS, self.counts[status]):
            total += count
            found.append(("+Inf" if math.isinf(bound) else f"{bound:g}", float(total)))
        return found
