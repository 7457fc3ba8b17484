"""The options of issue 9 items 1-3 as data: max_connections and deadline (keyword and URL), the pools a
URL builds, and how a batch is cut into chunks. No connection is made."""

from __future__ import annotations

import asyncio

import pytest
import redis

from kvstatus.connection import connect, connect_async
from kvstatus.deadline import AsyncWaitingPool, WaitingPool
from kvstatus.errors import InvalidArgumentError, InvalidURLError
from kvstatus.operations import CHUNK_ROOMS, CHUNK_SECONDS, StoreCore
from kvstatus.translate import translate_error
from kvstatus.url import ConnectionOptions, options_for


def test_max_connections_and_deadline_are_url_and_keyword_options() -> None:
    assert ConnectionOptions().max_connections == 100 and ConnectionOptions().deadline == 5.0
    opts = options_for("redis://h:1/0?max_connections=7&deadline=1.5")
    assert (opts.max_connections, opts.deadline) == (7, 1.5)
    opts = options_for("redis://h:1/0", max_connections=9, deadline=0.25)
    assert (opts.max_connections, opts.deadline) == (9, 0.25)


@pytest.mark.parametrize(
    "query",
    [
        "max_connections=0",
        "max_connections=-1",
        "max_connections=2.5",
        "deadline=0",
        "deadline=-1",
        "deadline=inf",
        "deadline=x",
    ],
)
def test_bad_pool_and_deadline_values_are_refused_in_a_url(query: str) -> None:
    with pytest.raises(InvalidURLError, match=query.split("=")[0]):
        options_for(f"redis://h:1/0?{query}")


@pytest.mark.parametrize(
    "field, value", [("max_connections", 0), ("max_connections", True), ("deadline", 0), ("deadline", float("nan"))]
)
def test_bad_pool_and_deadline_values_are_refused_as_keywords(field: str, value: object) -> None:
    with pytest.raises(InvalidArgumentError, match=field):
        ConnectionOptions(**{field: value})


def test_a_standalone_url_builds_a_pool_that_queues() -> None:
    client = connect("redis://h:1/0?max_connections=7&deadline=2")
    assert isinstance(client.connection_pool, WaitingPool) and client.connection_pool.max_connections == 7
    aclient = connect_async("unix:///tmp/nothing.sock?max_connections=3")
    assert isinstance(aclient.connection_pool, AsyncWaitingPool) and aclient.connection_pool.max_connections == 3
    asyncio.run(aclient.aclose())


def test_a_pool_error_never_reads_redis_unavailable() -> None:
    error = translate_error(redis.exceptions.MaxConnectionsError("Too many connections"))
    assert "client connection pool exhausted" in str(error) and "unavailable" not in str(error)


def test_batches_are_cut_into_chunks_of_at_most_chunk_rooms() -> None:
    core = StoreCore(namespace="n")
    small = core.update_many({room: 1 for room in range(CHUNK_ROOMS)})
    assert len(small.calls) == 1 and small.extra_seconds == 0
    big = core.update_many({room: 1 for room in range(2 * CHUNK_ROOMS + 500)})
    keys = [call.args[2] for call in big.calls]
    assert keys == [CHUNK_ROOMS, CHUNK_ROOMS, 500]
    assert big.extra_seconds == pytest.approx(2 * CHUNK_SECONDS)
    polled = core.get_many(range(CHUNK_ROOMS + 1))
    assert polled.calls[0].args[2] == CHUNK_ROOMS and polled.calls[1].args == (
        "HMGET",
        f"kvstatus:n:{{{CHUNK_ROOMS}}}",
        "default",
        "room:fate",
    )
    alone = StoreCore(namespace="n", shared_fate=False).get_many(range(CHUNK_ROOMS + 1))
    assert alone.calls[1].args == ("HGET", f"kvstatus:n:{{{CHUNK_ROOMS}}}", "default")
    # in order, each room once
    rooms = [int(key.rsplit("{", 1)[1].rstrip("}")) for call in big.calls for key in call.args[3 : 3 + call.args[2]]]
    assert rooms == list(range(2 * CHUNK_ROOMS + 500))


def test_a_socket_wait_after_the_deadline_raises_a_timeout_not_a_name_error() -> None:
    """Once the call's deadline has passed, the next socket wait gives up with redis-py's TimeoutError."""
    import time as _time

    import redis as _redis

    from kvstatus import deadline as _deadline

    class Connection:
        socket_timeout, socket_connect_timeout = 5.0, 2.0

    token = _deadline.DEADLINE.set(_time.monotonic() - 0.01)
    try:
        with pytest.raises(_redis.exceptions.TimeoutError, match="deadline"):
            _deadline._Timeouts.lowered(Connection())
    finally:
        _deadline.DEADLINE.reset(token)
