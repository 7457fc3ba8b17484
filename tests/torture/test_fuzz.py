"""Bad input, generated: every public call either works or raises a documented kvstatus error, and a
rejected call writes nothing."""

from __future__ import annotations

from typing import Any, Callable, Iterator

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvstatus import (
    CorruptedValueError,
    InvalidArgumentError,
    InvalidURLError,
    KVPoll,
    KVStatusError,
    StatusStore,
    UpdateResult,
)
from tests.helpers.backends import fresh_namespace
from tests.servers import RedisServer

pytestmark = pytest.mark.real

FUZZ = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

junk = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(),
    st.text(max_size=12),
    st.binary(max_size=8),
    st.lists(st.integers(), max_size=2),
    st.sampled_from(list(KVPoll)),
    st.integers(min_value=0, max_value=2**63 - 1),
)
rooms = st.one_of(junk, st.integers(min_value=0, max_value=2**63 - 1))
hashable_rooms = rooms.filter(lambda value: not isinstance(value, list))
statuses = st.one_of(junk, st.integers(min_value=-1, max_value=5), st.sampled_from(list(KVPoll)))


@pytest.fixture
def client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    made = redis_server.client()
    yield made
    made.close()


def _namespace_keys(client: redis.Redis, namespace: str) -> dict[bytes, dict[bytes, bytes]]:
    return {key: client.hgetall(key) for key in client.scan_iter(match=f"kvstatus:{namespace}:*", count=1000)}


def _outcome(call: Callable[[], Any], allowed: tuple[type[BaseException], ...] = (InvalidArgumentError,)) -> Any:
    """The call's result, or the exception it raised when that is one of ``allowed`` (anything else fails)."""
    try:
        return call()
    except allowed as exc:
        assert str(exc), "an error without a message"
        return exc


@FUZZ
@given(room=rooms, status=statuses)
def test_update_status_validates_or_applies(client: redis.Redis, room: Any, status: Any) -> None:
    store = StatusStore(client, namespace=fresh_namespace("fuzz"))
    result = _outcome(lambda: store.update_status(room, status))
    if isinstance(result, Exception):
        assert _namespace_keys(client, store.namespace) == {}
    else:
        assert isinstance(result, UpdateResult)


@FUZZ
@given(
    updates=st.one_of(
        junk, st.dictionaries(hashable_rooms, statuses, max_size=6), st.lists(st.tuples(rooms, statuses), max_size=3)
    )
)
def test_update_many_is_all_or_nothing(client: redis.Redis, updates: Any) -> None:
    store = StatusStore(client, namespace=fresh_namespace("fuzz"))
    result = _outcome(lambda: store.update_many(updates))
    written = _namespace_keys(client, store.namespace)
    if isinstance(result, Exception):
        assert written == {}
    else:
        assert set(result) == set(updates)


@FUZZ
@given(room=rooms, many=st.one_of(junk, st.lists(rooms, max_size=5)), reason=st.one_of(junk, st.text()))
def test_reads_clear_and_record_failure_validate(client: redis.Redis, room: Any, many: Any, reason: Any) -> None:
    store = StatusStore(client, namespace=fresh_namespace("fuzz"))
    _outcome(lambda: store.get(room))
    _outcome(lambda: store.check_status(room), (InvalidArgumentError, KeyError))
    _outcome(lambda: store.get_many(many))
    _outcome(lambda: store.room(room))
    _outcome(lambda: store.clear(room))
    _outcome(lambda: store.record_failure(room, reason))
    assert _namespace_keys(client, store.namespace) == {}


@FUZZ
@given(namespace=junk, participant=junk, prefix=junk, ttl=junk, policy=junk)
def test_store_settings_validate(
    client: redis.Redis, namespace: Any, participant: Any, prefix: Any, ttl: Any, policy: Any
) -> None:
    made = _outcome(
        lambda: StatusStore(client, namespace=namespace, participant=participant, prefix=prefix, ttl=ttl, policy=policy)
    )
    assert isinstance(made, (StatusStore, InvalidArgumentError))


@FUZZ
@given(
    url=st.one_of(
        junk,
        st.builds(
            lambda scheme, rest: scheme + rest,
            st.sampled_from(["redis://", "rediss://", "unix://", "http://", ""]),
            st.text(max_size=30),
        ),
    )
)
def test_urls_validate_without_connecting(url: Any) -> None:
    made = _outcome(lambda: StatusStore.from_url(url, namespace="fuzz"), (InvalidURLError,))
    if isinstance(made, StatusStore):
        made.close()


@FUZZ
@given(stored=st.binary(max_size=12), status=st.sampled_from(list(KVPoll)))
def test_a_corrupted_value_is_reported_and_left_alone(client: redis.Redis, stored: bytes, status: KVPoll) -> None:
    store = StatusStore(client, namespace=fresh_namespace("fuzz"))
    key = store.schema.room_key(7)
    other = store.schema.room_key(8)
    client.hset(key, store.participant, stored)
    client.pexpire(key, 60_000)
    valid = stored in (b"0", b"1", b"2", b"3", b"4")
    for call in (
        lambda: store.update_status(7, status),
        lambda: store.get(7),
        lambda: store.get_many([8, 7]),
        lambda: store.room(7),
        lambda: store.update_many({8: KVPoll.Bootstrapping, 7: status}),
    ):
        result = _outcome(call, (CorruptedValueError,))
        if valid:
            assert not isinstance(result, KVStatusError)
        else:
            assert isinstance(result, CorruptedValueError)
            assert client.hget(key, store.participant) == stored
            assert not client.exists(other), "a batch was half-written next to a corrupted value"
