"""SGLang's scheduler poll loop on kvstatus: ``./dev python -m benchmarks.sglang_poll [--iterations N]``.

1. "Poll 256 rooms, 100 iterations", as ``CommonKVSender._poll_with_status``
   does it (``room in request_status``, then ``check_status``), with
   upstream's own methods on its dict (the floor), through the SGLang plugin's
   defaults (the near cache: no round trip while the rooms do not change), and
   with the near cache off (two round trips a poll: ``in``, then ``check_status``).
2. PP rank 0's consensus read of 256 rooms (``check_status_pp_consensus``,
   4 ranks): kvstatus at the plugin's defaults and with the near cache off
   (one round trip a room; its poll, two), against the real ``PPConsensusStore``.
   That needs sglang: run in a Python that has it, or let this script call the
   cached ``./dev test-sglang`` venv.

Every variant runs in interleaved rounds on one embedded redis-server
(persistence off); the table shows medians over rounds. Markdown on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

from benchmarks.report import markdown_table
from kvstatus import KVPoll
from kvstatus.connection import connect
from kvstatus.sglang import install
from kvstatus.sglang.plugin import ENV_NAMESPACE, ENV_URL, install_from_env
from tests.servers import RedisServer
from tests.sglang.standin import make_manager

ROOT = Path(__file__).resolve().parent.parent
ROOMS = 256
PP = 4
PLUGIN_DEFAULTS = "kvstatus, the SGLang plugin's defaults (10 s lease, shared fate, near cache)"
SGLANG_VENV = Path(os.environ.get("KVSTATUS_TEST_SGLANG_VENV", Path.home() / ".cache/kvstatus/sglang-venv"))


def poll_loop(manager: Any, rooms: list[int], check: Optional[Callable[[int], Any]] = None) -> Callable[[], None]:
    """One scheduler iteration: every room polled as ``_poll_with_status`` does."""
    check = check or manager.check_status

    def iteration() -> None:
        rs = manager.request_status
        for room in rooms:
            status = check(room) if room in rs else KVPoll.Failed
            assert status != KVPoll.Failed

    return iteration


def timed_rounds(variants: dict[str, Callable[[], None]], iterations: int, rounds: int) -> dict[str, float]:
    """Median over ``rounds`` of the seconds ``iterations`` calls of each variant take (interleaved)."""
    results: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            start = time.perf_counter()
            for _ in range(iterations):
                variants[name]()
            results[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in results.items()}


def seeded(manager: Any, rooms: list[int], status: int = KVPoll.Transferring) -> Any:
    for room in rooms:
        manager.update_status(room, KVPoll.Bootstrapping)
        manager.update_status(room, status)
    return manager


def poll_benchmark(url: str, iterations: int, rounds: int) -> list[list[str]]:
    rooms = list(range(10_000, 10_000 + ROOMS))
    upstream = seeded(make_manager(), rooms)
    plugin = make_manager()
    install_from_env(plugin, {ENV_URL: url, ENV_NAMESPACE: "bench-sgl-plugin"})
    uncached = make_manager()
    install(uncached, url, namespace="bench-sgl-uncached", near_cache=False)
    variants = {
        "upstream's methods on its dict": poll_loop(upstream, rooms),
        PLUGIN_DEFAULTS: poll_loop(seeded(plugin, rooms), rooms),
        "kvstatus, near cache off (2 round trips a poll)": poll_loop(seeded(uncached, rooms), rooms),
    }
    times = timed_rounds(variants, iterations, rounds)
    for manager in (plugin, uncached):
        manager.request_status.close()  # its lease keeper stops with it
    base = times["upstream's methods on its dict"]
    return [
        [name, f"{t * 1e3:,.1f}", f"{t / (iterations * ROOMS) * 1e6:,.3f}", f"{t / base:,.2f}x"]
        for name, t in times.items()
    ]


def kvstatus_consensus(url: str, iterations: int, rounds: int, plugin: bool = True) -> dict[str, float]:
    """Seconds for rank 0 to read the consensus of 256 rooms, median over rounds; 4 ranks, one client each.
    ``plugin``: each rank installed as the SGLang plugin installs it, at its defaults (a 10 s lease, the near
    cache); else by ``install()`` with the near cache off."""
    rooms = list(range(20_000, 20_000 + ROOMS))
    managers = [make_manager(pp_rank=r, pp_size=PP) for r in range(PP)]
    namespace = f"bench-sgl-pp{'-plugin' if plugin else '-uncached'}"
    for m in managers:
        if plugin:
            install_from_env(m, {ENV_URL: url, ENV_NAMESPACE: namespace})
        else:
            install(m, url, namespace=namespace, near_cache=False)
        seeded(m, rooms)
    rank0 = managers[0]

    def consensus() -> None:
        for room in rooms:
            assert rank0.check_status_pp_consensus(room) == KVPoll.Transferring

    def batched() -> None:
        for statuses in rank0.request_status.collect_many(rooms).values():
            assert min(statuses) == KVPoll.Transferring

    times = timed_rounds(
        {"consensus": consensus, "poll": poll_loop(rank0, rooms, rank0.check_status_pp_consensus), "batched": batched},
        iterations,
        rounds,
    )
    for m in managers:
        m.request_status.close()
    return {name: t / iterations for name, t in times.items()}


def upstream_consensus(iterations: int, rounds: int) -> dict[str, float]:
    """Seconds for the real PPConsensusStore's rank 0 to read 256 rooms' consensus (its peer maps filled)."""
    from sglang.srt.disaggregation.common.conn import CommonKVManager
    from sglang.srt.disaggregation.pp_consensus_store import PPConsensusStore

    rooms = list(range(20_000, 20_000 + ROOMS))
    store = object.__new__(PPConsensusStore)  # rank 0's view; its ZMQ thread only fills _peer_map
    store._pp_size, store._pp_rank, store._cache_lock = PP, 0, threading.Lock()
    store._local_map = {room: int(KVPoll.Transferring) for room in rooms}
    store._peer_map = {r: dict(store._local_map) for r in range(1, PP)}
    manager = object.__new__(CommonKVManager)
    manager.request_status = store

    def collect() -> None:
        for room in rooms:
            store.collect(room)

    def consensus() -> None:
        for room in rooms:
            assert manager.check_status_pp_consensus(room) == KVPoll.Transferring

    poll = poll_loop(manager, rooms, manager.check_status_pp_consensus)
    times = timed_rounds({"collect": collect, "consensus": consensus, "poll": poll}, iterations, rounds)
    return {name: t / iterations for name, t in times.items()}


def upstream_consensus_anywhere(iterations: int, rounds: int) -> Optional[dict[str, float]]:
    """:func:`upstream_consensus` here if sglang imports, else in the cached sglang venv, else None."""
    try:
        return upstream_consensus(iterations, rounds)
    except ImportError:
        pass
    python = SGLANG_VENV / "bin" / "python"
    if not python.exists():
        return None
    result = subprocess.run(
        [
            str(python),
            "-W",
            "ignore",
            "-m",
            "benchmarks.sglang_poll",
            "--upstream-pp-json",
            "--iterations",
            str(iterations),
            "--rounds",
            str(rounds),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if result.returncode != 0:
        print(f"sglang_poll: the sglang venv failed: {result.stderr[-500:]}", file=sys.stderr)
        return None
    return json.loads(result.stdout.strip().splitlines()[-1])


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.sglang_poll", description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=100, help="scheduler iterations per round [100]")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds; the median is shown [5]")
    parser.add_argument("--upstream-pp-json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.upstream_pp_json:
        print(json.dumps(upstream_consensus(args.iterations, args.rounds)))
        return
    with RedisServer(extra_args=["--save", "", "--appendonly", "no"]) as server:
        print(f"sglang_poll: redis-server on {server.host}:{server.port}", file=sys.stderr)
        poll_rows = poll_benchmark(server.url, args.iterations, args.rounds)
        defaults = kvstatus_consensus(server.url, args.iterations, args.rounds)
        uncached = kvstatus_consensus(server.url, args.iterations, args.rounds, plugin=False)
        connect(server.url).flushall()
    theirs = upstream_consensus_anywhere(args.iterations, args.rounds)
    print(f"### Scheduler poll loop: {ROOMS} rooms x {args.iterations} iterations (median of {args.rounds} rounds)\n")
    print(markdown_table(["implementation", "100 iterations (ms)", "per poll (µs)", "vs upstream"], poll_rows))
    print(f"\n### PP rank 0: consensus of {ROOMS} rooms over {PP} ranks (one scheduler iteration)\n")
    rows = [
        [f"{PLUGIN_DEFAULTS}: `check_status_pp_consensus` (0 round trips)", defaults["consensus"], "consensus"],
        [f"{PLUGIN_DEFAULTS}: poll (`in` + consensus, 0 round trips)", defaults["poll"], "poll"],
        [f"{PLUGIN_DEFAULTS}: `collect_many`", defaults["batched"], "collect"],
        [
            "kvstatus, near cache off: `check_status_pp_consensus` (1 round trip a room)",
            uncached["consensus"],
            "consensus",
        ],
        ["kvstatus, near cache off: poll (`in` + consensus, 2 round trips a room)", uncached["poll"], "poll"],
        [f"kvstatus, near cache off: `collect_many` ({PP} round trips for all rooms)", uncached["batched"], "collect"],
    ]
    table = [
        [name, f"{seconds * 1e3:,.3f}", "" if theirs is None else f"{seconds / theirs[floor]:,.2f}x upstream {floor}"]
        for name, seconds, floor in rows
    ]
    if theirs is None:
        table.append(["`PPConsensusStore` (sglang)", "n/a", "n/a: sglang not importable, no ./dev test-sglang venv"])
    else:
        table += [
            [
                "upstream `check_status_pp_consensus` on `PPConsensusStore` (sglang)",
                f"{theirs['consensus'] * 1e3:,.3f}",
                "",
            ],
            ["upstream poll (`in` + consensus)", f"{theirs['poll'] * 1e3:,.3f}", ""],
            ["upstream `PPConsensusStore.collect` (in-process maps)", f"{theirs['collect'] * 1e3:,.3f}", ""],
        ]
    print(markdown_table(["read", "256 rooms (ms)", "ratio"], table))


if __name__ == "__main__":
    main()
