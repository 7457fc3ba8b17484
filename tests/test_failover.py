"""Failover on real servers: a cluster master killed, a Sentinel failover mid-workload.

The store must keep working without surfacing an error (its resend budget,
ConnectionOptions.retry_delays(), covers the failover), and afterwards every
room's state must be one its own history explains: possibly behind (writes the
old master acknowledged but had not replicated), never resurrected, never
without TTL.
"""

from __future__ import annotations

import threading
import time

import fakeredis
import pytest

from kvstatus import KVPoll, StatusStore
from kvstatus.embedded import RedisClusterServers, RedisSentinelServers
from tests.failover import Workload
from tests.support import fresh_namespace, require_redis_server

# A resend budget above the slowest failover these small groups take (node timeout 1 s,
# down-after 1 s): 0.1+0.2+0.4+0.8+1.6+2+2 = 7.1 s. The default 3.1 s is tight here.
FAILOVER_BUDGET = {"retries": 7}


def _run_through(workload: Workload, fail_over) -> float:
    """Run ``workload`` in a thread while ``fail_over()`` runs here; seconds the failover took."""
    stop = threading.Event()
    thread = threading.Thread(target=workload.run_until, args=(stop,))
    for _ in range(5):
        workload.step()
    thread.start()
    started = time.monotonic()
    try:
        fail_over()
        took = time.monotonic() - started
        steps_before = workload.steps
        while workload.steps < steps_before + 5 and thread.is_alive():
            time.sleep(0.05)  # the store keeps working on the new topology
    finally:
        stop.set()
        thread.join(timeout=60)
    return took


@pytest.mark.real
def test_store_follows_a_promoted_cluster_replica() -> None:
    require_redis_server()
    with RedisClusterServers(masters=3, replicas=1) as cluster:
        store = StatusStore.from_url(cluster.url, namespace=fresh_namespace("failover"), **FAILOVER_BUDGET)
        workload = Workload(store)
        victim = cluster.masters()[0]

        def kill_master() -> None:
            victim.kill()
            cluster.wait_healthy()

        took = _run_through(workload, kill_master)
        assert victim.port not in {m.port for m in cluster.masters()}
        assert workload.errors == [], f"errors surfaced during a {took:.1f} s failover"
        assert workload.audit(cluster.client()) == []
        assert store.update_many({r: KVPoll.Bootstrapping for r in range(1000, 1100)})[1099].status is not None
        print(f"\ncluster failover: {took:.1f} s, {workload.steps} steps, slowest call {workload.slowest_call:.2f} s")


@pytest.mark.real
def test_store_follows_a_sentinel_failover() -> None:
    require_redis_server()
    with RedisSentinelServers(password="data-pw") as group:
        store = StatusStore.from_url(group.url, namespace=fresh_namespace("failover"), **FAILOVER_BUDGET)
        workload = Workload(store)
        old = group.current_master_address()
        took = _run_through(workload, group.failover)
        assert group.current_master_address() != old
        assert workload.errors == [], f"errors surfaced during a {took:.1f} s failover"
        assert workload.audit(group.client()) == []
        print(f"\nsentinel failover: {took:.1f} s, {workload.steps} steps, slowest call {workload.slowest_call:.2f} s")


def test_the_audit_catches_resurrected_rooms_and_keys_without_ttl() -> None:
    raw = fakeredis.FakeRedis()
    store = StatusStore(raw, namespace="audit")
    workload = Workload(store, rooms=200)
    for _ in range(3):
        workload.step()
    assert workload.audit(raw) == []
    untouched = next(r for r in range(200) if not workload.history[r])
    raw.hset(store.keys.room_key(untouched), store.participant, "0")  # a late abort resurrecting a room
    never_success = next(r for r in range(200) if workload.history[r]
                         and all(change != KVPoll.Success for change, _ in workload.history[r]))
    raw.hset(store.keys.room_key(never_success), store.participant, "4")
    problems = workload.audit(raw)
    assert any(f"room {untouched} is {KVPoll.Failed!r}" in p for p in problems)
    assert any(f"{{{untouched}}} has no TTL" in p for p in problems)
    assert any(f"room {never_success} is {KVPoll.Success!r}" in p for p in problems)
