"""Wall-clock margins that scale with how loaded the box is (issue 35 item 4).

A test whose behaviour *is* timing (a call gives up at its deadline, a lease is seen lost after its TTL) bounds
what it measures by the behaviour's own time plus :func:`slack`, never by a fixed number of seconds: on a
loaded 2-core box (two CPU-bound processes beside the suite) a fixed 2 s slack failed. The bounds stay far
below what each bug they guard against cost (tens of seconds, or forever).
"""

from __future__ import annotations

import os
import time

_PROBE_ITERATIONS = 20_000
_quiet: list[float] = []


def _probe() -> float:
    """Seconds a fixed piece of pure-Python work takes right now."""
    started = time.perf_counter()
    total = 0
    for i in range(_PROBE_ITERATIONS):
        total += i * i
    return time.perf_counter() - started


def load_factor() -> float:
    """How many times slower than quiet this process runs now (at least 1): the larger of the 1-minute load
    average per core and a short probe's time against the fastest probe this process has seen."""
    now = min(_probe() for _ in range(3))
    _quiet.append(now)
    fastest = min(_quiet)
    by_probe = now / fastest if fastest > 0 else 1.0
    by_load = os.getloadavg()[0] / (os.cpu_count() or 1)
    return max(1.0, by_probe, by_load)


def slack(seconds: float) -> float:
    """``seconds`` of slack on a quiet box, scaled by :func:`load_factor` (and doubled: scheduling is bursty)."""
    return seconds * 2 * load_factor()
