"""Fixtures shared by every folder: real servers and the backends of the semantic tests.

The tiers (markers ``unit``, ``real``, ``slow``) and the one way to require a
real redis-server are in :mod:`tests.helpers.tiers`, whose hooks are imported
here; tests/README.md says which folder holds what.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Iterator

import fakeredis
import fakeredis.aioredis
import pytest
import redis
import redis.asyncio
from redis.asyncio.cluster import ClusterNode as AsyncClusterNode
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

from kvstatus.demo.fakelua import accept_script_shebang
from tests.helpers.backends import RedisUnderTest
from tests.helpers.tiers import (  # noqa: F401  pytest finds hooks and fixtures by name here
    _redis_server_needs_the_real_marker,
    pytest_collection_modifyitems,
    pytest_runtest_setup,
)
from tests.servers import RedisClusterServers, RedisServer, ports

accept_script_shebang()  # fakeredis does not strip get_many.lua's "#!lua flags=no-writes" as Redis does


OWNED_THREADS = ("kvstatus-lease-", "kvstatus-probe-", "kvstatus-watch", "kvstatus-pass-")
"""The threads kvstatus starts for an object that close() ends: a store's lease keeper and its backend's wait_for
watch reader, an SGLang manager's outage probe, the board's scanner."""
THREAD_GRACE_SECONDS = 1.0


@pytest.fixture(autouse=True)
def _no_keeper_outlives_its_test() -> Iterator[None]:
    """Fail a test whose stores, managers or boards still run a thread of :data:`OWNED_THREADS` after its teardown.

    Left open, such a thread renews, watches and reconnects for the rest of the worker, against a server that
    may be gone: other tests then see its connections (tests/core/test_refused.py counted one) and its calls to
    the random module (hypothesis warned). The fixtures' own teardowns run first (this one is set up first)."""
    before = set(threading.enumerate())
    yield
    born = [t for t in threading.enumerate() if t not in before and t.name.startswith(OWNED_THREADS)]
    for thread in born:
        thread.join(THREAD_GRACE_SECONDS)  # close() joins them; one it did not close may still be winding down
    alive = sorted(t.name for t in born if t.is_alive())
    assert not alive, f"close the store or manager that runs {alive}: its thread outlived the test"


def pytest_configure(config: pytest.Config) -> None:
    """Each pytest-xdist worker (or the one process without xdist) starts its servers on its own port range."""
    worker: dict[str, Any] | None = getattr(config, "workerinput", None)
    if worker is None:
        ports.install(0, 1)
    else:
        ports.install(int(str(worker["workerid"]).removeprefix("gw")), int(worker["workercount"]))


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """A real redis-server started for this test session on a free loopback port."""
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisClusterServers]:
    """A real 3-master Redis Cluster (no replicas) started for this test session (per xdist worker).

    No test stops or pauses it: a node timeout of 15 s (not the launcher's 1 s) keeps a busy machine
    from getting a healthy node marked failed, which takes the whole cluster down.
    """
    with RedisClusterServers(masters=3, node_timeout_ms=15_000) as cluster:
        yield cluster


def _cluster_backend(cluster: RedisClusterServers, asynchronous: bool) -> RedisUnderTest:
    """Stores of one test share one cluster client: each new one would fetch the slot map and COMMAND."""
    raw = cluster.client()
    if asynchronous:
        nodes = [AsyncClusterNode(host, port) for host, port in cluster.startup_nodes]
        shared = _once(lambda: AsyncRedisCluster(startup_nodes=nodes))
        return RedisUnderTest("cluster-async", raw, shared, True, cluster)
    return RedisUnderTest("cluster", raw, _once(cluster.client), False, cluster)


def _once(make: Callable[[], Any]) -> Callable[[], Any]:
    made: list[Any] = []
    return lambda: made[0] if made else made.append(make()) or made[0]


def _fake_backend(asynchronous: bool) -> RedisUnderTest:
    server = fakeredis.FakeServer()
    raw = fakeredis.FakeRedis(server=server)
    if asynchronous:
        return RedisUnderTest("fake-async", raw, lambda: fakeredis.aioredis.FakeRedis(server=server), True)
    return RedisUnderTest("fake", raw, lambda: fakeredis.FakeRedis(server=server), False)


def _real_backend(server: RedisServer, asynchronous: bool) -> RedisUnderTest:
    raw = redis.Redis(host=server.host, port=server.port)
    if asynchronous:
        return RedisUnderTest(
            "real-async", raw, lambda: redis.asyncio.Redis(host=server.host, port=server.port), True, server
        )
    return RedisUnderTest("real", raw, lambda: redis.Redis(host=server.host, port=server.port), False, server)


BACKENDS = [
    "fake",
    "fake-async",
    pytest.param("real", marks=pytest.mark.real),
    pytest.param("real-async", marks=pytest.mark.real),
    pytest.param("cluster", marks=pytest.mark.real),
    pytest.param("cluster-async", marks=pytest.mark.real),
]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> Iterator[RedisUnderTest]:
    """Each semantic test runs on fakeredis, a real Redis and a real 3-master Redis Cluster,
    through the sync and the async store."""
    name: str = request.param
    asynchronous = name.endswith("async")
    if name.startswith("cluster"):
        made = _cluster_backend(request.getfixturevalue("redis_cluster"), asynchronous)
    elif name.startswith("real"):
        made = _real_backend(request.getfixturevalue("redis_server"), asynchronous)
    else:
        made = _fake_backend(asynchronous)
    try:
        yield made
    finally:
        made.close()


@pytest.fixture(params=["fake", pytest.param("real", marks=pytest.mark.real)])
def sync_backend(request: pytest.FixtureRequest) -> Iterator[RedisUnderTest]:
    """fakeredis and a real Redis, sync store only (for tests about the wire, not the API)."""
    made = (
        _real_backend(request.getfixturevalue("redis_server"), False)
        if request.param == "real"
        else _fake_backend(False)
    )
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def raw_client(backend: RedisUnderTest) -> Any:
    return backend.raw
