"""The near cache and wait_for on Sentinel and Cluster: failover and slot moves empty the cache."""

from __future__ import annotations

import time

import pytest
from redis.cluster import key_slot

from kvstatus import KVPoll, NearCacheOptions, StatusStore
from tests.helpers.backends import fresh_namespace
from tests.nearcache.helpers import eventually
from tests.servers import RedisClusterServers, RedisSentinelServers

pytestmark = [pytest.mark.real, pytest.mark.slow]


def _flushed(store: StatusStore, since: int) -> bool:
    try:
        store.near_cache.check()
    except Exception:  # noqa: BLE001 - the check itself may meet the failover
        return False
    return store.near_cache.state.flushes > since


@pytest.mark.real
def test_sentinel_failover_empties_the_cache_and_follows_the_new_master() -> None:
    with RedisSentinelServers(password="data-pw") as group:
        namespace = fresh_namespace("nc")
        with (
            StatusStore.from_url(group.url, namespace=namespace, participant="w") as writer,
            StatusStore.from_url(group.url, namespace=namespace, participant="w", near_cache=True) as cached,
        ):
            writer.update_many({r: KVPoll.Bootstrapping for r in range(20)})
            assert cached.get_many(range(20)) == {r: KVPoll.Bootstrapping for r in range(20)}
            flushes = cached.near_cache.state.flushes
            old = group.current_master_address()
            group.failover()
            assert group.current_master_address() != old
            eventually(lambda: _flushed(cached, flushes), timeout=30, what="cache emptied by the failover")
            writer.update_status(3, KVPoll.Transferring)  # on the new master
            eventually(lambda: cached.get(3) == KVPoll.Transferring, timeout=30)
            writer.update_status(3, KVPoll.Success)  # tracked on the new master too
            eventually(lambda: cached.get(3) == KVPoll.Success, timeout=30)
            got = writer.wait_for(3, KVPoll.Success, timeout=10)
            assert got == KVPoll.Success
            _told_by_push(writer, 4)  # the watch is on the new master, not a default address


def _told_by_push(store: StatusStore, room: int) -> None:
    """Wait for ``room`` to reach Success with the recheck and the poll beyond the wait: only the watch's push
    can deliver it (the update comes after the waiter's first read)."""
    import threading

    from kvstatus._sync.store import wait_for

    read_once = threading.Event()

    cache = store._waits_cache()
    assert cache is not None

    def read() -> object:
        status = cache.get(room, ("w", True))
        read_once.set()
        return status

    def update() -> None:
        read_once.wait(30)
        store.update_status(room, KVPoll.Success)

    thread = threading.Thread(target=update, daemon=True)
    thread.start()
    assert wait_for(cache, room, KVPoll.Success, 30, read, 5.0, recheck=60, poll_interval=60) == KVPoll.Success
    thread.join()


@pytest.mark.real
def test_cluster_cache_follows_every_shard_and_a_moved_slot() -> None:
    with RedisClusterServers(masters=3) as cluster:
        namespace = fresh_namespace("nc")
        options = NearCacheOptions(max_staleness=0.2)
        with (
            StatusStore.from_url(cluster.url, namespace=namespace, participant="w") as writer,
            StatusStore.from_url(cluster.url, namespace=namespace, participant="w", near_cache=options) as cached,
        ):
            rooms = list(range(200))
            writer.update_many({r: KVPoll.Bootstrapping for r in rooms[:100]})
            expected = {r: (KVPoll.Bootstrapping if r < 100 else None) for r in rooms}
            assert cached.get_many(rooms) == expected
            assert len(cached.near_cache.links.links) == 3  # one link per primary
            writer.update_many({r: KVPoll.Transferring for r in rooms[::7]})
            eventually(lambda: all(cached.get_many(rooms)[r] == KVPoll.Transferring for r in rooms[::7]))

            # Move the (empty) slot of a room cached as absent to another primary: no key changes on the
            # old owner, so only the slot map check can tell the cache.
            room = 150
            slot = key_slot(writer._core.schema.room_key(room).encode())
            raw = cluster.client()
            owner = raw.nodes_manager.get_node_from_slot(slot)
            target = next(n for n in raw.get_primaries() if n.name != owner.name)
            target_id = raw.execute_command("CLUSTER", "MYID", target_nodes=target)
            target_id = target_id.decode() if isinstance(target_id, bytes) else target_id
            flushes = cached.near_cache.state.flushes
            for node in [target] + [n for n in raw.get_primaries() if n.name != target.name]:
                raw.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id, target_nodes=node)
            time.sleep(0.3)
            writer.client.nodes_manager.initialize()
            writer.update_status(room, KVPoll.WaitingForInput)  # lands on the new owner
            eventually(lambda: cached.get(room) == KVPoll.WaitingForInput, what="the moved room's change")
            assert cached.near_cache.state.flushes > flushes
            assert any("slot" in reason or "MOVED" in reason for reason in cached.near_cache.state.flush_reasons)
            writer.update_status(room, KVPoll.Success)
            eventually(lambda: cached.get(room) == KVPoll.Success)
            assert writer.wait_for(room, KVPoll.Success, timeout=10) == KVPoll.Success


@pytest.mark.real
def test_cluster_wait_for_is_told_by_the_node_of_each_room() -> None:
    """The waits' near cache reads each room on its own primary: with the recheck beyond the wait, only that
    node's invalidation can wake the waiter, for a room on every primary."""
    with RedisClusterServers(masters=3) as cluster:
        namespace = fresh_namespace("nc")
        with StatusStore.from_url(cluster.url, namespace=namespace, participant="w") as writer:
            nodes: dict[str, int] = {}
            for room in range(100):
                node = writer.client.nodes_manager.get_node_from_slot(
                    key_slot(writer._core.schema.room_key(room).encode())
                )
                nodes.setdefault(node.name, room)
            assert len(nodes) == 3
            for room in nodes.values():
                _told_by_push(writer, room)
