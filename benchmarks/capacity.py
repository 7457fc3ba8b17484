"""Capacity measurements: memory per room, cost as live rooms grow, the shard's throughput, async against
sync, a cluster, and the client's own code. Same conventions as :mod:`benchmarks.cases`.
"""

from __future__ import annotations

import asyncio
import random
import re
import shutil
import statistics
import subprocess
import time
from collections.abc import Callable
from typing import Any

import redis

from benchmarks.cases import (
    EPOCH,
    NAMESPACE,
    PARTICIPANT,
    TTL_MS,
    Budget,
    Measurement,
    Plan,
    Results,
    RoomSource,
    _CannedClient,
    _lat,
    _store,
    batches,
    commands_per_node,
)
from benchmarks.measure import Block, interleave, ratio, time_calls
from kvstatus import AsyncStatusStore, KVPoll, StatusStore, scripts


def async_vs_sync(url: str, client: Any, plan: Plan, rooms: RoomSource) -> Results:
    """The same single-key calls through AsyncStatusStore on one event loop, interleaved with the sync store."""
    import redis.asyncio

    loop = asyncio.new_event_loop()
    aclient = redis.asyncio.Redis.from_url(url)
    astore = _store(aclient, AsyncStatusStore)
    store = _store(client)
    n = plan.samples
    existing = rooms.take(n)
    store.update_many(dict.fromkeys(existing, KVPoll.Transferring))

    async def atimed(make: Callable[[int], Any]) -> list[int]:
        clock = time.perf_counter_ns
        samples = [0] * n
        for i in range(n):
            start = clock()
            await make(i)
            samples[i] = clock() - start
        return samples

    def async_update() -> list[int]:
        fresh = rooms.take(n)
        return loop.run_until_complete(atimed(lambda i: astore.update_status(fresh[i], KVPoll.Bootstrapping)))

    def sync_update() -> list[int]:
        fresh = rooms.take(n)
        return time_calls(lambda i: store.update_status(fresh[i], KVPoll.Bootstrapping), n)

    s = interleave(
        {
            "async update": async_update,
            "sync update": sync_update,
            "async get": lambda: loop.run_until_complete(atimed(lambda i: astore.get(existing[i]))),
            "sync get": lambda: time_calls(lambda i: store.get(existing[i]), n),
        },
        plan.rounds,
    )
    loop.run_until_complete(aclient.aclose())
    loop.close()
    out = Results()
    for op in ("update", "get"):
        a, b = s[f"async {op}"], s[f"sync {op}"]
        out.rows += [
            _lat(
                "async vs sync",
                f"`AsyncStatusStore.{'update_status' if op == 'update' else 'get'}`",
                a,
                f"{a.p50_us / b.p50_us:.2f}× the sync store",
            ),
            _lat("async vs sync", f"`StatusStore.{'update_status' if op == 'update' else 'get'}`", b),
        ]
    return out


