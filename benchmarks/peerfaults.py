"""Time to fail, participants in separate processes: ``./dev python -m benchmarks.peerfaults [--trials N]``.

Issue 16's fault matrix (:mod:`kvstatus.demo.faults` has the trials: kill a prefill mid-transfer, kill a
decode while it waits, kill a prefill that never wrote the room the decode waits on it for, restart a prefill
under the same name, cancel from a third process with the near
cache off and on, SIGSTOP a peer for 2/3 of its lease TTL), ``--trials`` of each (default 20) on a throwaway
redis-server and, with ``--cluster``, on a 3-master cluster. For each: p50 and p99 of the time until the
survivor's poll answers Failed, the causes it saw, and what SGLang alone does. Markdown on stdout.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

from benchmarks.measure import percentile
from benchmarks.report import markdown_table
from kvstatus.demo.faults import FAULTS, UPSTREAM, run_trial
from tests.servers import RedisClusterServers, RedisServer

NO_PERSISTENCE = ["--save", "", "--appendonly", "no"]


def measure(url: str, where: str, trials: int, ttl: float, faults: list[str]) -> list[list[str]]:
    rows = []
    for fault in faults:
        times: list[float] = []
        causes: Counter[str] = Counter()
        never = 0
        for i in range(trials):
            trial = run_trial(url, f"faults-{os.getpid()}-{fault}-{i}", 1_000_000 + i, fault, ttl)
            causes[trial.cause] += 1
            if trial.seconds is None:
                never += 1
            else:
                times.append(trial.seconds)
            print(f"  {where} {fault} #{i}: {trial.seconds} s ({trial.cause})", file=sys.stderr, flush=True)
        cause = "; ".join(f"{text} ({n})" for text, n in causes.most_common())
        if fault == "pause":
            rows.append([where, fault, f"**{len(times)} false failures** in {trials}", "-", cause, UPSTREAM[fault]])
            continue
        p50 = f"{statistics.median(times):.2f} s" if times else "-"
        p99 = f"{percentile(times, 0.99):.2f} s" if times else "-"
        rows.append([where, fault, p50, p99 + (f" ({never} never failed)" if never else ""), cause, UPSTREAM[fault]])
    return rows


@contextmanager
def _targets(cluster: bool) -> Iterator[list[tuple[str, str]]]:
    with RedisServer(extra_args=NO_PERSISTENCE) as server:
        if not cluster:
            yield [("single Redis", server.url)]
            return
        with RedisClusterServers(masters=3, node_timeout_ms=15_000) as nodes:
            host, port = nodes.startup_nodes[0]
            yield [("single Redis", server.url), ("3-master cluster", f"redis+cluster://{host}:{port}")]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.peerfaults", description=__doc__)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--lease-ttl", type=float, default=3.0, help="seconds (the SGLang plugin's default is 10)")
    parser.add_argument("--cluster", action="store_true", help="also on a 3-master cluster")
    parser.add_argument("--faults", default=",".join(FAULTS))
    args = parser.parse_args(argv)
    rows: list[list[str]] = []
    with _targets(args.cluster) as targets:
        for where, url in targets:
            rows += measure(url, where, args.trials, args.lease_ttl, args.faults.split(","))
    print(f"lease TTL {args.lease_ttl:g} s, {args.trials} trials per fault, the survivor polling every 5 ms\n")
    header = ["Redis", "fault", "p50 to Failed", "p99 to Failed", "cause the survivor sees (trials)", "SGLang alone"]
    print(markdown_table(header, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
