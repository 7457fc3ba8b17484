"""Interleaved timing: every variant of a comparison runs in alternating blocks (ABAB...).

Times are nanoseconds from :func:`time.perf_counter_ns`. A *block* is one
variant's samples in one round. A ratio is the median over rounds of the two
variants' p50s *in the same round* (:func:`ratio`): on a shared box the round
trip itself can double from one second to the next, and blocks that ran back
to back saw the same box.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

Block = Callable[[], list[int]]


def time_calls(call: Callable[[int], object], n: int) -> list[int]:
    """Latency of ``call(i)`` for i in range(n), one sample per call, in nanoseconds."""
    clock = time.perf_counter_ns
    samples = [0] * n
    for i in range(n):
        start = clock()
        call(i)
        samples[i] = clock() - start
    return samples


def percentile(samples: Sequence[float], fraction: float) -> float:
    ordered = sorted(samples)
    return float(ordered[min(len(ordered) - 1, int(fraction * len(ordered)))])


@dataclass(frozen=True)
class Summary:
    """Medians over rounds of each round's p50 and p99, in microseconds."""

    p50_us: float
    p99_us: float
    rounds: int
    samples: int
    round_p50s_us: tuple[float, ...] = ()

    @property
    def per_second(self) -> float:
        """Calls per second at the median p50 (sequential, one caller)."""
        return 1e6 / self.p50_us


def interleave(blocks: Mapping[str, Block], rounds: int) -> dict[str, Summary]:
    """Run each block once per round, in a rotating order, and summarise each variant."""
    names = list(blocks)
    per_round: dict[str, list[list[int]]] = {name: [] for name in names}
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            gc.collect()
            per_round[name].append(blocks[name]())
    return {name: summarise(rounds_) for name, rounds_ in per_round.items()}


def summarise(rounds: list[list[int]]) -> Summary:
    p50s = tuple(percentile(s, 0.50) / 1000 for s in rounds)
    p99 = statistics.median(percentile(s, 0.99) for s in rounds) / 1000
    return Summary(statistics.median(p50s), p99, len(rounds), sum(len(s) for s in rounds), p50s)


def ratio(a: Summary, b: Summary) -> float:
    """Median over rounds of a's p50 / b's p50 in the same round: the two ran back to back on the same box state."""
    return statistics.median(x / y for x, y in zip(a.round_p50s_us, b.round_p50s_us))
