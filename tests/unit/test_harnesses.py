"""The torture harnesses catch what they claim to catch (their real runs are in tests/torture/)."""

from __future__ import annotations

import fakeredis

from kvstatus import KVPoll, StatusStore
from kvstatus.model import Outcome
from tests.helpers.failover import Workload
from tests.helpers.history import Call, linearizable


def _update(thread: str, start: int, end: int, status: KVPoll, outcome: Outcome, after: KVPoll | None) -> Call:
    return Call(
        thread, start, end, 1, "p", "update", int(status), (int(outcome), None if after is None else int(after))
    )


def test_the_checker_accepts_an_overlap_in_either_order() -> None:
    # Two overlapping creates: one of them must have come first; either may have.
    history = [
        _update("a", 0, 10, KVPoll.Bootstrapping, Outcome.UNCHANGED, KVPoll.Transferring),
        _update("b", 1, 9, KVPoll.Transferring, Outcome.CREATED, KVPoll.Transferring),
    ]
    assert linearizable(history)


def test_the_checker_rejects_two_creates_and_real_time_inversions() -> None:
    both_created = [
        _update("a", 0, 10, KVPoll.Bootstrapping, Outcome.CREATED, KVPoll.Bootstrapping),
        _update("b", 1, 9, KVPoll.Transferring, Outcome.CREATED, KVPoll.Transferring),
    ]
    assert not linearizable(both_created)
    # b's CREATED only fits before a, but b was invoked after a returned.
    inverted = [
        _update("a", 0, 5, KVPoll.Bootstrapping, Outcome.UNCHANGED, KVPoll.Transferring),
        _update("b", 6, 9, KVPoll.Transferring, Outcome.CREATED, KVPoll.Transferring),
    ]
    assert not linearizable(inverted)


def test_a_late_abort_that_resurrects_a_room_is_rejected() -> None:
    history = [
        _update("a", 0, 1, KVPoll.Bootstrapping, Outcome.CREATED, KVPoll.Bootstrapping),
        Call("a", 2, 3, 1, "p", "clear", None, True),
        _update("b", 4, 5, KVPoll.Failed, Outcome.FAILED, KVPoll.Failed),
    ]
    assert not linearizable(history)


def test_the_audit_catches_resurrected_rooms_and_keys_without_ttl() -> None:
    raw = fakeredis.FakeRedis()
    store = StatusStore(raw, namespace="audit")
    workload = Workload(store, rooms=200)
    for _ in range(3):
        workload.step()
    assert workload.audit(raw) == []
    untouched = next(r for r in range(200) if not workload.history[r])
    raw.hset(store.schema.room_key(untouched), store.participant, "0")  # a late abort resurrecting a room
    never_success = next(
        r
        for r in range(200)
        if workload.history[r] and all(change != KVPoll.Success for change, _ in workload.history[r])
    )
    raw.hset(store.schema.room_key(never_success), store.participant, "4")
    problems = workload.audit(raw)
    assert any(f"room {untouched} is {KVPoll.Failed!r}" in p for p in problems)
    assert any(f"{{{untouched}}} has no TTL" in p for p in problems)
    assert any(f"room {never_success} is {KVPoll.Success!r}" in p for p in problems)
