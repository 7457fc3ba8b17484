"""The store's API on every backend: reads, clear, failure reasons, TTLs, batches, errors."""

from __future__ import annotations

import itertools

import pytest
from redis.cluster import key_slot

from kvstatus import (
    CorruptedValueError,
    InvalidArgumentError,
    InvalidNameError,
    InvalidRoomError,
    InvalidStatusError,
    KVPoll,
    Outcome,
    RoomView,
)
from kvstatus.keys import MAX_REASON_BYTES
from tests.helpers.backends import RedisUnderTest

BAD_ROOMS = [True, False, -1, 2**63, 1.0, "1", None, b"1"]
BAD_STATUSES = [True, -1, 5, 2.0, "Failed", None]


def test_check_status_raises_key_error_when_absent(backend: RedisUnderTest) -> None:
    store = backend.store()
    with pytest.raises(KeyError) as info:
        store.check_status(5)
    assert info.value.args == (5,)
    store.update_status(5, KVPoll.WaitingForInput)
    assert store.check_status(5) is KVPoll.WaitingForInput


def test_largest_room_id_round_trips(backend: RedisUnderTest) -> None:
    store = backend.store()
    room = 2**63 - 1
    store.update_status(room, KVPoll.Bootstrapping)
    assert store.get(room) is KVPoll.Bootstrapping
    assert backend.keys() == [f"kvstatus:{backend.namespace}:{{{room}}}"]


def test_clear_removes_only_this_participant(backend: RedisUnderTest) -> None:
    a = backend.store(participant="prefill-0")
    b = a.for_participant("decode-0")
    a.update_status(1, KVPoll.Transferring)
    b.update_status(1, KVPoll.Transferring)
    b.record_failure(1, "decode lost its peer")
    assert b.clear(1) is True
    assert b.clear(1) is False
    assert list(a.room(1).participants) == ["prefill-0"]
    assert a.clear(1) is True
    assert backend.room_keys() == []


def test_first_failure_reason_wins_and_needs_an_entry(backend: RedisUnderTest) -> None:
    store = backend.store(ttl=20)
    assert store.record_failure(3, "too late: room cleared") is False
    assert backend.keys() == []
    store.update_status(3, KVPoll.Transferring)
    assert store.record_failure(3, "NIXL transfer timed out") is True
    assert store.record_failure(3, "secondary: heartbeat lost") is False
    store.update_status(3, KVPoll.Failed)
    entry = store.room(3).participants[store.participant]
    assert entry == (KVPoll.Failed, "NIXL transfer timed out")
    assert store.clear(3) is True
    assert store.room(3).exists is False


def test_long_reasons_are_truncated_and_marked(backend: RedisUnderTest) -> None:
    store = backend.store()
    store.update_status(3, KVPoll.Bootstrapping)
    store.record_failure(3, "é" * MAX_REASON_BYTES)
    reason = store.room(3).participants[store.participant].reason
    assert reason.endswith("[truncated]") and len(reason.encode()) <= MAX_REASON_BYTES


def test_leaving_failed_under_seed_drops_the_old_reason(backend: RedisUnderTest) -> None:
    store = backend.store()
    store.update_status(4, KVPoll.Bootstrapping)
    store.record_failure(4, "aborted")
    store.update_status(4, KVPoll.Failed)
    assert store.update_status(4, KVPoll.Bootstrapping).outcome is Outcome.ADVANCED
    assert store.room(4).participants[store.participant] == (KVPoll.Bootstrapping, None)


def test_room_view_has_ttl_and_every_participant(backend: RedisUnderTest) -> None:
    store = backend.store(ttl=50)
    store.update_status(9, KVPoll.Bootstrapping)
    store.for_participant("decode-1").update_status(9, KVPoll.WaitingForInput)
    view = store.room(9)
    assert view.room == 9 and view.exists
    assert 49_000 < view.ttl_ms <= 50_000
    assert view.participants == {
        "decode-1": (KVPoll.WaitingForInput, None),
        "default": (KVPoll.Bootstrapping, None),
    }
    missing = store.room(10)
    assert missing == RoomView(10, {}, None) and not missing.exists


