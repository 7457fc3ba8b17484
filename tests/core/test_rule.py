"""The Lua rule against the Python reference, for every (stored, new, policy), on every backend."""

from __future__ import annotations

from typing import Optional

import pytest

from kvstatus import KVPoll, Outcome, Policy, apply_rule
from tests.helpers.backends import RedisUnderTest, all_combinations

COMBINATIONS = list(all_combinations())
POLICIES = [Policy.SEED, Policy.STRICT]


def _seed_room(backend: RedisUnderTest, key: str, field: str, current: Optional[int]) -> None:
    if current is not None:
        backend.raw.hset(key, field, str(current))
        backend.raw.pexpire(key, 10_000)  # shorter than the stores' TTLs: a write never shortens a TTL


@pytest.mark.parametrize("policy", POLICIES)
def test_single_updates_follow_the_reference(backend: RedisUnderTest, policy: Policy) -> None:
    store = backend.store(policy=policy, ttl=30)
    for room, (current, new) in enumerate(COMBINATIONS):
        key = store.schema.room_key(room)
        _seed_room(backend, key, store.participant, current)
        expected = apply_rule(None if current is None else KVPoll(current), KVPoll(new), policy)

        assert store.update_status(room, new) == expected, (current, new)
        assert store.get(room) == expected.status
        stored = backend.raw.hget(key, store.participant)
        assert stored == (None if expected.status is None else str(expected.status.value).encode())
        pttl = backend.raw.pttl(key)
        if expected.outcome.refreshes_ttl:
            assert 29_000 < pttl <= 30_000, (current, new, pttl)  # refreshed to the store's 30 s
        elif current is not None:
            assert 5_000 < pttl <= 10_000, (current, new, pttl)  # refused: untouched, still the seeded 10 s
        else:
            assert pttl == -2  # nothing written


@pytest.mark.parametrize("policy", POLICIES)
def test_one_batch_of_every_combination_matches_single_updates(backend: RedisUnderTest, policy: Policy) -> None:
    store = backend.store(policy=policy)
    for room, (current, _) in enumerate(COMBINATIONS):
        _seed_room(backend, store.schema.room_key(room), store.participant, current)
    results = store.update_many({room: new for room, (_, new) in enumerate(COMBINATIONS)})

    assert list(results) == list(range(len(COMBINATIONS)))
    for room, (current, new) in enumerate(COMBINATIONS):
        expected = apply_rule(None if current is None else KVPoll(current), KVPoll(new), policy)
        assert results[room] == expected, (current, new)
    assert store.get_many(range(len(COMBINATIONS))) == {room: r.status for room, r in results.items()}


def test_participants_follow_the_rule_independently(backend: RedisUnderTest) -> None:
    prefill = backend.store(participant="prefill-0")
    decode = prefill.for_participant("decode-3")
    assert prefill.update_status(7, KVPoll.Transferring).outcome is Outcome.CREATED
    assert decode.update_status(7, KVPoll.Failed).outcome is Outcome.IGNORED_MISSING
    assert decode.update_status(7, KVPoll.Bootstrapping).outcome is Outcome.CREATED
    assert decode.update_status(7, KVPoll.Failed).outcome is Outcome.FAILED
    # The entries are independent: prefill-0's own stays Transferring. Its read, under shared fate (the
    # default), answers Failed: the room failed for decode-3 (tests/core/test_shared_fate.py).
    assert backend.store(participant="prefill-0", shared_fate=False).get(7) is KVPoll.Transferring
    assert prefill.get(7) is KVPoll.Failed
    assert decode.get(7) is KVPoll.Failed
    view = prefill.room(7)
    assert {name: entry.status for name, entry in view.participants.items()} == {
        "decode-3": KVPoll.Failed,
        "prefill-0": KVPoll.Transferring,
    }


def test_late_abort_after_clear_does_not_resurrect(backend: RedisUnderTest) -> None:
    store = backend.store()
    for status in (KVPoll.Bootstrapping, KVPoll.WaitingForInput, KVPoll.Transferring, KVPoll.Success):
        store.update_status(42, status)
    assert store.clear(42) is True
    assert store.update_status(42, KVPoll.Failed).outcome is Outcome.IGNORED_MISSING
    assert backend.room_keys() == []  # only the tombstone is left: a short TTL, never read by the rule
    assert backend.keys() == [f"kvstatus:{backend.namespace}:{{42}}:t"] and backend.keys_without_ttl() == []
    # The next request on the reused room starts clean, not Failed.
    assert store.update_status(42, KVPoll.Bootstrapping) == (Outcome.CREATED, KVPoll.Bootstrapping)
