"""Presence through a failover (issue 33's budget: 0 false failures): a Sentinel failover, and the kill of the
cluster primary that holds the namespace's presence channels. No room fails while the servers move; once they
have, the watch sees its peers again on the new primary, and a peer that dies there is still seen in a second.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import pytest

from kvstatus import KVPoll, StatusStore
from kvstatus.leasestate import died_reason
from tests.helpers.backends import fresh_namespace
from tests.servers import RedisClusterServers, RedisSentinelServers

# As tests/torture/test_failover.py: a resend budget above the slowest failover of these small groups.
FAILOVER_BUDGET = {"retries": 7, "deadline": 10.0}
ROOM = 4242
BOUND = 60.0


def _until(condition: Callable[[], bool], what: str) -> None:
    ends = time.monotonic() + BOUND
    while not condition():
        assert time.monotonic() < ends, f"not within {BOUND:g} s: {what}"
        time.sleep(0.05)


def _seen(store: StatusStore, name: str) -> bool:
    peer = store._keeper.watch._peers.get(name)  # type: ignore[union-attr]
    return peer is not None and peer.seen


def _through(url: str, namespace: str, fail_over: Callable[[], Any]) -> None:
    decode = StatusStore.from_url(url, namespace=namespace, participant="decode-0", lease_ttl=10, **FAILOVER_BUDGET)
    prefill = StatusStore.from_url(url, namespace=namespace, participant="prefill-0", lease_ttl=10, **FAILOVER_BUDGET)
    try:
        prefill.update_status(ROOM, KVPoll.Bootstrapping)
        decode.update_status(ROOM, KVPoll.WaitingForInput)
        _until(lambda: _seen(decode, "prefill-0"), "the decode saw the prefill's presence")
        fail_over()
        ends = time.monotonic() + 5.0  # the servers have moved: nobody died, nothing fails
        while time.monotonic() < ends:
            assert decode.get(ROOM) is KVPoll.WaitingForInput, decode.room(ROOM)
            time.sleep(0.05)
        _until(lambda: _seen(decode, "prefill-0"), "the decode saw the prefill again, on the new primary")
        keeper = prefill._keeper
        assert keeper is not None
        keeper._background.stop()  # what a SIGKILL leaves: no renewals, and Redis drops its presence
        keeper.presence.drop()
        _until(lambda: decode.get(ROOM) is KVPoll.Failed, "the room failed after the prefill died")
        assert decode.failure(ROOM).reason == died_reason("prefill-0")
    finally:
        decode.close()
        prefill.close()


@pytest.mark.real
def test_a_sentinel_failover_fails_nothing_and_presence_follows_it() -> None:
    with RedisSentinelServers(password="data-pw") as group:
        old = group.current_master_address()
        _through(group.url, fresh_namespace("presfo"), group.failover)
        assert group.current_master_address() != old


@pytest.mark.real
def test_the_kill_of_the_presence_primary_fails_nothing_and_presence_follows_it() -> None:
    with RedisClusterServers(masters=3, replicas=1) as cluster:
        namespace = fresh_namespace("presck")
        channel = f"kvstatus:{namespace}:presence:{{{namespace}}}:prefill-0"
        with cluster.client() as client:
            node = client.get_node_from_key(channel)
        victim = next(m for m in cluster.masters() if m.port == node.port)

        def kill_primary() -> None:
            victim.kill()
            cluster.wait_healthy()

        _through(cluster.url, namespace, kill_primary)
        assert victim.port not in {m.port for m in cluster.masters()}
