"""``./dev python -m benchmarks.metrics``: the per-call cost of the library metrics observer (budget <= 2 us per call).

Each hook of :class:`kvstatus.observe.metrics.StoreMetrics` is timed in a
tight loop (best of ``--repeat`` runs of ``--number`` calls), next to what a
store pays with metrics off (one ``is not None`` test). "update_status total"
is what one update_status costs with metrics on: ``on_call`` + ``on_update``.
Prints microseconds per call; exits 1 if a per-call total exceeds the budget.

Then the same through a real store call, metrics off and on side by side
(``StatusStore(..., metrics=StoreMetrics(...))``, interleaved ABAB): once on a
client stub that answers at once (the store's own Python, no network: what
the wiring adds is the difference), and once on a redis-server on loopback
(``--no-server`` skips it).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import timeit
from typing import Callable, Optional

import redis
from prometheus_client import CollectorRegistry

from benchmarks.measure import Summary, interleave, time_calls
from kvstatus import StatusStore
from kvstatus.errors import BackendUnavailableError
from kvstatus.model import KVPoll, Outcome, UpdateResult
from kvstatus.observe.metrics import StoreMetrics
from tests.servers import RedisServer

BUDGET_US = 2.0


def per_call_us(call: Callable[[], object], number: int, repeat: int) -> float:
    """Best-of-``repeat`` microseconds per call of ``call``."""
    return min(timeit.repeat(call, number=number, repeat=repeat)) / number * 1e6


def cases(metrics: Optional[StoreMetrics]) -> dict[str, Callable[[], object]]:
    result = UpdateResult(Outcome.ADVANCED, KVPoll.Transferring)
    error = BackendUnavailableError("Redis at 127.0.0.1:1 is unreachable")
    if metrics is None:
        off: Optional[StoreMetrics] = None

        def update_off() -> None:  # what the send loop does with metrics off
            if off is not None:
                off.on_call("update_status", 0.0001)
                off.on_update(result)

        return {"update_status total (metrics off)": update_off}
    m = metrics

    def update_on() -> None:
        if m is not None:
            m.on_call("update_status", 0.0001)
            m.on_update(result)

    return {
        "on_update": lambda: m.on_update(result),
        "on_call": lambda: m.on_call("update_status", 0.0001),
        "on_error": lambda: m.on_error(error),
        "on_resend": m.on_resend,
        "on_cache_hit": m.on_cache_hit,
        "set_cache_size": lambda: m.set_cache_size(10),
        "update_status total (metrics on)": update_on,
    }


class AnsweringClient:
    """A stand-in for redis.Redis that answers every command at once: an update UNCHANGED, a get Bootstrapping."""

    def execute_command(self, *args: object) -> object:
        return [4, 1] if args[0] == "EVALSHA" else b"1"


def store_calls(client: object, rounds: int, number: int) -> dict[str, Summary]:
    """p50/p99 of update_status and get through stores with metrics off and on, on ``client``, interleaved."""
    off = StatusStore(client, namespace="bench", participant="prefill-0")
    on = StatusStore(
        client,
        namespace="bench",
        participant="prefill-0",
        metrics=StoreMetrics("bench", "prefill-0", CollectorRegistry()),
    )
    for store in (off, on):
        store.update_status(1, KVPoll.Bootstrapping)
    blocks = {}
    for name, store in (("off", off), ("on", on)):
        blocks[f"update_status, metrics {name}"] = lambda s=store: time_calls(
            lambda i: s.update_status(1, KVPoll.Bootstrapping), number
        )
        blocks[f"get, metrics {name}"] = lambda s=store: time_calls(lambda i: s.get(1), number)
    return interleave(blocks, rounds)


def report_store_calls(title: str, summaries: dict[str, Summary]) -> float:
    """Print the side-by-side table; return the largest on - off difference of the p50s, in microseconds."""
    print(f"\n{title}")
    print(f"{'call':<16} {'off p50':>9} {'on p50':>9} {'on - off':>9}   (us)")
    worst = 0.0
    for call in ("update_status", "get"):
        off, on = summaries[f"{call}, metrics off"], summaries[f"{call}, metrics on"]
        extra = statistics.median(b - a for a, b in zip(off.round_p50s_us, on.round_p50s_us))
        worst = max(worst, extra)
        print(f"{call:<16} {off.p50_us:>9.2f} {on.p50_us:>9.2f} {extra:>+9.2f}")
    return worst


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.metrics", description=__doc__)
    parser.add_argument("--number", type=int, default=200_000, help="calls per timed run")
    parser.add_argument("--repeat", type=int, default=7, help="timed runs; the best is reported")
    parser.add_argument("--no-server", action="store_true", help="skip the store calls on a redis-server")
    args = parser.parse_args(argv)
    metrics = StoreMetrics("bench", "prefill-0", CollectorRegistry())
    rows = {**cases(None), **cases(metrics)}
    batch = [UpdateResult(Outcome(1 + i % 7), None) for i in range(1000)]
    over = []
    print(f"{'hook':<36} {'us/call':>8}")
    for name, call in rows.items():
        us = per_call_us(call, args.number, args.repeat)
        print(f"{name:<36} {us:>8.3f}")
        if us > BUDGET_US:
            over.append(name)
    us = per_call_us(lambda: metrics.on_updates(batch), max(args.number // 1000, 10), args.repeat)
    print(f"{'on_updates, 1000 results':<36} {us:>8.1f}  ({us / 1000:.3f} per result)")
    extra = report_store_calls(
        "store call, metrics off vs on, client answering at once (no network)",
        store_calls(AnsweringClient(), args.repeat, max(args.number // 10, 1000)),
    )
    if extra > BUDGET_US:
        over.append("store call with metrics on")
    if not args.no_server:
        with RedisServer(extra_args=["--save", "", "--appendonly", "no"]) as server:
            client = redis.Redis(host=server.host, port=server.port)
            report_store_calls(
                "store call, metrics off vs on, redis-server on loopback (network noise included)",
                store_calls(client, args.repeat, max(args.number // 100, 500)),
            )
            client.close()
    if over:
        print(f"over the {BUDGET_US} us budget: {', '.join(over)}", file=sys.stderr)
        return 1
    print(f"every per-call hook is within the {BUDGET_US} us budget")
    return 0


if __name__ == "__main__":
    sys.exit(main())
