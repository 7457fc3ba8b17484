"""The late-abort race across processes: each room's lifecycle in one process, its aborts in another.

Process i runs Bootstrapping -> WaitingForInput -> Transferring -> Success ->
clear for its rooms, twice (room ids are reused). Process i+1 aborts those
rooms: for half of them once at the worst moment, as the lifecycle ends (the
aborter watches the room from its start and aborts when it sees Success, just
as the owner clears it), and always once after the room was cleared (the late
abort). Afterwards no room may exist, and the
second request on a room must never start from a leftover status.

``implementation`` is "kvstatus" or a baseline of :mod:`kvstatus.demo.baselines`.
"""

from __future__ import annotations

import multiprocessing
import random
import time
from typing import Any

import redis

from kvstatus import KVPoll, Outcome
from kvstatus.demo.workload import make_store

LIFECYCLE = (KVPoll.Bootstrapping, KVPoll.WaitingForInput, KVPoll.Transferring, KVPoll.Success)
ROUNDS = 2


RACE_WINDOW = 0.0005
"""Seconds the client-side baseline sleeps between its read and its write, so that the race shows in one run."""


def _store(url: str, namespace: str, implementation: str) -> Any:
    return make_store(implementation, redis.Redis.from_url(url), namespace, race_window=RACE_WINDOW)


def _wait_for(flags: Any, room: int, value: int, poll: float) -> None:
    deadline = time.monotonic() + 10
    while flags[room] != value and time.monotonic() < deadline:
        time.sleep(poll)


def _owner(
    url: str, namespace: str, implementation: str, rooms: list[int], armed: Any, cleared: Any, stale: Any
) -> None:
    store = _store(url, namespace, implementation)
    for round_ in range(ROUNDS):
        for room in rooms:
            _wait_for(armed, room, round_ + 1, 0.00005)
            first = store.update_status(room, LIFECYCLE[0])
            if first.outcome is not Outcome.CREATED:
                with stale.get_lock():
                    stale.value += 1
            for status in LIFECYCLE[1:]:
                store.update_status(room, status)
            store.clear(room)
            cleared[room] = round_ + 1
        # Give the late aborts of this round time to land before the rooms are reused.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(cleared[room] != -(round_ + 1) for room in rooms):
            time.sleep(0.001)


def _aborter(
    url: str, namespace: str, implementation: str, rooms: list[int], armed: Any, cleared: Any, seed: int
) -> None:
    store = _store(url, namespace, implementation)
    rng = random.Random(seed)
    for round_ in range(ROUNDS):
        for room in rooms:
            armed[room] = round_ + 1  # the owner starts this room's lifecycle now
            if rng.random() < 0.5:
                deadline = time.monotonic() + 10
                while cleared[room] != round_ + 1 and time.monotonic() < deadline:
                    if store.get(room) is KVPoll.Success:
                        store.update_status(room, KVPoll.Failed)  # races the owner's clear()
                        break
            _wait_for(cleared, room, round_ + 1, 0.0002)
            store.update_status(room, KVPoll.Failed)  # arrives after clear()
            cleared[room] = -(round_ + 1)


def run_race(url: str, namespace: str, implementation: str, processes: int = 8, rooms_each: int = 25) -> dict:
    """Run the race; returns surviving room keys and how many second requests started from a leftover."""
    ctx = multiprocessing.get_context("fork")
    rooms = [[p * rooms_each + i for i in range(rooms_each)] for p in range(processes)]
    armed = ctx.Array("i", processes * rooms_each, lock=False)
    cleared = ctx.Array("i", processes * rooms_each, lock=False)
    stale = ctx.Value("i", 0)
    workers = []
    for p in range(processes):
        workers.append(
            ctx.Process(target=_owner, args=(url, namespace, implementation, rooms[p], armed, cleared, stale))
        )
        neighbour = rooms[(p + 1) % processes]
        workers.append(
            ctx.Process(target=_aborter, args=(url, namespace, implementation, neighbour, armed, cleared, p))
        )
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
    exit_codes = [worker.exitcode for worker in workers]
    client = redis.Redis.from_url(url)
    # Room keys only (SCAN pattern {*} ends at the tag): a clear's tombstone ({room}:t) is meant to stay a while.
    survivors = sorted(k.decode() for k in client.scan_iter(match=f"kvstatus:{namespace}:{{*}}", count=1000))
    return {"survivors": survivors, "stale_starts": stale.value, "exit_codes": exit_codes}
