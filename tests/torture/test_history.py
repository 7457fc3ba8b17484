"""Linearizability of the store under concurrent processes × threads on shared rooms (DESIGN §6 races)."""

from __future__ import annotations

import pytest

from kvstatus.rule import KVPoll, Outcome, Policy
from tests.helpers.history import Call, find_violations, linearizable, run_history
from tests.servers import RedisServer
from tests.helpers.backends import fresh_namespace


def _update(thread: str, start: int, end: int, status: KVPoll, outcome: Outcome, after: KVPoll | None) -> Call:
    return Call(thread, start, end, 1, "p", "update", int(status),
                (int(outcome), None if after is None else int(after)))


def test_the_checker_accepts_an_overlap_in_either_order() -> None:
    # Two overlapping creates: one of them must have come first; either may have.
    history = [_update("a", 0, 10, KVPoll.Bootstrapping, Outcome.UNCHANGED, KVPoll.Transferring),
               _update("b", 1, 9, KVPoll.Transferring, Outcome.CREATED, KVPoll.Transferring)]
    assert linearizable(history)


def test_the_checker_rejects_two_creates_and_real_time_inversions() -> None:
    both_created = [_update("a", 0, 10, KVPoll.Bootstrapping, Outcome.CREATED, KVPoll.Bootstrapping),
                    _update("b", 1, 9, KVPoll.Transferring, Outcome.CREATED, KVPoll.Transferring)]
    assert not linearizable(both_created)
    # b's CREATED only fits before a, but b was invoked after a returned.
    inverted = [_update("a", 0, 5, KVPoll.Bootstrapping, Outcome.UNCHANGED, KVPoll.Transferring),
                _update("b", 6, 9, KVPoll.Transferring, Outcome.CREATED, KVPoll.Transferring)]
    assert not linearizable(inverted)


def test_a_late_abort_that_resurrects_a_room_is_rejected() -> None:
    history = [_update("a", 0, 1, KVPoll.Bootstrapping, Outcome.CREATED, KVPoll.Bootstrapping),
               Call("a", 2, 3, 1, "p", "clear", None, True),
               _update("b", 4, 5, KVPoll.Failed, Outcome.FAILED, KVPoll.Failed)]
    assert not linearizable(history)


@pytest.mark.real
@pytest.mark.parametrize("policy", list(Policy))
def test_every_history_on_redis_is_linearizable(redis_server: RedisServer, policy: Policy) -> None:
    calls = run_history(redis_server.url, fresh_namespace("hist"), processes=8, threads=3, ops=80, policy=policy)
    assert len(calls) >= 8 * 3 * 80
    kinds = {call.kind for call in calls}
    assert kinds == {"update", "clear", "fail", "get", "state"}
    assert find_violations(calls, policy) == []


@pytest.mark.real
def test_the_check_catches_a_client_side_read_then_write(redis_server: RedisServer) -> None:
    violations: list[tuple[int, str]] = []
    for _ in range(3):  # a race, so a few tries; one run is nearly always enough
        calls = run_history(redis_server.url, fresh_namespace("hist-naive"), naive=True, processes=8, threads=3,
                            ops=40)
        violations = find_violations(calls)
        if violations:
            break
    assert violations, "the client-side read-then-write passed the linearizability check"
