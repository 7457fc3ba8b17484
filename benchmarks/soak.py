"""False failures under CPU starvation: ``./dev python -m benchmarks.soak [--seconds 60] [--lease-ttl 10]``.

Issue 16's soak. Prefill/decode pairs run rooms for ``--seconds`` in separate processes, each store built as the
SGLang plugin builds it (a lease, shared fate, the near cache), while CPU hogs (``--hogs``, default 2 per core)
keep every core busy. Nobody dies, so every poll that answers Failed and every lost lease is a false failure.
Markdown on stdout; BENCHMARKS.md, "Peer faults", has the figures.

A pair walks one room per time slot of :data:`SLOT_SECONDS`, on the wall clock both processes share: each
writes Bootstrapping, waits (``wait_for``, within the slot) for the partner's entry, then WaitingForInput or
Transferring, then Success, polling ``get`` after each write, then ``clear``s. So the two hold open entries in
the same room at the same time, and the peer watch and shared fate judge live peers all along. A participant
that falls behind skips to the current slot.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from collections import Counter
from typing import Any

from benchmarks.report import markdown_table
from kvstatus import KVPoll, LeaseLostError, StatusStore
from tests.servers import RedisServer

NO_PERSISTENCE = ["--save", "", "--appendonly", "no"]
HOG = "while True:\n    pass\n"
SLOT_SECONDS = 0.2
PATHS = {
    "prefill": (KVPoll.Bootstrapping, KVPoll.Transferring, KVPoll.Success),
    "decode": (KVPoll.Bootstrapping, KVPoll.WaitingForInput, KVPoll.Success),
}


def worker(
    url: str, namespace: str, participant: str, first_room: int, start: float, seconds: float, lease_ttl: float
) -> dict[str, Any]:
    """Walk a room per slot from Unix time ``start`` for ``seconds``; returns what it saw (JSON by ``--worker``)."""
    store = StatusStore.from_url(
        url, namespace=namespace, participant=participant, lease_ttl=lease_ttl, near_cache=True
    )
    role, pair = participant.split("-", 1)
    partner = f"{'decode' if role == 'prefill' else 'prefill'}-{pair}"
    rooms = failed_polls = lost = alone = 0
    causes: Counter[str] = Counter()
    slowest = 0.0
    slots, slot = round(seconds / SLOT_SECONDS), 0
    while True:
        slot = max(slot, math.ceil((time.time() - start) / SLOT_SECONDS))  # behind: skip to the current slot
        if slot >= slots:
            break
        time.sleep(max(0.0, start + slot * SLOT_SECONDS - time.time()))
        room, slot = first_room + slot, slot + 1
        for status in PATHS[role]:
            began = time.monotonic()
            try:
                store.update_status(room, status)
            except LeaseLostError as exc:
                lost += 1
                causes[f"lease lost: {exc}"[:120]] += 1
                store.acquire_lease(again=True)
            if store.get(room) is KVPoll.Failed:
                failed_polls += 1
                failure = store.failure(room)
                causes["-" if failure is None else failure.describe()[:120]] += 1
            slowest = max(slowest, time.monotonic() - began)
            if status is KVPoll.Bootstrapping:
                # At most 60 % into the slot: the walk ends within it, so both start the next one on time.
                left = max(start + (slot - 0.4) * SLOT_SECONDS - time.time(), 0.001)
                if store.wait_for(room, list(KVPoll), left, participant=partner) is None:
                    alone += 1
        store.clear(room)
        rooms += 1
    renewals = store.lease.renewals if store.lease is not None else 0
    store.close()
    return {
        "participant": participant,
        "rooms": rooms,
        "failed_polls": failed_polls,
        "alone": alone,
        "leases_lost": lost,
        "renewals": renewals,
        "slowest_step_s": round(slowest, 3),
        "causes": dict(causes),
    }


def soak(seconds: float, lease_ttl: float, pairs: int, hogs: int) -> list[dict[str, Any]]:
    """Run ``pairs`` prefill/decode pairs for ``seconds`` beside ``hogs`` busy processes; their reports."""
    with RedisServer(extra_args=NO_PERSISTENCE) as server:
        namespace = f"soak-{os.getpid()}"
        spinning = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(hogs)]
        start = time.time() + 3  # every worker's store is built by then, even on starved cores
        try:
            workers = []
            for pair in range(pairs):
                for role in PATHS:
                    args = [f"{role}-{pair}", str(pair * 10**9 + 1), str(start), str(seconds), str(lease_ttl)]
                    command = [sys.executable, "-m", "benchmarks.soak", "--worker", server.url, namespace, *args]
                    workers.append(subprocess.Popen(command, stdout=subprocess.PIPE, text=True))
            reports = []
            for proc in workers:
                out, _ = proc.communicate(timeout=seconds + 120)
                if proc.returncode != 0:
                    raise RuntimeError(f"a soak worker exited with {proc.returncode}")
                reports.append(json.loads(out))
        finally:
            for hog in spinning:
                hog.kill()
                hog.wait()
    return reports


def main(argv: list[str]) -> int:
    if argv[:1] == ["--worker"]:
        url, namespace, participant, first, start, seconds, ttl = argv[1:8]
        print(json.dumps(worker(url, namespace, participant, int(first), float(start), float(seconds), float(ttl))))
        return 0
    parser = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--lease-ttl", type=float, default=10.0, help="seconds (the SGLang plugin's default)")
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--hogs", type=int, default=2 * (os.cpu_count() or 1), help="busy processes beside them")
    args = parser.parse_args(argv)
    reports = soak(args.seconds, args.lease_ttl, args.pairs, args.hogs)
    rows = [
        [
            r["participant"],
            f"{r['rooms']:,}",
            str(r["failed_polls"]),
            str(r["alone"]),
            str(r["leases_lost"]),
            str(r["renewals"]),
            f"{r['slowest_step_s']:.3f} s",
            "; ".join(f"{cause} ({n})" for cause, n in r["causes"].items()) or "-",
        ]
        for r in reports
    ]
    false = sum(r["failed_polls"] + r["leases_lost"] for r in reports)
    print(
        f"{args.seconds:g} s, lease TTL {args.lease_ttl:g} s, {args.pairs} prefill/decode pairs, {args.hogs} CPU hogs "
        f"on {os.cpu_count()} cores: **{false} false failures** in {sum(r['rooms'] for r in reports):,} room walks\n"
    )
    header = ["participant", "rooms", "polls answering Failed", "partner absent in its slot", "leases lost"]
    print(markdown_table([*header, "renewals", "slowest step", "causes"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
