"""``./dev python -m benchmarks.nearcache``: the near cache and wait_for budgets, side by side in one run.

Prints a Markdown table. Latencies are microseconds; every comparison is interleaved (ABAB...) so a noisy
neighbour slows both sides alike. Staleness and wait_for delivery are measured from the writer's
acknowledgement (``time.monotonic_ns`` in the writer process, CLOCK_MONOTONIC is machine-wide) to the moment
the reader sees the change.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from benchmarks.measure import interleave, percentile, time_calls
from kvstatus import KVPoll, NearCacheOptions, StatusStore
from kvstatus.connection import connect
from tests.servers import RedisServer

NAMESPACE = "ncbench"
NO_PERSISTENCE = ["--save", "", "--appendonly", "no"]


@dataclass
class Report:
    rows: list[tuple[str, str, str]] = field(default_factory=list)  # (what, measured, note)
    budgets: list[tuple[str, str, str, bool]] = field(default_factory=list)  # (budget, measured, limit, met)

    def row(self, what: str, measured: str, note: str = "") -> None:
        self.rows.append((what, measured, note))

    def budget(self, name: str, measured: float, op: str, limit: float, unit: str) -> None:
        met = measured <= limit if op == "<=" else measured >= limit
        self.budgets.append((name, f"{measured:.2f}{unit}", f"{op} {limit:g}{unit}", met))

    def markdown(self) -> str:
        lines = ["| budget | measured | limit | result |", "|---|---|---|---|"]
        lines += [f"| {n} | {m} | {lim} | {'PASS' if ok else '**MISS**'} |" for n, m, lim, ok in self.budgets]
        lines += ["", "| measurement | value | note |", "|---|---|---|"]
        lines += [f"| {w} | {m} | {n} |" for w, m, n in self.rows]
        return "\n".join(lines) + "\n"


def _us(ns: float) -> str:
    return f"{ns / 1000:,.1f} µs"


# --------------------------------------------------------------------------- reads


def reads(url: str, report: Report, samples: int, rounds: int) -> None:
    rooms = list(range(1, 257))
    with (
        StatusStore.from_url(url, namespace=NAMESPACE, participant="w") as writer,
        StatusStore.from_url(url, namespace=NAMESPACE, participant="w", near_cache=True) as cached,
    ):
        writer.update_many({r: KVPoll.Transferring for r in rooms})
        local = {r: KVPoll.Transferring for r in rooms}
        raw = writer.client
        key = writer._core.schema.room_key(1)
        cached.get_many(rooms)
        steps = max(50, samples // 10)
        s = interleave(
            {
                "dict": lambda: time_calls(lambda i: {r: local.get(r) for r in rooms}, steps),
                "cached": lambda: time_calls(lambda i: cached.get_many(rooms), steps),
                "uncached": lambda: time_calls(lambda i: writer.get_many(rooms), steps // 5),
            },
            rounds,
        )
        report.row(
            "poll step, 256 unchanged rooms: dict", f"{s['dict'].p50_us:,.1f} µs", "`{r: d.get(r) for r in rooms}`"
        )
        report.row(
            "poll step, 256 unchanged rooms: near cache",
            f"{s['cached'].p50_us:,.1f} µs",
            f"p99 {s['cached'].p99_us:,.1f} µs; `store.get_many(rooms)`",
        )
        report.row(
            "poll step, 256 unchanged rooms: uncached",
            f"{s['uncached'].p50_us:,.1f} µs",
            "`store.get_many(rooms)`, one round trip",
        )
        report.budget("cached poll step / dict poll step", s["cached"].p50_us / s["dict"].p50_us, "<=", 3, "×")
        report.budget("uncached poll step / cached poll step", s["uncached"].p50_us / s["cached"].p50_us, ">=", 20, "×")

        s = interleave(
            {
                "dict": lambda: time_calls(lambda i: local.get(1), samples),
                "cached": lambda: time_calls(lambda i: cached.get(1), samples),
                "uncached": lambda: time_calls(lambda i: writer.get(1), samples // 5),
                "raw": lambda: time_calls(lambda i: raw.execute_command("HGET", key, "w"), samples // 5),
            },
            rounds,
        )
        report.row("single get: dict", f"{s['dict'].p50_us:,.2f} µs")
        report.row("single get: near cache hit", f"{s['cached'].p50_us:,.2f} µs", f"p99 {s['cached'].p99_us:,.1f} µs")
        report.row("single get: uncached `store.get`", f"{s['uncached'].p50_us:,.1f} µs")
        report.row("single get: raw `HGET` round trip", f"{s['raw'].p50_us:,.1f} µs")
        report.budget("cached get p50", s["cached"].p50_us, "<=", 5, " µs")
        report.row(
            "uncached get / raw HGET",
            f"{s['uncached'].p50_us / s['raw'].p50_us:.2f}×",
            "the store's existing budget (budget ≤ 1.05×, main measured 1.05-1.16×)",
        )
        if hasattr(writer, "_core") and hasattr(writer, "_send"):  # the read path as it was before the near cache
            before = lambda i: writer._send(writer._core.get(1))  # noqa: E731
            s = interleave(
                {
                    "store.get": lambda: time_calls(lambda i: writer.get(1), samples // 5),
                    "pre-cache path": lambda: time_calls(before, samples // 5),
                },
                rounds,
            )
            report.budget(
                "uncached get, store.get / the pre-near-cache code path",
                s["store.get"].p50_us / s["pre-cache path"].p50_us,
                "<=",
                1.05,
                "×",
            )


# --------------------------------------------------------------------------- staleness


def _writer(url: str, rooms: list[int], others: list[int], rate: float, start_at: int, out: Any) -> None:
    """Advance each of ``rooms`` Bootstrapping → WaitingForInput → Transferring → Success at ``rate`` updates/s,
    interleaved with as many updates of ``others`` (rooms the reader never reads); report the acks."""
    acks: list[tuple[int, int, int]] = []
    with StatusStore.from_url(url, namespace=NAMESPACE, participant="w") as store:
        plan = [
            (room, status) for status in (KVPoll.WaitingForInput, KVPoll.Transferring, KVPoll.Success) for room in rooms
        ]
        other_status = [KVPoll.Bootstrapping] * len(others)
        while time.monotonic_ns() < start_at:
            time.sleep(0.0005)
        period = 1e9 / rate
        next_at = time.monotonic_ns()
        for n, (room, status) in enumerate(plan):
            wait = next_at - time.monotonic_ns()
            if wait > 0:
                time.sleep(wait / 1e9)  # sleeping, not spinning: the box has 2 cores for reader, writer and Redis
            store.update_status(room, status)
            acks.append((room, int(status), time.monotonic_ns()))
            if others:
                i = n % len(others)
                other_status[i] = KVPoll(min(4, other_status[i] + 1)) if other_status[i] < 4 else KVPoll.Bootstrapping
                if other_status[i] == KVPoll.Bootstrapping:
                    store.clear(others[i])
                store.update_status(others[i], other_status[i])
            next_at += period
    out.send(acks)


def staleness(
    url: str, report: Report, mode: str, base: int, rate: float = 1000.0, other_rooms: int = 2048, pause: float = 0.0
) -> None:
    """A reader polls 256 rooms through the cache while a writer process changes them (and other rooms)."""
    bcast = mode == "BCAST"
    namespace_rooms = list(range(base, base + 256))
    others = list(range(base + 10_000, base + 10_000 + other_rooms))
    with StatusStore.from_url(url, namespace=NAMESPACE, participant="w") as setup:
        setup.update_many({r: KVPoll.Bootstrapping for r in namespace_rooms})
        for chunk in range(0, len(others), 512):
            setup.update_many({r: KVPoll.Bootstrapping for r in others[chunk : chunk + 512]})
    options = NearCacheOptions(bcast=bcast)
    context = multiprocessing.get_context("spawn")
    receiver, sender = context.Pipe(duplex=False)
    with StatusStore.from_url(url, namespace=NAMESPACE, participant="w", near_cache=options) as cached:
        cached.get_many(namespace_rooms)
        state = cached.near_cache.state
        invalidated_before = state.invalidated
        start_at = time.monotonic_ns() + 1_500_000_000
        process = context.Process(target=_writer, args=(url, namespace_rooms, others, rate, start_at, sender))
        process.start()
        seen: dict[tuple[int, int], int] = {}
        last = {r: 1 for r in namespace_rooms}
        polls = 0
        while process.is_alive() or receiver.poll():
            if receiver.poll():
                acks = receiver.recv()
                break
            if pause:
                time.sleep(pause)  # leave the CPU to Redis and the writer between polls (2 cores)
            result = cached.get_many(namespace_rooms)
            now = time.monotonic_ns()
            polls += 1
            for room, status in result.items():
                value = int(status) if status is not None else -1
                if value > last[room]:
                    for v in range(last[room] + 1, value + 1):
                        seen[(room, v)] = now
                    last[room] = value
        else:
            acks = receiver.recv()
        deadline = time.monotonic() + 10
        while any(v < 4 for v in last.values()) and time.monotonic() < deadline:
            result = cached.get_many(namespace_rooms)
            now = time.monotonic_ns()
            for room, status in result.items():
                value = int(status) if status is not None else -1
                if value > last[room]:
                    for v in range(last[room] + 1, value + 1):
                        seen[(room, v)] = now
                    last[room] = value
        process.join()
        received = state.invalidated - invalidated_before
    delays = [seen[(room, status)] - ack for room, status, ack in acks if (room, status) in seen]
    missing = len(acks) - len(delays)
    updates = len(acks) * (2 if others else 1)
    p50, p99 = percentile(delays, 0.5), percentile(delays, 0.99)
    report.row(
        f"staleness ({mode} tracking{', reader sleeps %g µs between polls' % (pause * 1e6) if pause else ''})"
        ", p50 / p99",
        f"{_us(p50)} / {_us(p99)}",
        f"{len(acks)} changes at {rate:g}/s to the 256 polled rooms (+ as many to {len(others)} other rooms); "
        f"{polls} polls; {missing} changes never seen",
    )
    report.row(
        f"invalidated rooms received per namespace update ({mode})",
        f"{received / updates:.2f}",
        f"{received} for {updates} updates",
    )
    if mode == "default":
        report.budget(
            f"staleness p99 after the writer's ack (default tracking{', paused reader' if pause else ''})",
            p99 / 1000,
            "<=",
            1000,
            " µs",
        )


def tracked_key_memory(url: str, report: Report, mode: str, base: int, rooms: int = 20_000) -> None:
    """Redis' memory per cached room: used_memory delta when one reader caches ``rooms`` (missing) rooms."""
    admin = connect(url)
    keys = list(range(base, base + rooms))
    with StatusStore.from_url(
        url, namespace=NAMESPACE, participant="w", near_cache=NearCacheOptions(max_rooms=rooms, bcast=mode == "BCAST")
    ) as cached:
        cached.get(keys[0])
        before = admin.info("memory")["used_memory"]
        for chunk in range(0, rooms, 1000):
            cached.get_many(keys[chunk : chunk + 1000])
        after = admin.info("memory")["used_memory"]
    report.row(
        f"server memory per cached room ({mode} tracking)",
        f"{(after - before) / rooms:,.0f} bytes",
        f"used_memory delta for {rooms:,} rooms read by one cached reader",
    )