def test_every_write_refreshes_the_ttl(backend: RedisUnderTest) -> None:
    store = backend.store(ttl=100)
    key = store.schema.room_key(1)
    store.update_status(1, KVPoll.Bootstrapping)
    backend.raw.pexpire(key, 5_000)
    store.update_status(1, KVPoll.Bootstrapping)  # UNCHANGED still touches
    assert backend.raw.pttl(key) > 99_000
    backend.raw.pexpire(key, 5_000)
    store.record_failure(1, "x")
    assert backend.raw.pttl(key) > 99_000
    backend.raw.pexpire(key, 5_000)
    store.update_many({1: KVPoll.Success})
    assert backend.raw.pttl(key) > 99_000


def test_get_many_keeps_order_dedupes_and_reports_missing(backend: RedisUnderTest) -> None:
    store = backend.store()
    store.update_many({2: KVPoll.Success, 1: KVPoll.Transferring})
    assert list(store.get_many([3, 1, 2, 1]).items()) == [(3, None), (1, KVPoll.Transferring), (2, KVPoll.Success)]
    assert store.get_many([]) == {}
    assert store.update_many({}) == {}


def test_batch_and_single_operations_agree(backend: RedisUnderTest) -> None:
    single, batch = backend.store(namespace=backend.namespace + "-a"), backend.store(namespace=backend.namespace + "-b")
    script = [
        {1: KVPoll.Bootstrapping, 2: KVPoll.Failed, 3: KVPoll.Success},
        {1: KVPoll.Failed, 2: KVPoll.WaitingForInput, 3: KVPoll.Bootstrapping},
        {1: KVPoll.Success, 2: KVPoll.Failed, 3: KVPoll.Failed},
    ]
    for step in script:
        expected = {room: single.update_status(room, status) for room, status in step.items()}
        assert batch.update_many(step) == expected
    assert single.get_many([1, 2, 3]) == batch.get_many([1, 2, 3])


@pytest.mark.parametrize("room", BAD_ROOMS)
def test_bad_rooms_are_rejected_before_redis_is_touched(backend: RedisUnderTest, room: object) -> None:
    store = backend.store()
    for call in (
        lambda: store.update_status(room, KVPoll.Bootstrapping),
        lambda: store.get(room),
        lambda: store.clear(room),
        lambda: store.record_failure(room, "x"),
        lambda: store.room(room),
        lambda: store.get_many([1, room]),
        lambda: store.update_many({2: KVPoll.Bootstrapping, room: KVPoll.Bootstrapping}),
    ):
        with pytest.raises(InvalidRoomError, match="invalid room"):
            call()
    assert backend.keys() == []


@pytest.mark.parametrize("status", BAD_STATUSES)
def test_bad_statuses_are_rejected_before_redis_is_touched(backend: RedisUnderTest, status: object) -> None:
    store = backend.store()
    with pytest.raises(InvalidStatusError, match="invalid status"):
        store.update_status(1, status)
    with pytest.raises(InvalidStatusError):
        store.update_many({1: KVPoll.Bootstrapping, 2: status})
    assert backend.keys() == []


@pytest.mark.parametrize(
    "settings",
    [
        {"namespace": "prod{a}"},
        {"namespace": "prod*"},
        {"namespace": "a b"},
        {"namespace": ""},
        {"namespace": "a:b"},
        {"prefix": "kv?"},
        {"participant": "prefill 0"},
        {"participant": "x" * 129},
    ],
)
def test_bad_names_are_rejected(backend: RedisUnderTest, settings: dict) -> None:
    with pytest.raises(InvalidNameError, match="invalid"):
        backend.store(**settings)


