"""Issue 20 item 4: health per prefill-decode pair over a sliding window, from one pass over room hashes and
their tombstones, by Redis' clock. Rooms are built by stores with timeline=True; a stuck room's timeline is
written by hand with an old time (no test sleeps out a bound)."""

from __future__ import annotations

from typing import Any

import pytest

from kvstatus import KVPoll
from kvstatus.admin.health import (
    NONE,
    UNKNOWN_STAGE,
    HealthSettings,
    iter_keys,
    pairs_of,
    read_health,
)
from kvstatus.admin.reads import server_ms
from kvstatus.keys import KeySchema
from kvstatus.model import ClearedEntry, RoomView, Tombstone
from tests.helpers.backends import RedisUnderTest

WALK = (KVPoll.Bootstrapping, KVPoll.WaitingForInput, KVPoll.Transferring, KVPoll.Success)


def stores(backend: RedisUnderTest, *names: str) -> list[Any]:
    return [backend.store(participant=name, timeline=True) for name in names]


def succeed(room: int, *sides: Any) -> None:
    for status in WALK:
        for side in sides:
            side.update_status(room, status)
    for side in sides:
        assert side.pop(room) is KVPoll.Success


def make_stuck(backend: RedisUnderTest, room: int, *names: str, seconds: float = 60.0) -> None:
    """Entries whose timelines say they reached their status ``seconds`` ago (Redis' clock)."""
    key = KeySchema(backend.namespace).room_key(room)
    old = server_ms(backend.raw) - int(seconds * 1000)
    for name in names:
        status = int(backend.raw.hget(key, name))
        backend.raw.hset(key, f"t:{name}", f"{status}@{old}")


def build(backend: RedisUnderTest) -> None:
    """Pair (prefill-a, decode-b) served 2 rooms and failed 1; pair (prefill-c, decode-d) served nothing: a
    cancel, a stuck room, a room failed and cleared by both sides (only its tombstone is left); prefill-e's
    room has no decode at all and is stuck; router-x's room has no pair."""
    a0, a1, b = stores(backend, "prefill-a-tp0-pp0", "prefill-a-tp1-pp0", "decode-b-tp0-pp0")
    c, d = stores(backend, "prefill-c-tp0-pp0", "decode-d-tp0-pp0")
    (e,) = stores(backend, "prefill-e-tp0-pp0")
    (x,) = stores(backend, "router-x")
    succeed(1, a0, a1, b)
    succeed(2, a0, a1, b)
    for side, status in ((a0, KVPoll.Transferring), (a1, KVPoll.Transferring), (b, KVPoll.WaitingForInput)):
        side.update_status(3, KVPoll.Bootstrapping)
        side.update_status(3, status)
    a0.record_failure(3, "NIXL transfer timed out")
    a0.update_status(3, KVPoll.Failed)
    for side in (c, d):
        side.update_status(10, KVPoll.Bootstrapping)
        side.update_status(11, KVPoll.Bootstrapping)
        side.update_status(12, KVPoll.Bootstrapping)
    c.cancel(10, "client went away", origin="router-0")
    d.update_status(11, KVPoll.WaitingForInput)
    make_stuck(backend, 11, "prefill-c-tp0-pp0", "decode-d-tp0-pp0")
    c.update_status(12, KVPoll.Failed)
    c.clear(12)
    d.clear(12)
    e.update_status(20, KVPoll.Bootstrapping)
    make_stuck(backend, 20, "prefill-e-tp0-pp0")
    x.update_status(30, KVPoll.Bootstrapping)


@pytest.fixture
def sync_pd(sync_backend: RedisUnderTest) -> RedisUnderTest:
    build(sync_backend)
    return sync_backend


