"""Leases, the consensus view, tombstones and the sweeper: ``./dev python -m benchmarks.leases [--sweep-rooms N]``.

1. Lease upkeep: Redis commands per participant per second of an idle store
   holding a lease (INFO commandstats over a few seconds), for two TTLs.
2. The consensus view of 256 rooms x 4 participants (``room_statuses``, one
   script call) against ``get_many(256)``, interleaved rounds, same server.
3. The write path with a lease on against the same store without one
   (``update_status`` p50, interleaved); clear (the tombstone script) against
   a plain HDEL of the same fields, its floor.
4. The per-participant index the issue weighs: ``lua/update.lua`` with one
   ``ZADD`` of an index key added (a benchmark-only copy), Redis' own µs per
   update against the real script's.
5. Sweeping: keys/s over N rooms (default 1M) of which every one holds an
   open entry of the dead participant (worst case: every room is written), and
   over the same rooms once they are all swept (the scan-and-read floor).

Each step starts its own redis-server (persistence off) on a free port.
Markdown on stdout; the figures go into BENCHMARKS.md by hand.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any, Callable

from benchmarks.measure import interleave, ratio, time_calls
from benchmarks.report import markdown_table
from kvstatus import KVPoll, StatusStore, scripts
from kvstatus.admin.sweep import sweep
from kvstatus.connection import connect
from kvstatus.keys import KeySchema, reason_field
from tests.servers import RedisClusterServers, RedisServer

NO_PERSISTENCE = ["--save", "", "--appendonly", "no"]
ROWS: list[list[str]] = []


def row(*cells: Any) -> None:
    ROWS.append([str(c) for c in cells])
    print(" | ".join(ROWS[-1]), file=sys.stderr, flush=True)


def upkeep(url: str, seconds: float) -> None:
    for ttl in (3.0, 6.0):
        admin = connect(url)
        store = StatusStore.from_url(url, namespace=f"upkeep-{ttl:g}", participant="p", lease_ttl=ttl)
        store.acquire_lease()
        admin.config_resetstat()
        time.sleep(seconds)
        stat = admin.info("commandstats")
        scripted = ("cmdstat_evalsha", "cmdstat_eval", "cmdstat_evalsha_ro", "cmdstat_eval_ro")
        renewals = sum(v["calls"] for k, v in stat.items() if k in scripted)
        watch = sum(v["calls"] for k, v in stat.items() if k in ("cmdstat_hset", "cmdstat_pexpire", "cmdstat_hgetall"))
        store.close()
        row(
            f"lease upkeep, lease_ttl={ttl:g} s",
            f"{(renewals + watch) / seconds:.2f} commands/s per participant",
            f"{renewals} renewals and {watch} commands of the peer watch's looks ({watch // 3} round trips) "
            f"in {seconds:g} s",
        )
        admin.close()


def consensus(url: str, samples: int, rounds: int) -> None:
    names = ["prefill-0", "prefill-1", "decode-0", "decode-1"]
    stores = {n: StatusStore.from_url(url, namespace="cons", participant=n, lease_ttl=30) for n in names}
    rooms = list(range(10_000, 10_256))
    for store in stores.values():
        store.update_many({room: KVPoll.Bootstrapping for room in rooms})
        store.update_many({room: KVPoll.Transferring for room in rooms})
    reader = StatusStore.from_url(url, namespace="cons", participant="decode-0")
    assert all(c.status is KVPoll.Transferring for c in reader.room_statuses(rooms, names).values())
    client = reader.client
    floor_sha = client.script_load(BARE_HMGET)
    keys = reader.schema.room_keys(rooms)
    blocks = {
        "get_many(256)": lambda: time_calls(lambda i: reader.get_many(rooms), samples),
        "room_statuses(256 x 4)": lambda: time_calls(lambda i: reader.room_statuses(rooms, names), samples),
        "bare HMGET-loop script (floor)": lambda: time_calls(
            lambda i: client.execute_command("EVALSHA", floor_sha, len(keys), *keys, *names), samples
        ),
    }
    server: dict[str, list[float]] = {}
    for name in blocks:
        block = blocks[name]

        def measured(block: Any = block, name: str = name) -> list[int]:
            client.config_resetstat()
            got = block()
            stats = client.info("commandstats")  # get_many.lua and room_statuses.lua run read-only: EVALSHA_RO
            stat = stats.get("cmdstat_evalsha_ro") or stats["cmdstat_evalsha"]
            server.setdefault(name, []).append(stat["usec"] / stat["calls"])
            return got

        blocks[name] = measured
    result = interleave(blocks, rounds)
    r = ratio(result["room_statuses(256 x 4)"], result["get_many(256)"])
    for name, summary in result.items():
        row(
            name,
            f"p50 {summary.p50_us:.0f} µs",
            f"p99 {summary.p99_us:.0f} µs; Redis' own {statistics.median(server[name]):.0f} µs per call",
        )
    row("consensus / get_many", f"{r:.2f}x", "budget <= 1.5x, one round trip (one script call)")
    row(
        "consensus / bare HMGET-loop floor",
        f"{ratio(result['room_statuses(256 x 4)'], result['bare HMGET-loop script (floor)']):.2f}x",
        "the floor reads the same 1024 fields with nothing else: no leases, no validation, no decoding",
    )
    for store in stores.values():
        store.close()
    reader.close()


BARE_HMGET = (
    "local call, a, b, c, d = redis.call, ARGV[1], ARGV[2], ARGV[3], ARGV[4] local r = {} "
    'for i = 1, #KEYS do local v = call("HMGET", KEYS[i], a, b, c, d) '
    'r[i] = (v[1] or "-") .. (v[2] or "-") .. (v[3] or "-") .. (v[4] or "-") end return r'
)


def write_path(url: str, samples: int, rounds: int) -> None:
    plain = StatusStore.from_url(url, namespace="wp", participant="plain")
    leased = StatusStore.from_url(url, namespace="wp", participant="leased", lease_ttl=30)
    raw = connect(url)
    leased.acquire_lease()
    statuses = [KVPoll.Bootstrapping, KVPoll.WaitingForInput, KVPoll.Transferring, KVPoll.Success]

    def lifecycle(store: StatusStore) -> Callable[[int], object]:
        return lambda i: store.update_status(1_000_000 + i // 4, statuses[i % 4])

    base = iter(range(10**9))
    blocks = {
        "update_status, no lease": lambda: time_calls(lifecycle(plain), samples),
        "update_status, lease on": lambda: time_calls(lifecycle(leased), samples),
    }
    result = interleave(blocks, rounds)
    r = ratio(result["update_status, lease on"], result["update_status, no lease"])
    for name, summary in result.items():
        row(name, f"p50 {summary.p50_us:.1f} µs", f"p99 {summary.p99_us:.1f} µs")
    row("write path, lease on / off", f"{r:.3f}x", "budget <= 1.10x")

    def clears(hdel: bool) -> Callable[[], list[int]]:
        def block() -> list[int]:
            start = 20_000_000 + next(base) * samples
            plain.update_many({start + i: KVPoll.Success for i in range(samples)})
            if hdel:  # the floor: the entry's own field and its reason, removed by one plain command
                keys = [KeySchema(plain.namespace).room_key(start + i) for i in range(samples)]
                fields = (plain.participant, reason_field(plain.participant))
                return time_calls(lambda i: raw.hdel(keys[i], *fields), samples)
            return time_calls(lambda i: plain.clear(start + i), samples)

        return block

    result = interleave({"clear, HDEL": clears(True), "clear, tombstone script": clears(False)}, rounds)
    row(
        "clear: tombstone script / plain HDEL",
        f"{ratio(result['clear, tombstone script'], result['clear, HDEL']):.3f}x",
        f"p50 {result['clear, tombstone script'].p50_us:.1f} vs {result['clear, HDEL'].p50_us:.1f} µs",
    )
    for store in (plain, leased):
        store.close()
    raw.close()


INDEXED = scripts.UPDATE.source.replace(
    '    redis.call("PEXPIRE", key, ttl)\n  elseif',
    '    redis.call("PEXPIRE", key, ttl)\n    redis.call("ZADD", KEYS[#KEYS], 1, key)\n  elseif',
)


def index_cost(url: str, samples: int) -> None:
    """Redis' µs per single-key update: the real script against a copy that also ZADDs to a per-participant index."""
    assert INDEXED != scripts.UPDATE.source, "update.lua changed: the index copy no longer applies"
    client = connect(url)
    real_sha = client.script_load(scripts.UPDATE.source)
    indexed_sha = client.script_load(INDEXED)
    per_call = {}
    for name, sha, extra in (("update.lua", real_sha, ()), ("update.lua + ZADD index", indexed_sha, ("idx",))):
        times = []
        for r in range(5):
            client.config_resetstat()
            for i in range(samples):
                # With the index, the index key is the (n+1)th key: the script takes it as KEYS[#KEYS].
                keys = (f"kvstatus:ix:{{{r * samples + i}}}", *extra)
                client.execute_command(
                    "EVALSHA", sha, len(keys), *keys, "seed", "600000", "p", "reason:p", "inc:p", "", "", "1"
                )
            stat = client.info("commandstats")["cmdstat_evalsha"]
            times.append(stat["usec"] / stat["calls"])
        per_call[name] = statistics.median(times)
        client.flushall()
    a, b = per_call["update.lua + ZADD index"], per_call["update.lua"]
    row(
        "per-participant index (ZADD in the update script)",
        f"{a / b:.2f}x Redis time per update",
        f"{a:.1f} vs {b:.1f} µs; on a cluster the index key is in another slot: one more command per write",
    )
    client.close()