def memory_per_room(client: Any, plan: Plan, rooms: RoomSource) -> Results:
    """``used_memory`` delta per live room (one participant, 19-digit room id, TTL set), and per raw SET key."""
    store = _store(client)
    out = Results()
    n = plan.memory_rooms
    client.flushall()
    before = _used_memory(client)
    work = rooms.take(n)
    for i in range(0, n, 1000):
        store.update_many(dict.fromkeys(work[i : i + 1000], KVPoll.Transferring))
    per_room = (_used_memory(client) - before) / n
    prefill = StatusStore(client, namespace=NAMESPACE, participant="prefill-0")
    for i in range(0, n, 1000):
        prefill.update_many(dict.fromkeys(work[i : i + 1000], KVPoll.Transferring))
    per_pd_room = (_used_memory(client) - before) / n
    fenced = {}  # stores with a lease stamp each entry with their incarnation's epoch (lua/update.lua)
    sglang_pair, walk = ["prefill-tp0-pp0", "decode-tp0-pp0"], (KVPoll.Bootstrapping, KVPoll.WaitingForInput)
    for label, names, timeline, statuses in (
        ("one", [PARTICIPANT], False, (KVPoll.Transferring,)),
        ("sglang", sglang_pair, False, (KVPoll.Transferring,)),
        ("timeline", [PARTICIPANT], True, (KVPoll.Transferring,)),
        # The plugin's default, both entries walked to Transferring: three steps each.
        ("sglang timeline", sglang_pair, True, (*walk, KVPoll.Transferring)),
    ):
        client.flushall()
        before = _used_memory(client)
        for name in names:
            stamped = StatusStore(client, namespace=NAMESPACE, participant=name, timeline=timeline)
            stamped._core.fence(EPOCH)
            for status in statuses:
                for i in range(0, n, 1000):
                    stamped.update_many(dict.fromkeys(work[i : i + 1000], status))
        fenced[label] = (_used_memory(client) - before) / n
    client.flushall()
    before = _used_memory(client)
    with client.pipeline(transaction=False) as pipe:
        for i, room in enumerate(work):
            pipe.set(store.schema.room_key(room), "3", px=TTL_MS)
            if i % 1000 == 999:
                pipe.execute()
        pipe.execute()
    per_string = (_used_memory(client) - before) / n
    client.flushall()
    key = store.schema.room_key(work[0])
    out.rows += [
        Measurement(
            "memory",
            "live room (hash, one participant, TTL)",
            per_room,
            "bytes",
            note=f"{n:,} rooms, key `{key}` ({len(key)} bytes), field `{PARTICIPANT}`",
        ),
        Measurement("memory", "live room, two participants (`prefill-0` and `decode-0`)", per_pd_room, "bytes"),
        Measurement(
            "memory",
            "live room, one participant, stamped with its lease epoch (a store with a lease)",
            fenced["one"],
            "bytes",
            note=f"{fenced['one'] - per_room:+.0f} bytes for the `inc:{PARTICIPANT}` field",
        ),
        Measurement(
            "memory",
            "live SGLang room: `prefill-tp0-pp0` and `decode-tp0-pp0`, both stamped",
            fenced["sglang"],
            "bytes",
        ),
        Measurement(
            "memory",
            "live room, one participant, stamped, with its timeline (one step)",
            fenced["timeline"],
            "bytes",
            note=f"{fenced['timeline'] - fenced['one']:+.0f} bytes for the `t:{PARTICIPANT}` field",
        ),
        Measurement(
            "memory",
            "live SGLang room, both stamped, with timelines of three steps each (the plugin's default)",
            fenced["sglang timeline"],
            "bytes",
            note=f"{fenced['sglang timeline'] - fenced['sglang']:+.0f} bytes for the two timelines",
        ),
        Measurement("memory", "raw `SET` of the same key with PX", per_string, "bytes"),
    ]
    out.budgets.append(
        Budget(
            "memory per live room",
            per_room,
            "<=",
            200,
            "bytes",
            f"{per_room:.0f} bytes (a plain string key with TTL: {per_string:.0f})",
        )
    )
    return out


def _used_memory(client: Any) -> int:
    return int(client.info("memory")["used_memory"])