# --------------------------------------------------------------------------- wait_for


def _reads(client: Any) -> int:
    """HGETALL calls the server ran so far: each is a wait's read through its near cache, which Redis then tracks
    (no script of an update runs HGETALL)."""
    return int(client.info("commandstats").get("cmdstat_hgetall", {}).get("calls", 0))


def _updater(url: str, rooms: list[int], seen: int, out: Any) -> None:
    """For each room: wait until the waiter has read it (``seen``: the reads before the first; a room's wait is its
    first read, after the previous room's wake and re-read), then update the room and report the ack."""
    acks = []
    needed = seen + 1
    with StatusStore.from_url(url, namespace=NAMESPACE, participant="w") as store:
        for room in rooms:
            while _reads(store.client) < needed:
                time.sleep(0.0002)
            needed += 2  # this room's read after its wake, and the next room's first read
            time.sleep(0.001)  # the waiter is past its first read and blocked on its signal
            store.update_status(room, KVPoll.Bootstrapping)
            acks.append(time.monotonic_ns())
            time.sleep(0.005)  # no INFO polling while the waiter wakes: the box has 2 cores
    out.send(acks)


def wait_delivery(url: str, report: Report, count: int) -> None:
    rooms = list(range(500_000, 500_000 + count))
    context = multiprocessing.get_context("spawn")
    receiver, sender = context.Pipe(duplex=False)
    woke = []
    with StatusStore.from_url(url, namespace=NAMESPACE, participant="w") as store:
        process = context.Process(target=_updater, args=(url, rooms, _reads(store.client), sender))
        process.start()
        for room in rooms:
            got = store.wait_for(room, KVPoll.Bootstrapping, timeout=30)
            woke.append(time.monotonic_ns())
            assert got == KVPoll.Bootstrapping
    acks = receiver.recv()
    process.join()
    delays = [w - a for w, a in zip(woke, acks)]
    p50, p99 = percentile(delays, 0.5), percentile(delays, 0.99)
    report.row(
        "wait_for delivery after the writer's ack, p50 / p99",
        f"{_us(p50)} / {_us(p99)}",
        f"{count} waits, each on a new room, on the near cache the store's backend keeps for its waits",
    )
    report.budget("wait_for delivery p99", p99 / 1000, "<=", 1000, " µs")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.nearcache", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes (~20 s)")
    args = parser.parse_args(argv)
    samples, rounds = (1000, 3) if args.quick else (5000, 7)
    report = Report()
    with RedisServer(extra_args=NO_PERSISTENCE) as server:
        for step, run in (
            ("reads", lambda: reads(server.url, report, samples, rounds)),
            ("staleness default", lambda: staleness(server.url, report, "default", 1_000_000)),
            ("staleness BCAST", lambda: staleness(server.url, report, "BCAST", 2_000_000)),
            ("staleness paused", lambda: staleness(server.url, report, "default", 5_000_000, pause=0.0001)),
            (
                "tracked key memory default",
                lambda: tracked_key_memory(server.url, report, "default", 3_000_000, 5_000 if args.quick else 20_000),
            ),
            (
                "tracked key memory BCAST",
                lambda: tracked_key_memory(server.url, report, "BCAST", 4_000_000, 5_000 if args.quick else 20_000),
            ),
            ("wait_for", lambda: wait_delivery(server.url, report, 100 if args.quick else 300)),
        ):
            run()
            print(f"  {step}: done", file=sys.stderr, flush=True)
    print(report.markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