def populate(url: str, namespace: str, rooms: int) -> None:
    dead = StatusStore.from_url(url, namespace=namespace, participant="dead-0", lease_ttl=3)
    live = StatusStore(dead.client, namespace=namespace, participant="live-0")  # no lease: never swept
    chunk = 2_000
    for start in range(0, rooms, chunk):
        ids = range(start, min(start + chunk, rooms))
        dead.update_many({room: KVPoll.Transferring for room in ids})
        live.update_many({room: KVPoll.WaitingForInput for room in ids})
    dead.client.hset(f"kvstatus:{namespace}:lease:dead-0", "deadline", 1)


def sweep_rate(url: str, rooms: int, label: str) -> None:
    namespace = f"sweep-{rooms}"
    started = time.monotonic()
    populate(url, namespace, rooms)
    filled = time.monotonic() - started
    client = connect(url)
    schema = KeySchema(namespace)
    first = sweep(client, schema, batch=1000)
    assert first.swept == rooms, first
    second = sweep(client, schema, batch=1000)
    assert second.swept == 0
    row(
        f"sweep, {label}, {rooms:,} rooms, every one open for the dead participant",
        f"{first.scanned / first.seconds:,.0f} keys/s",
        f"{first.seconds:.1f} s, {first.swept:,} entries failed (filling took {filled:.0f} s)",
    )
    row(
        f"sweep again, {label}, {rooms:,} rooms, nothing left to fail",
        f"{second.scanned / second.seconds:,.0f} keys/s",
        f"{second.seconds:.1f} s (scan + read floor)",
    )
    client.close()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.leases", description=__doc__.splitlines()[0])
    parser.add_argument("--sweep-rooms", type=int, default=1_000_000)
    parser.add_argument("--cluster-sweep-rooms", type=int, default=200_000)
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--upkeep-seconds", type=float, default=6.0)
    args = parser.parse_args(argv)
    with RedisServer(extra_args=NO_PERSISTENCE) as server:
        upkeep(server.url, args.upkeep_seconds)
        consensus(server.url, max(args.samples // 10, 50), args.rounds)
        write_path(server.url, args.samples, args.rounds)
        index_cost(server.url, args.samples)
    with RedisServer(extra_args=NO_PERSISTENCE) as server:
        sweep_rate(server.url, args.sweep_rooms, "single Redis")
    if args.cluster_sweep_rooms:
        with RedisClusterServers(masters=3, extra_args=NO_PERSISTENCE) as cluster:
            sweep_rate(cluster.url, args.cluster_sweep_rooms, "3-master cluster")
    print(markdown_table(["measurement", "result", "detail"], ROWS))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
