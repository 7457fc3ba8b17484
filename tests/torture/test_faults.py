"""Workers SIGKILLed mid-run leave nothing behind one TTL later; a Redis killed and restarted mid-load
is recovered from without lying about writes."""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing
import os
import random
import signal
import threading
import time
from typing import Any, Callable, NamedTuple, Optional

import pytest
import redis

from kvstatus import (
    AsyncStatusStore,
    BackendUnavailableError,
    KVPoll,
    Outcome,
    StatusStore,
    scripts,
)
from tests.helpers.backends import fresh_namespace
from tests.servers import RedisServer

pytestmark = pytest.mark.real

CRASH_TTL = 1.0  # seconds


def _crash_worker(url: str, namespace: str, seed: int) -> None:
    rng = random.Random(seed)
    store = StatusStore.from_url(url, namespace=namespace, participant=f"w{seed}", ttl=CRASH_TTL)
    for room in itertools.count(seed * 10**9):
        store.update_status(room, KVPoll.Bootstrapping)
        store.update_status(room, KVPoll.Transferring)
        if rng.random() < 0.3:
            store.record_failure(room, "transfer timed out")
            store.update_status(room, KVPoll.Failed)
        if rng.random() < 0.5:
            store.clear(room)  # the rest stay in flight when the worker dies


def _keys_and_ttls(client: redis.Redis, namespace: str) -> dict[bytes, int]:
    keys = list(client.scan_iter(match=f"kvstatus:{namespace}:*", count=1000))
    with client.pipeline(transaction=False) as pipe:
        for key in keys:
            pipe.pttl(key)
        return dict(zip(keys, pipe.execute()))


def test_sigkilled_workers_leave_no_key_after_one_ttl(redis_server: RedisServer) -> None:
    namespace = fresh_namespace("crash")
    ctx = multiprocessing.get_context("fork")
    workers = [ctx.Process(target=_crash_worker, args=(redis_server.url, namespace, i)) for i in range(4)]
    for worker in workers:
        worker.start()
    client = redis_server.client()
    without_ttl: set[bytes] = set()
    seen = 0
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        ttls = _keys_and_ttls(client, namespace)
        seen = max(seen, len(ttls))
        without_ttl |= {key for key, ttl in ttls.items() if ttl == -1}
    for worker in workers:
        os.kill(worker.pid, signal.SIGKILL)
    for worker in workers:
        worker.join(timeout=10)
    killed_at = time.monotonic()
    assert [worker.exitcode for worker in workers] == [-signal.SIGKILL] * 4
    assert seen > 0 and _keys_and_ttls(client, namespace), "the workers wrote nothing before they died"
    while (left := _keys_and_ttls(client, namespace)) and time.monotonic() < killed_at + CRASH_TTL + 0.5:
        without_ttl |= {key for key, ttl in left.items() if ttl == -1}
        time.sleep(0.02)
    assert left == {}, f"{len(left)} keys outlived their {CRASH_TTL} s TTL"
    assert without_ttl == set()
    client.close()


class Attempt(NamedTuple):
    client: str
    room: int
    start: float
    end: float
    outcome: Optional[Outcome]
    error: Optional[BaseException]


def _hammer(
    name: str, call: Callable[[int], Any], rooms: itertools.count, stop: threading.Event, out: list[Attempt]
) -> None:
    while not stop.is_set():
        room = next(rooms)
        start = time.monotonic()
        try:
            result = call(room)
        except Exception as exc:  # noqa: BLE001 - reported to the caller
            out.append(Attempt(name, room, start, time.monotonic(), None, exc))
        else:
            out.append(Attempt(name, room, start, time.monotonic(), result.outcome, None))


def test_clients_ride_out_a_redis_restart_without_lying() -> None:
    namespace = fresh_namespace("restart")
    server = RedisServer(extra_args=["--save", "", "--appendonly", "no"]).start()
    patient = StatusStore.from_url(server.url, namespace=namespace)  # default retries: about 3 s of backoff
    impatient = StatusStore.from_url(server.url, namespace=namespace, retries=1)
    loop = asyncio.new_event_loop()
    aio = AsyncStatusStore.from_url(server.url, namespace=namespace, retries=1)
    rooms = itertools.count(1)
    stop = threading.Event()
    attempts: list[Attempt] = []
    callers = {
        "patient": lambda room: patient.update_status(room, KVPoll.Bootstrapping),
        "impatient": lambda room: impatient.update_status(room, KVPoll.Bootstrapping),
        "async": lambda room: loop.run_until_complete(aio.update_status(room, KVPoll.Bootstrapping)),
    }
    threads = [
        threading.Thread(target=_hammer, args=(name, call, rooms, stop, attempts)) for name, call in callers.items()
    ]
    try:
        for thread in threads:
            thread.start()
        time.sleep(0.5)
        server.kill()
        killed = time.monotonic()
        time.sleep(0.6)
        server.restart()
        restarted = time.monotonic()
        time.sleep(1.0)
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
        raw = server.client()
        stored = {
            StatusStore(raw, namespace=namespace).schema.room_of(k)
            for k in raw.scan_iter(match=f"kvstatus:{namespace}:*", count=1000)
        }
        reloaded = raw.script_exists(scripts.UPDATE.sha)  # the restarted server started with no scripts
        raw.close()
    finally:
        stop.set()
        server.stop()
        loop.close()

    assert reloaded == [True]
    unexpected = [a for a in attempts if a.error is not None and not isinstance(a.error, BackendUnavailableError)]
    assert unexpected == []
    failures = [a for a in attempts if a.error is not None]
    assert failures, "no call failed: the outage was not observed"
    assert all(killed - 0.5 <= a.end and a.start <= restarted for a in failures)
    for name in callers:
        recovered = [a for a in attempts if a.client == name and a.error is None and a.start > restarted]
        assert recovered, f"{name} did not recover after the restart"
    confirmed_after_kill = [a for a in attempts if a.error is None and a.start > killed]
    assert confirmed_after_kill
    assert all(a.outcome in (Outcome.CREATED, Outcome.UNCHANGED) for a in attempts if a.error is None)
    lost = [a for a in confirmed_after_kill if a.room not in stored]
    assert lost == [], f"{len(lost)} writes reported as applied are not in Redis"