def scaling(clients: list[Any], plan: Plan, rooms: RoomSource) -> Results:
    """update_status and get on random existing rooms, one server per live-room level, interleaved across levels.

    ``clients[i]`` talks to a server of its own that is filled to ``plan.levels[i]`` rooms, so every level is
    measured in the same rounds as the others.
    """
    out = Results()
    stores = [_store(client) for client in clients]
    live: list[list[int]] = []
    for store, level in zip(stores, plan.levels):
        add = rooms.take(level)
        for i in range(0, level, 1000):
            store.update_many(dict.fromkeys(add[i : i + 1000], KVPoll.Bootstrapping))
        live.append(add)
        store.client.config_resetstat()
    rng = random.Random(5)
    n = plan.samples

    def update_block(i: int) -> Block:
        def block() -> list[int]:
            picked = rng.choices(live[i], k=n)
            return time_calls(lambda j: stores[i].update_status(picked[j], KVPoll.WaitingForInput), n)

        return block

    def get_block(i: int) -> Block:
        def block() -> list[int]:
            picked = rng.choices(live[i], k=n)
            return time_calls(lambda j: stores[i].get(picked[j]), n)

        return block

    blocks: dict[str, Block] = {}
    for i in range(len(plan.levels)):
        blocks[f"update {i}"] = update_block(i)
        blocks[f"get {i}"] = get_block(i)
    s = interleave(blocks, plan.rounds)
    server: list[tuple[float, float]] = []
    for i, (client, level) in enumerate(zip(clients, plan.levels)):
        stats = client.info("commandstats")
        server.append((stats["cmdstat_evalsha"]["usec_per_call"], stats["cmdstat_hget"]["usec_per_call"]))
        out.rows += [
            _lat(
                "live rooms",
                f"`update_status` at {level:,} rooms",
                s[f"update {i}"],
                f"server {server[i][0]:.2f} µs/call",
            ),
            _lat("live rooms", f"`get` at {level:,} rooms", s[f"get {i}"], f"server {server[i][1]:.2f} µs/call"),
        ]
    low, high = plan.levels[0], plan.levels[-1]
    for k, what in enumerate(("update", "get")):
        a, b = s[f"{what} {len(plan.levels) - 1}"], s[f"{what} 0"]
        name = "update_status" if what == "update" else "get"
        out.budgets.append(
            Budget(
                f"{name} p50 at {high:,} vs {low:,} live rooms (flat: ≤ 1.25×)",
                ratio(a, b),
                "<=",
                1.25,
                "×",
                f"{a.p50_us:.1f} vs {b.p50_us:.1f} µs; server {server[-1][k]:.2f} vs {server[0][k]:.2f} µs/call",
            )
        )
    return out


def dict_reference(plan: Plan) -> Results:
    """The seed's in-process ``request_status`` dict: the upstream update_status, no sharing, no TTL."""
    request_status: dict[int, KVPoll] = {}

    def update_status(room: int, status: KVPoll) -> None:
        if room not in request_status:
            request_status[room] = status
        elif status == KVPoll.Failed:
            request_status[room] = KVPoll.Failed
        else:
            request_status[room] = max(request_status[room], status)

    work = RoomSource(1).take(200_000)
    timings = []
    for _ in range(plan.rounds):
        request_status.clear()
        start = time.perf_counter_ns()
        for room in work:
            update_status(room, KVPoll.Bootstrapping)
        timings.append((time.perf_counter_ns() - start) / len(work))
    per_op = statistics.median(timings)
    return Results(
        rows=[
            Measurement(
                "reference",
                "in-process dict `update_status` (seed design)",
                1e9 / per_op,
                "updates/s",
                note=f"{per_op:.0f} ns per update, one process",
            )
        ]
    )


