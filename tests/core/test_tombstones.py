"""clear()'s tombstones, on every backend: visible, they expire, and they never resurrect a room."""

from __future__ import annotations

import time

import pytest

from kvstatus import KVPoll, Outcome
from kvstatus.admin.reads import iter_rooms
from kvstatus.keys import TOMBSTONE_TTL_SECONDS, KeySchema
from tests.helpers.backends import RedisUnderTest

B, W, T, S, F = KVPoll.Bootstrapping, KVPoll.WaitingForInput, KVPoll.Transferring, KVPoll.Success, KVPoll.Failed


def _tomb(backend: RedisUnderTest, room: int) -> str:
    return f"kvstatus:{backend.namespace}:{{{room}}}:t"


def test_a_clear_says_who_cleared_when_and_at_which_status(backend: RedisUnderTest) -> None:
    store = backend.store(participant="prefill-0")
    for status in (B, T, S):
        store.update_status(7, status)
    before = time.time()
    assert store.clear(7) is True
    view = store.room(7)
    assert not view.exists and view.cleared
    entry = view.tombstone.cleared["prefill-0"]
    assert entry.status is S and entry.late_failed_at is None
    assert before - 5 < entry.cleared_at < time.time() + 5  # Redis' clock, on the same machine here
    assert 0 < view.tombstone.ttl_ms <= 60_000
    (line,) = view.tombstone.describe(now=entry.cleared_at + 3)
    assert line == "cleared 3.0 s ago by prefill-0 at Success"
    assert backend.room_keys() == [] and backend.keys() == [_tomb(backend, 7)] and backend.keys_without_ttl() == []


def test_a_late_abort_after_the_clear_is_ignored_and_noted(backend: RedisUnderTest) -> None:
    decode = backend.store(participant="decode-0")
    decode.update_status(8, W)
    decode.clear(8)
    assert decode.update_status(8, F) == (Outcome.IGNORED_MISSING, None)
    assert decode.update_many({8: F, 9: F}) == {8: (Outcome.IGNORED_MISSING, None), 9: (Outcome.IGNORED_MISSING, None)}
    view = decode.room(8)
    assert not view.exists and decode.get(8) is None  # never resurrected
    entry = view.tombstone.cleared["decode-0"]
    assert entry.status is W and entry.late_failed_at is not None and entry.late_failed_at >= entry.cleared_at
    assert "a late abort arrived" in view.tombstone.describe()[0]
    assert backend.keys() == [_tomb(backend, 8)]  # room 9 was never cleared: no tombstone appears for it
    # A new lifecycle on the reused room starts clean; a later clear replaces the note and its late abort.
    assert decode.update_status(8, B).outcome is Outcome.CREATED
    decode.clear(8)
    assert decode.room(8).tombstone.cleared["decode-0"] == (pytest.approx(time.time(), abs=5), B, None)


def test_only_the_participant_that_cleared_gets_a_late_note(backend: RedisUnderTest) -> None:
    prefill = backend.store(participant="prefill-0")
    decode = prefill.for_participant("decode-0")
    prefill.update_status(3, T)
    decode.update_status(3, T)
    prefill.clear(3)
    assert prefill.update_status(3, F).outcome is Outcome.IGNORED_MISSING
    other = backend.store(participant="decode-9")
    assert other.update_status(3, F).outcome is Outcome.IGNORED_MISSING  # never had an entry: nothing to note
    view = decode.room(3)
    assert view.exists and set(view.participants) == {"decode-0"}  # a partial clear: the room lives on
    assert set(view.tombstone.cleared) == {"prefill-0"} and view.tombstone.cleared["prefill-0"].late_failed_at


def test_a_tombstone_lives_60_s_and_never_longer_than_the_store_ttl(backend: RedisUnderTest) -> None:
    other = backend.store(participant="q")
    other.update_status(5, B)
    other.clear(5)
    assert 30_000 < backend.raw.pttl(_tomb(backend, 5)) <= TOMBSTONE_TTL_SECONDS * 1000 == 60_000
    store = backend.store(participant="p", ttl=0.3)
    store.update_status(4, B)
    store.clear(4)
    assert 0 < backend.raw.pttl(_tomb(backend, 4)) <= 300
    time.sleep(0.5)
    view = store.room(4)
    assert view.tombstone is None and not view.cleared and not view.exists
    assert store.update_status(4, F).outcome is Outcome.IGNORED_MISSING
    assert backend.keys() == [_tomb(backend, 5)]


def test_scans_never_take_a_tombstone_or_a_lease_for_a_room(backend: RedisUnderTest) -> None:
    store = backend.store(participant="p", lease_ttl=3)
    store.update_status(1, B)
    store.update_status(2, B)
    store.clear(2)
    # room 1, room 2 (its stamp alone: the fence, lua/clear.lua) and its tombstone, the lease record and index
    assert len(backend.keys()) == 5
    if backend.asynchronous:
        return  # iter_rooms is sync; the keys are the same
    views = list(iter_rooms(backend.raw, KeySchema(backend.namespace)))
    assert [v.room for v in views] == [1]
