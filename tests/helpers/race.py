"""The late-abort race across processes: each room's lifecycle in one process, its aborts in another.

Process i runs Bootstrapping -> WaitingForInput -> Transferring -> Success ->
clear for its rooms, twice (room ids are reused). Process i+1 aborts those
rooms: once at a random moment while the lifecycle runs, and once after the
room was cleared (the late abort). Afterwards no room may exist, and the
second request on a room must never start from a leftover status.
"""

from __future__ import annotations

import multiprocessing
import random
import time
from typing import Any

import redis

from kvstatus import KVPoll, Outcome, StatusStore

LIFECYCLE = (KVPoll.Bootstrapping, KVPoll.WaitingForInput, KVPoll.Transferring, KVPoll.Success)
ROUNDS = 2


class PreFixStore:
    """The rule before the upstream fix: an abort writes Failed even when the room is gone."""

    def __init__(self, client: redis.Redis, namespace: str) -> None:
        self._store = StatusStore(client, namespace=namespace)
        self._client = client

    def update_status(self, room: int, status: KVPoll) -> Any:
        if status == KVPoll.Failed:
            key = self._store.keys.room_key(room)
            self._client.hset(key, self._store.participant, "0")
            self._client.pexpire(key, 600_000)
            return None
        return self._store.update_status(room, status)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def _store(url: str, namespace: str, implementation: str) -> Any:
    client = redis.Redis.from_url(url)
    if implementation == "prefix":
        return PreFixStore(client, namespace)
    return StatusStore(client, namespace=namespace)


def _owner(url: str, namespace: str, implementation: str, rooms: list[int], cleared: Any, stale: Any) -> None:
    store = _store(url, namespace, implementation)
    for round_ in range(ROUNDS):
        for room in rooms:
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


def _aborter(url: str, namespace: str, implementation: str, rooms: list[int], cleared: Any, seed: int) -> None:
    store = _store(url, namespace, implementation)
    rng = random.Random(seed)
    for round_ in range(ROUNDS):
        for room in rooms:
            if rng.random() < 0.5:
                time.sleep(rng.random() / 2000)
                store.update_status(room, KVPoll.Failed)  # races the lifecycle
            deadline = time.monotonic() + 10
            while cleared[room] != round_ + 1 and time.monotonic() < deadline:
                time.sleep(0.0002)
            store.update_status(room, KVPoll.Failed)  # arrives after clear()
            cleared[room] = -(round_ + 1)


def run_race(url: str, namespace: str, implementation: str, processes: int = 8, rooms_each: int = 25) -> dict:
    """Run the race; returns surviving room keys and how many second requests started from a leftover."""
    ctx = multiprocessing.get_context("fork")
    rooms = [[p * rooms_each + i for i in range(rooms_each)] for p in range(processes)]
    cleared = ctx.Array("i", processes * rooms_each, lock=False)
    stale = ctx.Value("i", 0)
    workers = []
    for p in range(processes):
        workers.append(ctx.Process(target=_owner, args=(url, namespace, implementation, rooms[p], cleared, stale)))
        neighbour = rooms[(p + 1) % processes]
        workers.append(ctx.Process(target=_aborter, args=(url, namespace, implementation, neighbour, cleared, p)))
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
    exit_codes = [worker.exitcode for worker in workers]
    client = redis.Redis.from_url(url)
    survivors = sorted(k.decode() for k in client.scan_iter(match=f"kvstatus:{namespace}:*", count=1000))
    return {"survivors": survivors, "stale_starts": stale.value, "exit_codes": exit_codes}
