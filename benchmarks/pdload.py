"""A PD workload on one Redis through the SGLang plugin's defaults, measured against the capacity model:
``./dev python -m benchmarks.pdload [--pairs 4] [--rooms 64] [--seconds 20] [--steps 20]``.

``pairs`` prefill and decode managers (the stand-in ``CommonKVManager``, installed as the plugin installs it:
a 10 s lease, shared fate, the near cache) each keep ``rooms`` requests in flight. Every scheduler step each
manager polls its rooms as ``_poll_with_status`` does (``in``, then ``check_status``); every 4 steps a request
moves one stage (decode WaitingForInput, prefill Bootstrapping -> Transferring -> Success, decode Success) and a
concluded request is popped by both sides (a tombstone each) and replaced. After a warm-up the run reads Redis'
own accounts (INFO commandstats, CPU, memory, tracking) over the measured window, and prints them beside what
docs/operations.md's capacity model predicts from the same rates. Markdown on stdout.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from typing import Any, Optional

from benchmarks.report import markdown_table
from kvstatus import KVPoll
from kvstatus.sglang.plugin import ENV_NAMESPACE, ENV_URL, install_from_env
from tests.servers import RedisServer
from tests.sglang.standin import DisaggregationMode, make_manager

NAMESPACE = "pdload"
STEPS_PER_STAGE = 4
# The capacity model's memory per item (bytes), from docs/operations.md.
MODEL_ROOM_BYTES = 200
MODEL_TOMBSTONE_BYTES = 250
MODEL_TRACKED_BYTES = 135


class Request:
    """One request in flight: its room and how far it got (0: opened ... 4: concluded)."""

    def __init__(self, room: int) -> None:
        self.room, self.stage = room, 0


def open_request(prefill: Any, decode: Any, rng: random.Random) -> Request:
    room = rng.randrange(1, 2**63 - 1)
    decode.update_status(room, KVPoll.WaitingForInput)
    prefill.update_status(room, KVPoll.Bootstrapping)
    return Request(room)


def advance(prefill: Any, decode: Any, request: Request) -> bool:
    """Move ``request`` one stage; True when it concluded and both sides popped it."""
    request.stage += 1
    if request.stage == 1:
        prefill.update_status(request.room, KVPoll.Transferring)
    elif request.stage == 2:
        prefill.update_status(request.room, KVPoll.Success)
    elif request.stage == 3:
        decode.update_status(request.room, KVPoll.Success)
    else:
        prefill.request_status.pop(request.room, None)
        decode.request_status.pop(request.room, None)
        return True
    return False


def poll(manager: Any, requests: list[Request]) -> None:
    statuses = manager.request_status
    for request in requests:
        if request.room in statuses:
            manager.check_status(request.room)


def snapshot(raw: Any) -> dict[str, Any]:
    info = raw.info("all")
    commands = {k[len("cmdstat_") :]: (v["calls"], v["usec"]) for k, v in raw.info("commandstats").items()}
    return {
        "cpu": info["used_cpu_user"] + info["used_cpu_sys"],
        "memory": info["used_memory"] - info.get("mem_clients_normal", 0),  # the data, not the connections
        "tracked": info.get("tracking_total_items", 0),
        "keys": raw.dbsize(),
        "commands": commands,
        "at": time.monotonic(),
    }


def run(url: str, raw: Any, pairs: int, rooms: int, seconds: float, steps: int) -> list[list[str]]:
    rng = random.Random(7)
    empty = snapshot(raw)["memory"]
    managers = []
    for pair in range(pairs):
        env = {ENV_URL: url, ENV_NAMESPACE: NAMESPACE, "KVSTATUS_SGLANG_INSTANCE": f"n{pair}"}
        prefill, decode = make_manager(), make_manager(mode=DisaggregationMode.DECODE)
        install_from_env(prefill, env)
        install_from_env(decode, env)
        managers.append((prefill, decode, [open_request(prefill, decode, rng) for _ in range(rooms)]))
    step_seconds = 1.0 / steps
    counts = {"requests": 0, "steps": 0}
    begin: Optional[dict[str, Any]] = None
    warm_until = time.monotonic() + min(10.0, seconds / 2)
    end_at = warm_until + seconds
    step = 0
    while time.monotonic() < end_at:
        started = time.monotonic()
        if begin is None and started >= warm_until:
            begin, counts = snapshot(raw), {"requests": 0, "steps": 0}
        for prefill, decode, requests in managers:
            poll(prefill, requests)
            poll(decode, requests)
            if step % STEPS_PER_STAGE == 0:
                for i, request in enumerate(requests):
                    if advance(prefill, decode, request):
                        requests[i] = open_request(prefill, decode, rng)
                        counts["requests"] += 1
        counts["steps"] += 1
        step += 1
        time.sleep(max(0.0, step_seconds - (time.monotonic() - started)))
    end = snapshot(raw)
    tombstones = sum(1 for _ in raw.scan_iter(match=f"*:{NAMESPACE}:*:t", count=1000))
    for prefill, decode, _ in managers:
        prefill.request_status.close()
        decode.request_status.close()
    assert begin is not None
    return report(begin, end, counts, pairs * rooms, tombstones, end["memory"] - empty)


TOP_LEVEL = ("evalsha", "evalsha_ro", "hgetall", "pttl", "hmget")
"""The commands the stores send themselves (commandstats also counts the calls inside scripts)."""


def report(
    begin: dict[str, Any], end: dict[str, Any], counts: dict[str, int], live: int, tombstones: int, memory: int
) -> list[list[str]]:
    wall = end["at"] - begin["at"]
    calls = {name: n - begin["commands"].get(name, (0, 0))[0] for name, (n, _) in end["commands"].items()}
    requests = counts["requests"] / wall
    scripts = calls.get("evalsha", 0) / wall  # updates, pops (clear.lua), the lease keepers' renewals and looks
    fills = calls.get("hgetall", 0) / wall  # each with its PTTL, one round trip
    cpu = (end["cpu"] - begin["cpu"]) / wall
    polls = counts["steps"] / wall * 2 * live
    model_memory = live * MODEL_ROOM_BYTES + tombstones * MODEL_TOMBSTONE_BYTES + end["tracked"] * MODEL_TRACKED_BYTES
    return [
        ["requests concluded /s", f"{requests:,.0f}", f"{live:,} in flight, two participants each"],
        ["polls /s (`in` + `check_status`)", f"{polls:,.0f}", "answered from the near cache"],
        ["script calls per request", f"{scripts / requests:.1f}", "5 updates, 2 pops, the lease keepers' share"],
        [
            "near-cache fills per request",
            f"{fills / requests:.1f}",
            "HGETALL + PTTL: a reader's next poll after a change",
        ],
        ["Redis CPU, cores (measured)", f"{cpu:.3f}", "INFO used_cpu_user + used_cpu_sys over the window"],
        ["Redis CPU per 1,000 requests/s, cores", f"{cpu / requests * 1000:.2f}", "this box, client beside it"],
        [
            "Redis command time per request (µs)",
            f"{_usec(begin, end, TOP_LEVEL) / counts['requests']:.0f}",
            "commandstats",
        ],
        ["tombstones held", f"{tombstones:,}", "two a request, 60 s each (the default)"],
        ["tracked keys, server side", f"{end['tracked']:,}", "INFO tracking_total_items"],
        ["used_memory above an empty Redis (MB)", f"{memory / 1e6:,.2f}", "at the end, without client buffers"],
        [
            "the model's memory (MB)",
            f"{model_memory / 1e6:,.2f}",
            f"{MODEL_ROOM_BYTES} B a room, {MODEL_TOMBSTONE_BYTES} a tombstone, {MODEL_TRACKED_BYTES} a tracked key",
        ],
    ]


def _usec(begin: dict[str, Any], end: dict[str, Any], names: tuple[str, ...]) -> float:
    return float(sum(end["commands"].get(n, (0, 0))[1] - begin["commands"].get(n, (0, 0))[1] for n in names))


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.pdload", description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=4, help="prefill + decode manager pairs [4]")
    parser.add_argument("--rooms", type=int, default=64, help="requests in flight per pair [64]")
    parser.add_argument("--seconds", type=float, default=20.0, help="measured window, after a warm-up [20]")
    parser.add_argument("--steps", type=int, default=20, help="scheduler steps per second [20]")
    args = parser.parse_args(argv)
    with RedisServer(extra_args=["--save", "", "--appendonly", "no"]) as server:
        print(f"pdload: redis-server on {server.host}:{server.port}", file=sys.stderr)
        with server.client() as raw:
            rows = run(server.url, raw, args.pairs, args.rooms, args.seconds, args.steps)
    print(f"### PD load: {args.pairs} pairs x {args.rooms} rooms, {args.steps} steps/s, {args.seconds:g} s\n")
    print(markdown_table(["measure", "value", "note"], rows))


if __name__ == "__main__":
    main()
