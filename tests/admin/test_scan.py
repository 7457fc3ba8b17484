"""The library side of ls / stats / watch: SCAN in bounded batches, on one node and on every cluster primary."""

from __future__ import annotations

import fakeredis
import pytest

from kvstatus import Backend, InvalidArgumentError, KVPoll, StatusStore
from kvstatus.admin.reads import iter_room_keys, iter_rooms
from kvstatus.admin.stats import collect_stats, ttl_bucket
from kvstatus.admin.watch import (
    ADVANCED,
    CLEARED,
    FAILED,
    NEW,
    Snapshot,
    classify,
    diff,
)
from kvstatus.keys import KeySchema
from tests.helpers.backends import fresh_namespace
from tests.servers import RedisClusterServers


def test_batches_are_bounded_and_cover_every_room_once() -> None:
    client = fakeredis.FakeRedis()
    store = StatusStore(client, namespace="ns")
    store.update_many({room: KVPoll.Bootstrapping for room in range(1000)})
    client.set("kvstatus:ns:not-a-room", "x")
    client.set("kvstatus:other:{5}", "x")
    batches = list(iter_room_keys(client, store.schema, batch=64))
    assert all(0 < len(b) <= 64 for b in batches)
    assert sorted(store.schema.room_of(k) for b in batches for k in b) == list(range(1000))
    seen = []
    rooms = [v.room for v in iter_rooms(client, store.schema, batch=100, progress=seen.append)]
    assert sorted(rooms) == list(range(1000)) and seen[-1] == 1000


def test_an_asyncio_client_is_refused_by_name() -> None:
    """The admin reads block: an asyncio client (or its backend) gets an error naming it, not a coroutine unpacked
    into a TypeError."""
    client = fakeredis.FakeAsyncRedis()
    for link in (client, Backend(client)):
        with pytest.raises(
            InvalidArgumentError,
            match=r"blocking redis-py client .* not an asyncio one \(fakeredis\..*\.FakeRedis\)",
        ):
            list(iter_room_keys(link, KeySchema("ns")))


def test_rooms_deleted_between_scan_and_read_are_skipped() -> None:
    client = fakeredis.FakeRedis()
    store = StatusStore(client, namespace="ns")
    store.update_many({1: KVPoll.Success, 2: KVPoll.Success})
    walk = iter_rooms(client, store.schema, batch=1)
    first = next(walk)
    store.clear(3 - first.room)
    assert list(walk) == []


@pytest.mark.parametrize(
    "before, after, kind",
    [
        (None, (("p", 1),), NEW),
        ((("p", 1),), None, CLEARED),
        ((("p", 1),), (("p", 3),), ADVANCED),
        ((("d", 1), ("p", 1)), (("d", 1), ("p", 0)), FAILED),
        ((("d", 1), ("p", 1)), (("p", 1),), CLEARED),
        ((("p", 0),), (("p", 0),), None),
        ((("p", 0),), (("p", 4),), ADVANCED),
    ],
)
def test_classify(before, after, kind) -> None:
    assert classify(before, after) == kind


def test_diff_between_snapshots() -> None:
    client = fakeredis.FakeRedis()
    store = StatusStore(client, namespace="ns")
    store.update_many({1: KVPoll.Bootstrapping, 2: KVPoll.Bootstrapping})
    before = Snapshot.take(client, store.schema)
    store.update_status(1, KVPoll.Failed)
    store.update_status(3, KVPoll.WaitingForInput)
    after = Snapshot.take(client, store.schema)
    assert [(c.kind, c.room) for c in diff(before, after)] == [(FAILED, 1), (NEW, 3)]
    assert after.by_status == {KVPoll.Failed: 1, KVPoll.Bootstrapping: 1, KVPoll.WaitingForInput: 1}


def test_stats_lists_the_rooms_with_least_ttl_left() -> None:
    client = fakeredis.FakeRedis()
    for room, ttl in [(1, 100), (2, 50), (3, 400), (4, 20)]:
        StatusStore(client, namespace="ns", ttl=ttl).update_status(room, KVPoll.Transferring)
    StatusStore(client, namespace="ns", ttl=5).update_status(5, KVPoll.Success)  # terminal: not listed
    stats = collect_stats(client, KeySchema("ns"), oldest=2)
    assert [v.room for v in stats.oldest] == [4, 2]
    assert ttl_bucket(None) == "no TTL" and ttl_bucket(5000) == "0-10s" and ttl_bucket(700_000) == ">600s"


@pytest.mark.real
@pytest.mark.slow
def test_scan_covers_every_cluster_primary(redis_cluster: RedisClusterServers) -> None:
    with redis_cluster.client() as client:
        store = StatusStore(client, namespace=fresh_namespace("cluster"))
        store.update_many({room: KVPoll.Transferring for room in range(300)})
        per_node = [
            len(list(node.scan_iter(match=store.schema.scan_pattern)))
            for node in (client.get_redis_connection(n) for n in client.get_primaries())
        ]
        assert len(per_node) == 3 and all(n > 0 for n in per_node) and sum(per_node) == 300
        assert sorted(v.room for v in iter_rooms(client, store.schema, batch=50)) == list(range(300))
        stats = collect_stats(client, store.schema)
        assert stats.rooms == 300 and stats.by_status[KVPoll.Transferring] == 300
        from kvstatus.admin.doctor import run_checks

        checks = {c.name: c for c in run_checks(client, store.schema)}
        assert checks["topology"].detail == "cluster with 3 primaries"
        assert all(c.ok for c in checks.values()), [c for c in checks.values() if not c.ok]


def test_watch_changes_reports_what_happened_between_refreshes() -> None:
    from kvstatus.admin.watch import watch_changes

    client = fakeredis.FakeRedis()
    store = StatusStore(client, namespace="ns")
    store.update_many({1: KVPoll.Bootstrapping, 2: KVPoll.Transferring, 3: KVPoll.Transferring})
    slept: list[float] = []

    def meanwhile(seconds: float) -> None:  # the cluster moves on while watch sleeps
        slept.append(seconds)
        store.update_status(1, KVPoll.Transferring)
        store.update_status(2, KVPoll.Failed)
        store.clear(3)
        store.update_status(4, KVPoll.Bootstrapping)

    refreshes = list(watch_changes(client, store.schema, 0.5, count=2, sleep=meanwhile))
    assert slept == [0.5] and refreshes[0][1] == []
    assert [(c.kind, c.room) for c in refreshes[1][1]] == [(ADVANCED, 1), (FAILED, 2), (CLEARED, 3), (NEW, 4)]
