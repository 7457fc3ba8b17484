"""Linearizability of the store under concurrent processes × threads on shared rooms."""

from __future__ import annotations

import pytest

from kvstatus.rule import Policy
from tests.helpers.backends import fresh_namespace
from tests.helpers.history import find_violations, run_history
from tests.servers import RedisServer


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
        calls = run_history(redis_server.url, fresh_namespace("hist-naive"), naive=True, processes=8, threads=3, ops=40)
        violations = find_violations(calls)
        if violations:
            break
    assert violations, "the client-side read-then-write passed the linearizability check"
