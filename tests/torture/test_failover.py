"""Failover on real servers: a cluster master killed, a Sentinel failover mid-workload.

The store must keep working without surfacing an error (its resend budget,
ConnectionOptions.retry_delays(), covers the failover), and afterwards every
room's state must be one its own history explains: possibly behind (writes the
old master acknowledged but had not replicated), never resurrected, never
without TTL.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Callable

import pytest

from kvstatus import AsyncStatusStore, KVPoll, StatusStore
from tests.helpers.backends import SyncAdapter, fresh_namespace
from tests.helpers.failover import Workload
from tests.servers import RedisClusterServers, RedisSentinelServers

# A resend budget above the slowest failover these small groups take (node timeout 1 s,
# down-after 1 s): 0.1+0.2+0.4+0.8+1.6+2+2 = 7.1 s, within a 10 s deadline. The defaults (3.1 s, 5 s) are
# tight here.
FAILOVER_BUDGET = {"retries": 7, "deadline": 10.0}


def _run_through(workloads: list[Workload], fail_over: Callable[[], object]) -> float:
    """Run each workload in its own thread while ``fail_over()`` runs here; seconds the failover took."""
    stop = threading.Event()
    threads = [threading.Thread(target=w.run_until, args=(stop,)) for w in workloads]
    for workload in workloads:
        for _ in range(5):
            workload.step()
    for thread in threads:
        thread.start()
    started = time.monotonic()
    try:
        fail_over()
        took = time.monotonic() - started
        targets = [w.steps + 5 for w in workloads]
        while any(w.steps < t for w, t in zip(workloads, targets)) and all(t.is_alive() for t in threads):
            time.sleep(0.05)  # the stores keep working on the new topology
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
    return took


def _workloads(url: str) -> tuple[list[Workload], Callable[[], None]]:
    """A sync and an async store on ``url`` (separate namespaces), each driven by a Workload."""
    loop = asyncio.new_event_loop()
    sync_store = StatusStore.from_url(url, namespace=fresh_namespace("failover"), **FAILOVER_BUDGET)
    async_store = AsyncStatusStore.from_url(url, namespace=fresh_namespace("afailover"), **FAILOVER_BUDGET)

    def close() -> None:
        sync_store.close()
        loop.run_until_complete(async_store.close())
        loop.close()

    return [Workload(sync_store), Workload(SyncAdapter(async_store, loop), seed=8)], close


def _report(kind: str, took: float, workloads: list[Workload]) -> None:
    for name, w in zip(("sync", "async"), workloads):
        print(
            f"\n{kind} failover {took:.1f} s; {name} store: {w.steps} steps, "
            f"slowest call {w.slowest_call:.2f} s, errors {len(w.errors)}"
        )


@pytest.mark.real
def test_store_follows_a_promoted_cluster_replica() -> None:
    with RedisClusterServers(masters=3, replicas=1) as cluster:
        workloads, close = _workloads(cluster.url)
        victim = cluster.masters()[0]

        def kill_master() -> None:
            victim.kill()
            cluster.wait_healthy()

        try:
            took = _run_through(workloads, kill_master)
            _report("cluster", took, workloads)
            assert victim.port not in {m.port for m in cluster.masters()}
            for workload in workloads:
                assert workload.errors == [], f"errors surfaced during a {took:.1f} s failover"
                assert workload.audit(cluster.client()) == []
            promoted = next(m for m in cluster.masters() if m.port not in {n.port for n in cluster.nodes[:3]})
            with promoted.client() as client:
                client.script_flush()  # NOSCRIPT on the promoted replica heals inside a batch
            store = workloads[0].store
            results = store.update_many({r: KVPoll.Bootstrapping for r in range(1000, 1300)})
            assert all(r.status is not None for r in results.values())
        finally:
            close()


@pytest.mark.real
def test_store_follows_a_sentinel_failover() -> None:
    with RedisSentinelServers(password="data-pw") as group:
        workloads, close = _workloads(group.url)
        old = group.current_master_address()
        try:
            took = _run_through(workloads, group.failover)
            _report("sentinel", took, workloads)
            assert group.current_master_address() != old
            for workload in workloads:
                assert workload.errors == [], f"errors surfaced during a {took:.1f} s failover"
                assert workload.audit(group.client()) == []
        finally:
            close()
