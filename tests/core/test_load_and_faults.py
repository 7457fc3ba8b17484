"""Under load and faults (issue 9, items 1-4), on real servers of every topology, sync and async.

1. Concurrent calls beyond the pool queue for a connection; one that waits past its deadline says
   "client connection pool exhausted (max_connections=N)", never "Redis unavailable".
2. A hung (SIGSTOPped) server holds a call for at most its deadline, not 6 sends x the socket timeout.
3. A huge batch is sent in chunks that let other clients' commands run between them; BUSY is its own error.
4. Polls (get_many) are reads: not stalled by CLIENT PAUSE WRITE, and served by a read-only replica.

The time bounds asserted are behaviour bounds, several times wider than what is measured (in the notes of
each test), never speed benchmarks.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import pytest
import redis

from kvstatus import (
    AsyncStatusStore,
    BackendBusyError,
    BackendUnavailableError,
    ConnectionOptions,
    KVPoll,
    Outcome,
    PoolExhaustedError,
    StatusStore,
)
from kvstatus.connection import connect, connect_async
from kvstatus.operations import CHUNK_ROOMS
from tests.helpers.backends import RedisUnderTest, fresh_namespace
from tests.helpers.timing import slack
from tests.servers import RedisClusterServers, RedisSentinelServers, RedisServer

# One xdist worker runs this module, so its Sentinel group starts once, not on each.
pytestmark = [pytest.mark.real, pytest.mark.xdist_group("load-and-faults")]

SLACK = 2.0  # seconds a call may outlast its deadline in these assertions (measured: < 0.02 s)


@pytest.fixture(scope="module")
def sentinel_group() -> Iterator[RedisSentinelServers]:
    # Never stopped or paused: 15 s (not 1 s) keeps a busy machine from failing the master over mid-test.
    with RedisSentinelServers(down_after_ms=15_000) as group:
        yield group


@pytest.fixture(params=["standalone", "cluster", "sentinel"])
def topology_url(request: pytest.FixtureRequest) -> str:
    """The URL of a session server of each topology (not to be stopped or paused by the test)."""
    if request.param == "cluster":
        return request.getfixturevalue("redis_cluster").url
    if request.param == "sentinel":
        return request.getfixturevalue("sentinel_group").url
    return request.getfixturevalue("redis_server").url


def _kvstatus_connections(client: redis.Redis) -> int:
    return sum(1 for entry in client.client_list() if entry.get("name") == "kvstatus")


# -- 1. pool exhaustion ---------------------------------------------------------------------------------


def test_500_concurrent_async_calls_queue_for_a_connection(topology_url: str) -> None:
    """Before: 400 of 500 concurrent update_many failed with "Redis unavailable ... Too many connections"."""

    async def run() -> list[BaseException]:
        # The last of 500 queued calls waits for 499 before it: past the 5 s default deadline on a busy machine.
        store = AsyncStatusStore.from_url(f"{topology_url}?deadline=60", namespace=fresh_namespace("pool"))
        try:
            results = await asyncio.gather(
                *(store.update_many({i * 10 + k: KVPoll.Bootstrapping for k in range(10)}) for i in range(500)),
                return_exceptions=True,
            )
            assert await store.get_many(range(5000)) == {room: KVPoll.Bootstrapping for room in range(5000)}
        finally:
            await store.close()
        return [r for r in results if isinstance(r, BaseException)]

    assert asyncio.run(run()) == []


def test_concurrent_threads_queue_for_a_connection(topology_url: str) -> None:
    """Before: 396 of 500 threads on one StatusStore failed; here 200 threads on a pool of 20."""
    store = StatusStore.from_url(topology_url, namespace=fresh_namespace("tpool"), max_connections=20)
    errors: list[BaseException] = []
    start = threading.Barrier(200)

    def call(i: int) -> None:
        start.wait()
        try:
            store.update_many({i * 10 + k: KVPoll.Bootstrapping for k in range(10)})
        except BaseException as exc:  # noqa: BLE001 - every failure is the finding
            errors.append(exc)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(200)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    try:
        assert errors == []
        assert store.get_many(range(2000)) == {room: KVPoll.Bootstrapping for room in range(2000)}
    finally:
        store.close()


def test_a_standalone_client_never_opens_more_than_max_connections(redis_server: RedisServer) -> None:
    admin = redis_server.client()
    before = _kvstatus_connections(admin)
    store = StatusStore.from_url(redis_server.url, namespace=fresh_namespace("cap"), max_connections=5)
    seen: list[int] = []

    def call(i: int) -> None:
        store.update_status(i, KVPoll.Bootstrapping)
        seen.append(_kvstatus_connections(admin) - before)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(50)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    try:
        assert len(seen) == 50 and max(seen) <= 5
    finally:
        store.close()


@contextmanager
def _paused(server: RedisServer, seconds: float) -> Iterator[None]:
    """Every command on ``server`` waits ``seconds`` (CLIENT PAUSE ALL): connections stay busy, Redis is fine."""
    admin = server.client()
    admin.execute_command("CLIENT", "PAUSE", int(seconds * 1000), "ALL")
    try:
        yield
    finally:
        admin.execute_command("CLIENT", "UNPAUSE")


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_a_call_that_finds_the_pool_busy_until_its_deadline_says_so(asynchronous: bool) -> None:
    """Two long calls hold a pool of two; a third with a 0.5 s deadline gets PoolExhaustedError, not
    "Redis unavailable", in about 0.5 s, and the two long calls succeed."""
    with RedisServer() as server:
        namespace = fresh_namespace("busy")
        long = ConnectionOptions(deadline=5.0)
        short = ConnectionOptions(deadline=0.5)
        if asynchronous:

            async def run() -> tuple[list[Any], BaseException, float]:
                client = connect_async(server.url, max_connections=2)
                holders = [AsyncStatusStore(client, namespace=namespace, options=long) for _ in range(2)]
                waiter = AsyncStatusStore(client, namespace=namespace, options=short)
                with _paused(server, 1.5):
                    held = [
                        asyncio.ensure_future(h.update_status(i, KVPoll.Bootstrapping)) for i, h in enumerate(holders)
                    ]
                    await asyncio.sleep(0.1)
                    started = time.monotonic()
                    with pytest.raises(PoolExhaustedError) as caught:
                        await waiter.update_status(7, KVPoll.Bootstrapping)
                    took = time.monotonic() - started
                    results = await asyncio.gather(*held)
                await client.aclose()
                return results, caught.value, took

            results, error, took = asyncio.run(run())
        else:
            client = connect(server.url, max_connections=2)
            holders = [StatusStore(client, namespace=namespace, options=long) for _ in range(2)]
            waiter = StatusStore(client, namespace=namespace, options=short)
            results = [None, None]

            def hold(i: int) -> None:
                results[i] = holders[i].update_status(i, KVPoll.Bootstrapping)

            with _paused(server, 1.5):
                threads = [threading.Thread(target=hold, args=(i,)) for i in range(2)]
                for thread in threads:
                    thread.start()
                time.sleep(0.1)
                started = time.monotonic()
                with pytest.raises(PoolExhaustedError) as caught:
                    waiter.update_status(7, KVPoll.Bootstrapping)
                took = time.monotonic() - started
                for thread in threads:
                    thread.join()
            client.close()
            error = caught.value
        assert "client connection pool exhausted (max_connections=2)" in str(error)
        assert "unavailable" not in str(error) and not isinstance(error, BackendUnavailableError)
        assert took < 0.5 + slack(SLACK)
        assert [r.outcome for r in results] == [Outcome.CREATED, Outcome.CREATED]
        assert server.client().hget(f"kvstatus:{namespace}:{{7}}", "default") is None  # nothing was sent


def test_a_cluster_store_queues_past_max_connections(redis_cluster: RedisClusterServers) -> None:
    """redis-py's cluster clients cannot queue for a connection; the store's gate does, per client."""

    async def run() -> list[BaseException]:
        store = AsyncStatusStore.from_url(redis_cluster.url, namespace=fresh_namespace("cgate"), max_connections=3)
        try:
            results = await asyncio.gather(
                *(store.update_status(i, KVPoll.Bootstrapping) for i in range(100)), return_exceptions=True
            )
        finally:
            await store.close()
        return [r for r in results if isinstance(r, BaseException)]

    assert asyncio.run(run()) == []


# -- 2. a hung server -----------------------------------------------------------------------------------


@contextmanager
def _stopped(pid: int) -> Iterator[None]:
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def _timed(call: Callable[[], Any]) -> tuple[float, BaseException | None]:
    started = time.monotonic()
    try:
        call()
    except BaseException as exc:  # noqa: BLE001 - returned to the test
        return time.monotonic() - started, exc
    return time.monotonic() - started, None


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_a_hung_server_holds_a_call_for_its_deadline_only(asynchronous: bool) -> None:
    """Before: 33.1 s (6 sends x 5 s socket timeout + 3.1 s backoff). Default options: deadline 5 s.
    The write, unknown to the caller, is applied when the server wakes up ("unknown whether applied")."""
    deadline = ConnectionOptions().deadline
    with RedisServer() as server:
        namespace = fresh_namespace("hung")
        if asynchronous:
            loop = asyncio.new_event_loop()
            store: Any = AsyncStatusStore.from_url(server.url, namespace=namespace)
            # connected, and the script cached, before the server hangs
            loop.run_until_complete(store.update_status(1, KVPoll.Bootstrapping))
            call = lambda: loop.run_until_complete(store.update_status(2, KVPoll.Bootstrapping))  # noqa: E731
        else:
            store = StatusStore.from_url(server.url, namespace=namespace)
            store.update_status(1, KVPoll.Bootstrapping)
            call = lambda: store.update_status(2, KVPoll.Bootstrapping)  # noqa: E731
        with _stopped(server.pid):
            took, error = _timed(call)
        assert isinstance(error, BackendUnavailableError), error
        assert "may or may not have been applied" in str(error)
        assert deadline - 0.5 < took < deadline + slack(SLACK)
        applied = lambda: server.client().hget(f"kvstatus:{namespace}:{{2}}", "default")  # noqa: E731
        for _ in range(50):
            if applied() is not None:
                break
            time.sleep(0.05)
        assert applied() == b"1"
        if asynchronous:
            loop.run_until_complete(store.close())
            loop.close()
        else:
            store.close()


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_a_deadline_shorter_than_the_socket_timeout_bounds_each_wait(asynchronous: bool) -> None:
    """socket_timeout 5 s, deadline 1 s: the first wait on the hung server is cut at 1 s; a batch and a
    fresh connection (handshake on a hung server) too."""
    with RedisServer() as server:
        options = dict(deadline=1.0, socket_timeout=5.0)
        namespace = fresh_namespace("cut")
        if asynchronous:
            loop = asyncio.new_event_loop()
            store: Any = AsyncStatusStore.from_url(server.url, namespace=namespace, **options)
            calls = [
                lambda: loop.run_until_complete(store.update_many({1: 1, 2: 1})),
                lambda: loop.run_until_complete(store.get_many([1, 2])),
            ]
        else:
            store = StatusStore.from_url(server.url, namespace=namespace, **options)
            calls = [lambda: store.update_many({1: 1, 2: 1}), lambda: store.get_many([1, 2])]
        with _stopped(server.pid):
            for call in calls:  # the first connects to the hung server: its handshake waits too
                took, error = _timed(call)
                assert isinstance(error, BackendUnavailableError), error
                assert took < 1.0 + slack(SLACK)
        if asynchronous:
            loop.run_until_complete(store.close())
            loop.close()
        else:
            store.close()


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_a_hung_cluster_master_holds_a_call_for_its_deadline_only(asynchronous: bool) -> None:
    with RedisClusterServers(masters=3, node_timeout_ms=30_000) as cluster:
        namespace = fresh_namespace("chung")
        probe = cluster.client()
        room = 5
        key = f"kvstatus:{namespace}:{{{room}}}"
        owner = probe.get_node_from_key(key)
        node = next(n for n in cluster.nodes if n.port == owner.port)
        options = dict(deadline=2.0)
        if asynchronous:
            loop = asyncio.new_event_loop()
            store: Any = AsyncStatusStore.from_url(cluster.url, namespace=namespace, **options)
            loop.run_until_complete(store.get(room))
            call = lambda: loop.run_until_complete(store.update_status(room, 1))  # noqa: E731
        else:
            store = StatusStore.from_url(cluster.url, namespace=namespace, **options)
            store.get(room)
            call = lambda: store.update_status(room, 1)  # noqa: E731
        with _stopped(node.pid):
            took, error = _timed(call)
        assert isinstance(error, BackendUnavailableError), error
        assert took < 2.0 + slack(SLACK)
        if asynchronous:
            loop.run_until_complete(store.close())
            loop.close()
        else:
            store.close()


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_a_hung_sentinel_master_holds_a_call_for_its_deadline_only(asynchronous: bool) -> None:
    with RedisSentinelServers(down_after_ms=30_000) as group:
        namespace = fresh_namespace("shung")
        options = dict(deadline=2.0)
        if asynchronous:
            loop = asyncio.new_event_loop()
            store: Any = AsyncStatusStore.from_url(group.url, namespace=namespace, **options)
            loop.run_until_complete(store.get(1))
            call = lambda: loop.run_until_complete(store.update_status(1, 1))  # noqa: E731
        else:
            store = StatusStore.from_url(group.url, namespace=namespace, **options)
            store.get(1)
            call = lambda: store.update_status(1, 1)  # noqa: E731
        with _stopped(group.current_master().pid):
            took, error = _timed(call)
        assert isinstance(error, BackendUnavailableError), error
        assert took < 2.0 + slack(SLACK)
        if asynchronous:
            loop.run_until_complete(store.close())
            loop.close()
        else:
            store.close()


# -- 3. huge batches and BUSY ---------------------------------------------------------------------------


def test_batches_of_several_chunks_apply_the_rule_room_by_room(backend: RedisUnderTest) -> None:
    """2.5 chunks on every backend: the same per-room results and state as one script call would give."""
    store = backend.store(participant="p")
    rooms = range(int(CHUNK_ROOMS * 2.5))
    store.update_many({room: KVPoll.Transferring for room in rooms if room % 3 == 0})
    results = store.update_many({room: KVPoll.Bootstrapping if room % 2 else KVPoll.Failed for room in rooms})
    assert len(results) == len(rooms)
    for room in rooms:
        expected = (
            (Outcome.FAILED if room % 2 == 0 else Outcome.UNCHANGED)
            if room % 3 == 0
            else (Outcome.IGNORED_MISSING if room % 2 == 0 else Outcome.CREATED)
        )
        assert results[room].outcome is expected, room
    statuses = store.get_many(rooms)
    assert list(statuses) == list(rooms)
    assert statuses == {
        room: (KVPoll.Failed if room % 2 == 0 else KVPoll.Transferring)
        if room % 3 == 0
        else (None if room % 2 == 0 else KVPoll.Bootstrapping)
        for room in rooms
    }
    assert backend.keys_without_ttl() == []


@pytest.mark.slow
def test_a_million_room_batch_lets_other_clients_run() -> None:
    """Before: one script ran ~4-6 s, every other client stalled that long (BUSY past the 5 s timeout).
    Measured after: max PING 0.07 s while update_many of 1,000,000 rooms ran (11 s in all).

    On a server of its own: a failed run left up to a million keys in the session server, and every
    later SCAN there (the state machine's invariants) crawled.
    """
    with RedisServer() as server:
        store = StatusStore.from_url(server.url, namespace=fresh_namespace("huge"))
        pinger = server.client()
        stop = threading.Event()
        worst = [0.0]

        def ping() -> None:
            while not stop.is_set():
                started = time.monotonic()
                pinger.ping()
                worst[0] = max(worst[0], time.monotonic() - started)
                time.sleep(0.005)

        thread = threading.Thread(target=ping)
        thread.start()
        try:
            rooms = range(1_000_000)
            results = store.update_many({room: KVPoll.Bootstrapping for room in rooms})
            polled = store.get_many(rooms)
        finally:
            stop.set()
            thread.join()
            store.close()
        assert len(results) == len(rooms) and {r.outcome for r in results.values()} == {Outcome.CREATED}
        assert len(polled) == len(rooms) and set(polled.values()) == {KVPoll.Bootstrapping}
        assert worst[0] < 1.0, f"another client's PING waited {worst[0]:.2f} s"


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_busy_is_its_own_error_and_is_not_resent(asynchronous: bool) -> None:
    """A script of another client holds Redis past busy-reply-threshold: the call answers BackendBusyError
    (not "Redis unavailable", not a plain BackendError) at once, and was not run."""
    with RedisServer(extra_args=["--busy-reply-threshold", "100"]) as server:
        namespace = fresh_namespace("busy")
        if asynchronous:
            loop = asyncio.new_event_loop()
            store: Any = AsyncStatusStore.from_url(server.url, namespace=namespace)
            loop.run_until_complete(store.get(1))
            call = lambda: loop.run_until_complete(store.update_status(1, 1))  # noqa: E731
        else:
            store = StatusStore.from_url(server.url, namespace=namespace)
            store.get(1)
            call = lambda: store.update_status(1, 1)  # noqa: E731
        spin = "local t = redis.call('TIME') repeat local n = redis.call('TIME') until n[1] - t[1] >= 2"
        runner = threading.Thread(target=lambda: server.client().eval(spin, 0))
        runner.start()
        time.sleep(0.3)
        took, error = _timed(call)
        runner.join()
        assert isinstance(error, BackendBusyError), error
        assert "busy running a script (BUSY)" in str(error) and "unavailable" not in str(error)
        assert took < 1.0
        assert server.client().exists(f"kvstatus:{namespace}:{{1}}") == 0
        if asynchronous:
            loop.run_until_complete(store.close())
            loop.close()
        else:
            store.close()


# -- 4. reads are reads ---------------------------------------------------------------------------------


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_a_poll_is_not_stalled_by_client_pause_write(asynchronous: bool) -> None:
    """A manual failover pauses writes. Before (get_many.lua without `#!lua flags=no-writes`): each poll
    stalled for the whole pause (2.07 s of 2 s). get and room were never stalled."""
    with RedisServer() as server:
        namespace = fresh_namespace("pause")
        if asynchronous:
            loop = asyncio.new_event_loop()
            store: Any = AsyncStatusStore.from_url(server.url, namespace=namespace)
            run: Callable[[Any], Any] = loop.run_until_complete
        else:
            store = StatusStore.from_url(server.url, namespace=namespace)
            run = lambda result: result  # noqa: E731
        run(store.update_many({room: KVPoll.Bootstrapping for room in range(10)}))
        run(store.get_many(range(10)))  # the scripts are cached on the server (a first EVALSHA is not)
        run(store.room(1))
        server.client().execute_command("CLIENT", "PAUSE", 3000, "WRITE")
        for read in (
            lambda: store.get_many(range(10)),
            lambda: store.get(1),
            lambda: store.room(1),
            lambda: store.get_many(range(2 * CHUNK_ROOMS)),
        ):
            took, error = _timed(lambda: run(read()))  # noqa: B023 - used at once, in this iteration
            assert error is None and took < 1.0, (took, error)
        took, error = _timed(lambda: run(store.update_status(1, KVPoll.Transferring)))
        assert error is None and took > 1.0  # the pause does hold writes: the test can tell
        if asynchronous:
            loop.run_until_complete(store.close())
            loop.close()
        else:
            store.close()


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_a_store_on_a_read_only_replica_reads(asynchronous: bool) -> None:
    with RedisServer() as master, RedisServer() as replica:
        namespace = fresh_namespace("replica")
        StatusStore.from_url(master.url, namespace=namespace).update_many({1: 1, 2: 3})
        replica.client().replicaof(master.host, master.port)
        raw = replica.client()
        for _ in range(100):
            if raw.hget(f"kvstatus:{namespace}:{{2}}", "default") == b"3":
                break
            time.sleep(0.05)
        assert raw.info("replication")["role"] == "slave"
        if asynchronous:
            loop = asyncio.new_event_loop()
            store: Any = AsyncStatusStore.from_url(replica.url, namespace=namespace)
            run: Callable[[Any], Any] = loop.run_until_complete
        else:
            store = StatusStore.from_url(replica.url, namespace=namespace)
            run = lambda result: result  # noqa: E731
        assert run(store.get_many([1, 2, 3])) == {1: KVPoll.Bootstrapping, 2: KVPoll.Transferring, 3: None}
        assert run(store.get(2)) is KVPoll.Transferring
        assert run(store.room(1)).participants["default"].status is KVPoll.Bootstrapping
        with pytest.raises(BackendUnavailableError, match="read only replica"):
            run(store.update_status(1, 2))  # a write on a replica is refused, not half-done
        if asynchronous:
            loop.run_until_complete(store.close())
            loop.close()
        else:
            store.close()