def test_counts_and_verdicts_per_pair(sync_pd: RedisUnderTest) -> None:
    schema = KeySchema(sync_pd.namespace)
    assert not sync_pd.raw.exists(schema.room_key(12)) and sync_pd.raw.exists(schema.tombstone_key(12))
    health = read_health(sync_pd.raw, schema, batch=3)  # small batches: rooms and tombstones in different ones
    found = {(p.prefill, p.decode): p.to_json() for p in health.pairs}
    assert found == {
        ("prefill-a", "decode-b"): {
            "prefill": "prefill-a",
            "decode": "decode-b",
            "succeeded": 2,
            "failed": 1,
            "failed_by_stage": {"transfer": 1},
            "stuck": 0,
            "open": 0,
            "dead": [],
            "verdict": "healthy",
        },
        ("prefill-c", "decode-d"): {
            "prefill": "prefill-c",
            "decode": "decode-d",
            "succeeded": 0,
            "failed": 2,
            "failed_by_stage": {"cancelled": 1, UNKNOWN_STAGE: 1},
            "stuck": 1,
            "open": 0,
            "dead": [],
            "verdict": "UNHEALTHY",
        },
        ("prefill-e", NONE): {
            "prefill": "prefill-e",
            "decode": NONE,
            "succeeded": 0,
            "failed": 0,
            "failed_by_stage": {},
            "stuck": 1,
            "open": 0,
            "dead": [],
            "verdict": "UNHEALTHY",
        },
    }
    assert not health.healthy
    assert [p.name for p in health.unhealthy] == ["prefill-c,decode-d", f"prefill-e,{NONE}"]
    assert health.rooms == 8 and health.unpaired == 1 and health.corrupted == 0
    assert abs(health.now_ms - server_ms(sync_pd.raw)) < 5_000


def test_threshold_and_older_than(sync_pd: RedisUnderTest) -> None:
    schema = KeySchema(sync_pd.namespace)
    lenient = read_health(sync_pd.raw, schema, HealthSettings(threshold=4))
    assert lenient.healthy  # c-d: 2 failed + 1 stuck < 4; e: 1 stuck
    patient = read_health(sync_pd.raw, schema, HealthSettings(older_than=120))
    pair = patient.pair("prefill-e", NONE)
    assert pair is not None and (pair.stuck, pair.open, pair.unhealthy) == (0, 1, False)


def test_outcomes_before_the_window_are_not_counted(sync_pd: RedisUnderTest) -> None:
    schema = KeySchema(sync_pd.namespace)
    now = server_ms(sync_pd.raw)
    old = now - 50_000
    tomb = schema.tombstone_key(40)
    sync_pd.raw.hset(tomb, mapping={"prefill-f-tp0-pp0": f"{old} 4", "decode-g-tp0-pp0": f"{old} 4"})
    sync_pd.raw.pexpire(tomb, 60_000)
    room = schema.room_key(41)
    sync_pd.raw.hset(room, mapping={"prefill-h-tp0-pp0": "0", "room:fate": f"{old}:bootstrap:prefill-h-tp0-pp0:x"})
    sync_pd.raw.pexpire(room, 600_000)
    wide = read_health(sync_pd.raw, schema, HealthSettings(window=60))
    assert wide.pair("prefill-f", "decode-g") is not None and wide.pair("prefill-f", "decode-g").succeeded == 1  # type: ignore[union-attr]
    assert wide.pair("prefill-h", NONE).failed == {"bootstrap": 1}  # type: ignore[union-attr]
    narrow = read_health(sync_pd.raw, schema, HealthSettings(window=30))
    assert narrow.pair("prefill-f", "decode-g") is None and narrow.pair("prefill-h", NONE) is None
    assert narrow.pair("prefill-a", "decode-b").succeeded == 2  # type: ignore[union-attr]


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="at most the tombstone TTL"):
        HealthSettings(window=61)
    assert HealthSettings(window=60).window == 60  # the tombstones' TTL, the widest window
    for bad in ({"window": 0}, {"older_than": 0}, {"threshold": 0}, {"threshold": True}):
        with pytest.raises(ValueError):
            HealthSettings(**bad)  # type: ignore[arg-type]


def test_pairs_of_folds_ranks_and_names_a_missing_side() -> None:
    tomb = Tombstone({"decode-b-tp1-pp0": ClearedEntry(1.0, KVPoll.Success)}, None)
    view = RoomView(1, {}, None, tomb)
    assert pairs_of(view) == [(NONE, "decode-b")]
    assert pairs_of(RoomView(2, {}, None)) == []


@pytest.mark.real
def test_one_scan_over_every_primary_of_a_cluster(redis_cluster: Any) -> None:
    from tests.conftest import _cluster_backend

    backend = _cluster_backend(redis_cluster, False)
    try:
        build(backend)
        schema = KeySchema(backend.namespace)
        keys = [key for batch in iter_keys(backend.raw, schema, 2) for key in batch]
        assert schema.tombstone_key(12) in keys and schema.room_key(1) not in keys
        health = read_health(backend.raw, schema)
        assert [p.name for p in health.unhealthy] == ["prefill-c,decode-d", f"prefill-e,{NONE}"]
        assert health.pair("prefill-a", "decode-b").succeeded == 2  # type: ignore[union-attr]
    finally:
        backend.close()
