"""A Stats attribute and the JSON key of the same name hold the same thing (a count is a count, a sample a sample)."""

from __future__ import annotations

import dataclasses

import fakeredis

from kvstatus import KVPoll, StatusStore
from kvstatus.admin.stats import Stats, collect_stats
from kvstatus.keys import KeySchema


def test_attributes_and_json_keys_of_the_same_name_agree() -> None:
    client = fakeredis.FakeRedis()
    store = StatusStore(client, namespace="names", participant="p")
    store.update_status(1, KVPoll.Transferring)
    schema = KeySchema("names")
    client.hset(schema.room_key(2), "p", "1")  # a leak: no TTL
    client.hset(schema.room_key(3), "p", "x")  # corrupted
    client.pexpire(schema.room_key(3), 60_000)
    stats = collect_stats(client, schema)
    document = stats.to_json()
    shared = [f.name for f in dataclasses.fields(Stats) if f.name in document]
    assert {"keys_without_ttl", "keys_without_ttl_sample", "corrupted_rooms", "corrupted_sample"} <= set(shared)
    for name in shared:
        value = getattr(stats, name)
        assert document[name] == (dict(value) if isinstance(value, dict) else value) or name in {
            "by_status",
            "by_participant",
            "ttl_left",
        }, name  # Counters are rendered by status name
    assert (stats.keys_without_ttl, stats.keys_without_ttl_sample) == (1, [2])
    assert stats.corrupted_rooms == 1 and len(stats.corrupted_sample) == 1
