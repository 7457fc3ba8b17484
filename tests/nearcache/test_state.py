"""The cache's bookkeeping without Redis: racing fills, flushes, LRU, expiry."""

from __future__ import annotations

from kvstatus.cachestate import _LOG_KEEP, CacheState, NearCacheOptions, room_from_replies, status_for, view_at
from kvstatus.keys import KeySchema
from kvstatus.model import KVPoll, ParticipantEntry


def _state(max_rooms: int = 100) -> CacheState:
    return CacheState(KeySchema("ns"), NearCacheOptions(max_rooms=max_rooms))


def _entry(room: int, status: str = "1", pttl: int = 60_000, at: float = 0.0):  # noqa: ANN202
    return room_from_replies(room, f"kvstatus:ns:{{{room}}}", [b"w", status.encode()], pttl, at)


def test_a_fill_that_raced_an_invalidation_of_its_room_is_not_stored() -> None:
    state = _state()
    token = state.token()
    state.invalidate([1])  # arrives while the fill of rooms 1 and 2 is in flight
    state.store(token, {1: _entry(1), 2: _entry(2)})
    assert 1 not in state.entries and 2 in state.entries


def test_a_fill_that_raced_a_flush_is_not_stored() -> None:
    state = _state()
    token = state.token()
    state.flush("test")
    state.store(token, {1: _entry(1)})
    assert not state.entries


def test_a_fill_older_than_the_log_is_not_stored() -> None:
    state = _state()
    token = state.token()
    state.invalidate(range(10_000, 10_000 + 3 * _LOG_KEEP))
    state.store(token, {1: _entry(1)})
    assert not state.entries
    later = state.token()
    state.store(later, {1: _entry(1)})
    assert 1 in state.entries


def test_invalidation_keys_of_other_namespaces_are_ignored() -> None:
    state = _state()
    state.store(state.token(), {1: _entry(1)})
    state.apply([b"kvstatus:other:{1}", b"kvstatus:ns:{1}x", b"kvstatus:ns:{2}"])
    assert 1 in state.entries
    state.apply([b"kvstatus:ns:{1}"])
    assert 1 not in state.entries


def test_lru_eviction_and_expiry() -> None:
    state = _state(max_rooms=3)
    state.store(state.token(), {r: _entry(r, pttl=10_000 * (r + 1)) for r in range(3)})
    state.referenced.add(0)  # room 0 was read: it gets a second chance
    state.store(state.token(), {3: _entry(3)})
    assert list(state.entries) == [2, 3, 0]  # room 1 evicted; room 0 got its second chance
    assert state.earliest_deadline == 10.0  # room 0: 10 s after the read was sent at t=0
    state.expire(9.5)  # within a second of room 0's deadline: dropped early, never late
    assert 0 not in state.entries and 2 in state.entries


def test_absent_rooms_have_no_deadline_and_a_corrupted_value_raises() -> None:
    import pytest

    from kvstatus.errors import CorruptedValueError

    absent = room_from_replies(1, "kvstatus:ns:{1}", [], -2, 0.0)
    assert status_for(absent, ("w", True)) is None and view_at(1, absent, 5.0).ttl_ms is None
    assert absent is room_from_replies(2, "kvstatus:ns:{2}", {}, -2, 1.0)  # every absent room shares one
    present = room_from_replies(3, "kvstatus:ns:{3}", {b"w": b"3", b"reason:w": b"slow"}, 1000, 10.0)
    assert status_for(present, ("w", False)) is KVPoll.Transferring and status_for(present, ("d", False)) is None
    view = view_at(3, present, 10.25)
    assert view.participants["w"] == ParticipantEntry(KVPoll.Transferring, "slow") and view.ttl_ms == 750
    with pytest.raises(CorruptedValueError):
        room_from_replies(1, "kvstatus:ns:{1}", {b"w": b"9"}, 1000, 0.0)
