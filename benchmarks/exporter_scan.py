"""``./dev python -m benchmarks.exporter_scan``: what one exporter pass costs at N live rooms (default 100k).

Seeds N rooms (3 participants) into a throwaway redis-server without
persistence, then times full passes of :class:`kvstatus.observe.scanner.NamespacePass`
per batch size, and reads Redis' own CPU (INFO cpu, user+sys) spent during them.
Prints seconds per pass, keys per second, and Redis CPU seconds per pass.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from kvstatus import KVPoll, StatusStore
from kvstatus.keys import KeySchema
from kvstatus.observe.scanner import NamespacePass
from tests.servers import RedisServer

NAMESPACE = "bench-exporter"


def redis_cpu(client: Any) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def seed(url: str, rooms: int) -> None:
    for i, participant in enumerate(("prefill-0", "prefill-1", "decode-0")):
        store = StatusStore.from_url(url, namespace=NAMESPACE, participant=participant)
        for start in range(0, rooms, 5000):
            store.update_many({room: KVPoll(1 + (room + i) % 4) for room in range(start, min(start + 5000, rooms))})
        store.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.exporter_scan", description=__doc__)
    parser.add_argument("--rooms", type=int, default=100_000)
    parser.add_argument("--batches", type=int, nargs="+", default=[100, 500, 2000])
    parser.add_argument("--passes", type=int, default=3, help="passes per batch size; the median is reported")
    args = parser.parse_args(argv)
    with RedisServer(extra_args=["--save", "", "--appendonly", "no"]) as server:
        client = server.client()
        started = time.perf_counter()
        seed(server.url, args.rooms)
        print(
            f"seeded {args.rooms} rooms x 3 participants in {time.perf_counter() - started:.1f}s; "
            f"used_memory {client.info('memory')['used_memory_human']}"
        )
        schema = KeySchema(NAMESPACE)
        print(f"{'batch':>6} {'s/pass':>8} {'keys/s':>9} {'redis cpu s/pass':>17} {'client cpu s/pass':>18}")
        for batch in args.batches:
            rows = []
            for _ in range(args.passes):
                cpu0, wall0, proc0 = redis_cpu(client), time.perf_counter(), time.process_time()
                current = NamespacePass(client, schema, batch=batch)
                while not current.step():
                    pass
                wall, proc, cpu = time.perf_counter() - wall0, time.process_time() - proc0, redis_cpu(client) - cpu0
                assert current.result is not None and current.result.stats.rooms >= args.rooms
                rows.append((wall, cpu, proc, current.result.keys_scanned))
            rows.sort()
            wall, cpu, proc, keys = rows[len(rows) // 2]
            print(f"{batch:>6} {wall:>8.2f} {keys / wall:>9,.0f} {cpu:>17.2f} {proc:>18.2f}")


if __name__ == "__main__":
    main()