def shard_capacity(port: int, requests: int) -> Results:
    """Saturated per-shard rates from ``redis-benchmark`` (C client, 50 connections, pipeline 16)."""
    binary = shutil.which("redis-benchmark")
    out = Results()
    if binary is None:
        out.notes.append("redis-benchmark not found: per-shard saturation rates not measured")
        return out
    r = redis.Redis(port=port)
    r.script_load(scripts.UPDATE.source)
    key = f"kvstatus:{NAMESPACE}:{{__rand_int__}}"
    commands = {
        "update rule, one key (`EVALSHA update.lua`)": [
            "EVALSHA",
            scripts.UPDATE.sha,
            "1",
            key,
            "seed",
            str(TTL_MS),
            PARTICIPANT,
            f"reason:{PARTICIPANT}",
            f"inc:{PARTICIPANT}",
            "",
            "1",
        ],
        "status read (`HGET`)": ["HGET", key, PARTICIPANT],
        "raw `SET PX`": ["SET", "raw:{__rand_int__}", "1", "PX", str(TTL_MS)],
        "raw `GET`": ["GET", "raw:{__rand_int__}"],
    }
    for name, command in commands.items():
        proc = subprocess.run(
            [
                binary,
                "-h",
                "127.0.0.1",
                "-p",
                str(port),
                "-n",
                str(requests),
                "-c",
                "50",
                "-P",
                "16",
                "-r",
                "1000000",
                "-q",
                "--csv",
                *command,
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        match = re.search(r'"[^"]*","([0-9.]+)"', proc.stdout)
        if match is None:
            out.notes.append(f"redis-benchmark gave no rate for {name}: {proc.stdout[-200:]} {proc.stderr[-200:]}")
            continue
        out.rows.append(
            Measurement(
                "shard capacity",
                name,
                float(match.group(1)),
                "ops/s",
                note="redis-benchmark -c 50 -P 16, random keys of 1M",
            )
        )
    r.flushall()
    r.close()
    return out


def cluster(client: Any, servers: Any, plan: Plan, rooms: RoomSource) -> Results:
    """The batch comparisons on a 3-master cluster: batches split by slot and pipelined per node."""
    store = _store(client)
    out = batches(client, plan, rooms, label=" (cluster)", cluster=True)
    n = plan.samples // 2
    s = interleave(
        {
            "update": lambda: (
                lambda fresh: time_calls(lambda i: store.update_status(fresh[i], KVPoll.Bootstrapping), n)
            )(rooms.take(n)),
            "set": lambda: (lambda keys: time_calls(lambda i: client.set(keys[i], "1", px=TTL_MS), n))(
                [f"raw:{r}" for r in rooms.take(n)]
            ),
        },
        plan.rounds,
    )
    out.rows += [
        _lat(
            "batch (cluster)",
            "`store.update_status` (CREATED)",
            s["update"],
            f"{s['update'].p50_us / s['set'].p50_us:.2f}× raw SET PX on the cluster",
        ),
        _lat("batch (cluster)", "raw `SET PX`", s["set"]),
    ]
    nodes = [node.client() for node in servers.masters()]
    present = rooms.take(256)
    store.update_many(dict.fromkeys(present, KVPoll.Transferring))
    per_node = commands_per_node(nodes, lambda: store.get_many(present))
    out.notes.append(f"cluster `get_many(256)`, calls per master: {per_node}")
    per_node = commands_per_node(nodes, lambda: store.update_many(dict.fromkeys(rooms.take(1000), 1)))
    out.notes.append(
        f"cluster `update_many(1000)`, calls per master: {per_node}. Each room is its own slot, so a batch is "
        f"one EVALSHA per room; any `command|getkeys` above is redis-py's cluster pipeline asking a node for "
        f"the keys of each pipelined command (one extra sequential round trip per command), which is where "
        f"the cluster batch time goes."
    )
    for node in nodes:
        node.close()
    return out


def client_overhead(plan: Plan) -> Results:
    """kvstatus' own time per call (validation, keys, encoding, decoding, the sans-I/O driver), best of repeats."""
    import timeit

    store = _store(_CannedClient())
    rooms = RoomSource(2).take(1000)
    updates = dict.fromkeys(rooms, KVPoll.Transferring)
    some = rooms[:256]
    calls = {
        "`get`": lambda: store.get(rooms[0]),
        "`update_status`": lambda: store.update_status(rooms[0], KVPoll.Transferring),
        "`get_many(256)`": lambda: store.get_many(some),
        "`update_many(1000)`": lambda: store.update_many(updates),
    }
    out = Results()
    for name, call in calls.items():
        number = 20_000 if "many" not in name else 200
        best = min(timeit.repeat(call, number=number, repeat=max(5, plan.rounds))) / number * 1e6
        out.rows.append(
            Measurement(
                "client code per call (no I/O)",
                name,
                best,
                "µs",
                note="best of repeats against a client that answers at once",
            )
        )
    return out