def test_a_url_given_as_a_name_does_not_print_its_password(backend: RedisUnderTest) -> None:
    with pytest.raises(InvalidNameError) as info:
        backend.store(namespace="redis://admin:hunter2@db:6379/0")
    assert "hunter2" not in str(info.value) and "***" in str(info.value)


@pytest.mark.parametrize("settings", [{"ttl": 0}, {"ttl": -1}, {"ttl": float("nan")}, {"ttl": True}, {"policy": "x"}])
def test_bad_settings_are_rejected(backend: RedisUnderTest, settings: dict) -> None:
    with pytest.raises(InvalidArgumentError):
        backend.store(**settings)


def test_update_many_wants_a_mapping(backend: RedisUnderTest) -> None:
    with pytest.raises(InvalidArgumentError, match="mapping"):
        backend.store().update_many([(1, KVPoll.Bootstrapping)])


def _room_in_same_slot(store, room: int) -> int:
    """Another room whose key hashes to the same cluster slot as ``room``'s."""
    slot = key_slot(store.schema.room_key(room).encode())
    return next(r for r in itertools.count(room + 1) if key_slot(store.schema.room_key(r).encode()) == slot)


def test_corrupted_status_is_reported_and_not_overwritten(backend: RedisUnderTest) -> None:
    store = backend.store()
    key = store.schema.room_key(8)
    backend.raw.hset(key, store.participant, "garbage")
    backend.raw.pexpire(key, 60_000)
    neighbour = _room_in_same_slot(store, 8)
    store.update_status(9, KVPoll.Bootstrapping)
    store.update_status(neighbour, KVPoll.Bootstrapping)
    for call in (
        lambda: store.update_status(8, KVPoll.Success),
        lambda: store.update_many({9: KVPoll.Success, neighbour: KVPoll.Success, 8: KVPoll.Success}),
        lambda: store.get(8),
        lambda: store.get_many([9, 8]),
        lambda: store.room(8),
    ):
        with pytest.raises(CorruptedValueError, match=r"kvstatus:.*\{8\}.*garbage"):
            call()
    assert backend.raw.hget(key, store.participant) == b"garbage"
    # The script call that met the corrupted room wrote nothing: the whole batch on one Redis,
    # the rooms of the corrupted room's slot on a cluster (other slots' groups are applied).
    assert store.get(neighbour) is KVPoll.Bootstrapping
    if not backend.name.startswith("cluster"):
        assert store.get(9) is KVPoll.Bootstrapping


def test_a_key_of_another_type_is_reported(backend: RedisUnderTest) -> None:
    store = backend.store()
    key = store.schema.room_key(8)
    backend.raw.set(key, "not a hash", px=60_000)
    with pytest.raises(CorruptedValueError, match="not a kvstatus room hash"):
        store.update_status(8, KVPoll.Bootstrapping)
    with pytest.raises(CorruptedValueError):
        store.get(8)
    assert backend.raw.get(key) == b"not a hash"


def test_lost_script_cache_heals_by_itself(backend: RedisUnderTest) -> None:
    store = backend.store()
    store.update_status(1, KVPoll.Bootstrapping)
    backend.raw.script_flush()
    assert store.update_status(1, KVPoll.WaitingForInput).outcome is Outcome.ADVANCED
    backend.raw.script_flush()
    assert store.update_many({1: KVPoll.Success, 2: KVPoll.Bootstrapping})[1].outcome is Outcome.ADVANCED
    backend.raw.script_flush()
    assert store.get_many([1, 2]) == {1: KVPoll.Success, 2: KVPoll.Bootstrapping}
    backend.raw.script_flush()
    assert store.record_failure(1, "x") is True


def test_repr_shows_settings(backend: RedisUnderTest) -> None:
    store = backend.store(participant="prefill-0", ttl=30, policy="strict")
    assert store.namespace == backend.namespace and store.ttl == 30
    text = repr(store)
    assert "prefill-0" in text and "strict" in text
