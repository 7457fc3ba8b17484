"""Linearizability of the store under concurrent processes × threads on shared rooms."""

from __future__ import annotations

import threading

import pytest
import redis

from kvstatus.keys import KeySchema
from kvstatus.model import KVPoll, Policy
from kvstatus.timeline import parse_timeline
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


@pytest.mark.real
def test_every_timeline_is_monotone_and_ends_at_its_status_under_racing_writers(redis_server: RedisServer) -> None:
    """The racing writers above, with timelines on; a reader samples every entry meanwhile. Each timeline it
    reads goes forward in time (parse_timeline refuses one that goes back) and its last step is the status
    stored beside it: the step and the status are one write, and no reader ever sees one without the other."""
    namespace = fresh_namespace("hist-timeline")
    schema = KeySchema(namespace)
    rooms, names = [2**62 + i for i in range(3)], [f"node-{i}" for i in range(2)]
    client = redis.Redis.from_url(redis_server.url)
    done = threading.Event()
    seen: list[tuple[str, bytes, bytes]] = []

    def sample() -> None:
        while not done.is_set():
            with client.pipeline(transaction=False) as pipe:
                for room in rooms:
                    for name in names:
                        pipe.hmget(schema.room_key(room), name, f"t:{name}")
                replies = pipe.execute()
            for (status, timeline), name in zip(replies, names * len(rooms)):
                if timeline is not None:
                    seen.append((name, status, timeline))

    reader = threading.Thread(target=sample)
    reader.start()
    try:
        calls = run_history(redis_server.url, namespace, processes=8, threads=3, ops=60)
    finally:
        done.set()
        reader.join()
    assert find_violations(calls) == []
    assert len(seen) > 100, "the reader saw too few timelines to tell anything"
    for name, status, timeline in seen:
        steps = parse_timeline(timeline, "sampled", f"t:{name}")
        assert [s.at_ms for s in steps] == sorted(s.at_ms for s in steps)
        assert status is not None and steps[-1].status == KVPoll(int(status)), (status, timeline)
