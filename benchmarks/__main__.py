"""``./dev bench``: run every benchmark and refresh the results section of BENCHMARKS.md."""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import capacity, cases
from benchmarks.cases import Plan, Results, RoomSource
from benchmarks.report import machine, render, write
from kvstatus.connection import connect
from kvstatus.errors import InvalidURLError
from tests.servers import RedisClusterServers, RedisServer

ROOT = Path(__file__).resolve().parent.parent
NO_PERSISTENCE = ["--save", "", "--appendonly", "no"]


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="./dev bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run of every case (~15 s)")
    parser.add_argument("--rounds", type=int, help="interleaved rounds per comparison (default 9, quick 3)")
    parser.add_argument("--no-cluster", action="store_true", help="skip the 3-master cluster run")
    parser.add_argument("--no-write", action="store_true", help="print the results, leave BENCHMARKS.md alone")
    parser.add_argument("--output", type=Path, default=ROOT / "BENCHMARKS.md", help="file whose results to refresh")
    return parser.parse_args(argv)


def plan_for(args: argparse.Namespace) -> Plan:
    if args.quick:
        plan = Plan(samples=300, rounds=3, batches=4, levels=(1_000, 10_000), memory_rooms=10_000)
    else:
        plan = Plan()
    if args.rounds:
        plan = Plan(plan.samples, args.rounds, plan.batches, plan.levels, plan.memory_rooms)
    return plan


def run(args: argparse.Namespace) -> Results:
    plan = plan_for(args)
    rooms = RoomSource()
    results = Results()

    def step(what: str, got: Results) -> None:
        print(f"  {what}: done", file=sys.stderr, flush=True)
        results.rows += got.rows
        results.budgets += got.budgets
        results.notes += got.notes

    with RedisServer(extra_args=NO_PERSISTENCE) as server:
        client = connect(server.url)
        step("single key", cases.single_key(client, plan, rooms))
        step("batches", cases.batches(client, plan, rooms))
        step("async vs sync", capacity.async_vs_sync(server.url, client, plan, rooms))
        step("memory", capacity.memory_per_room(client, plan, rooms))
        step("shard capacity", capacity.shard_capacity(server.port, 20_000 if args.quick else 200_000))
        client.close()
    with contextlib.ExitStack() as stack:
        servers = [stack.enter_context(RedisServer(extra_args=NO_PERSISTENCE)) for _ in plan.levels]
        clients = [connect(server.url) for server in servers]
        step("live rooms", capacity.scaling(clients, plan, rooms))
        for client in clients:
            client.close()
    step("dict reference", capacity.dict_reference(plan))
    step("client code", capacity.client_overhead(plan))
    if not args.no_cluster:
        with RedisClusterServers(masters=3, extra_args=NO_PERSISTENCE) as cluster:
            client = _cluster_client(cluster)
            step("cluster", capacity.cluster(client, cluster, plan, rooms))
            client.close()
    return results


def _cluster_client(cluster: RedisClusterServers) -> Any:
    """The store's own client for ``redis+cluster://`` URLs, or redis-py's where that scheme is not built in yet."""
    try:
        return connect(cluster.url)
    except InvalidURLError:
        return cluster.client()


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    command = "./dev bench" + (" " + " ".join(argv) if argv else "")
    host = machine()
    start = time.monotonic()
    results = run(args)
    body = render(results, host, command, time.monotonic() - start)
    print(body)
    if not args.no_write:
        write(args.output, body)
        print(f"results written to {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
