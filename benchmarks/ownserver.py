"""What the benchmarks that time Redis itself share: their own redis-server, and Redis' own time per command.

``python -m benchmarks.timeline`` and ``python -m benchmarks.functions`` read INFO commandstats around each
pipelined block, so the client and the loopback do not count.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any, TypeVar

import redis

from tests.servers import RedisServer

T = TypeVar("T")


def redis_usec(client: Any, command: str) -> float:
    """Microseconds Redis has spent on ``command`` (e.g. ``"evalsha"``) since its stats were reset; 0 before
    its first call."""
    return float(client.info("commandstats").get("cmdstat_" + command.lower(), {}).get("usec", 0))


def run_on_own_server(
    argv: list[str], description: str, rounds: int, measure: Callable[[Any, int, int], T]
) -> tuple[argparse.Namespace, T]:
    """Parse ``--rounds`` (default ``rounds``) and ``--calls`` (default 4000) from ``argv``, start a redis-server
    without persistence, and return the arguments and ``measure(client, rounds, calls)`` on it."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--calls", type=int, default=4000)
    args = parser.parse_args(argv)
    with RedisServer(extra_args=["--save", "", "--appendonly", "no"]) as server:
        client = redis.Redis.from_url(server.url)
        try:
            return args, measure(client, args.rounds, args.calls)
        finally:
            client.close()
