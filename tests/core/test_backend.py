"""kvstatus.Backend: what the stores on one client share (the cluster gate, the near cache their waits watch on),
held by the backend itself rather than hung on the redis-py client."""

from __future__ import annotations

import asyncio

import pytest
import redis
import redis.asyncio

from kvstatus import AsyncStatusStore, Backend, ConnectionOptions, InvalidArgumentError, KVPoll, StatusStore
from kvstatus.concurrency import AsyncGate, Gate
from tests.helpers.backends import fresh_namespace
from tests.nearcache.helpers import eventually
from tests.servers import RedisClusterServers, RedisServer

pytestmark = pytest.mark.real


def _watch_connections(admin: redis.Redis) -> set[int]:
    """IDs of the server's near-cache connections: each tracked data connection (flag ``t``, a REDIRECT) and the
    invalidation connection it redirects to."""
    tracked = [c for c in admin.client_list() if "t" in c["flags"]]
    return {int(c["id"]) for c in tracked} | {
        int(c["redir"]) for c in tracked if c.get("redir") not in (None, "0", "-1")
    }


def test_stores_on_one_backend_share_its_gate_and_a_store_on_the_client_has_its_own(
    redis_cluster: RedisClusterServers,
) -> None:
    name = fresh_namespace("be")
    serving = StatusStore.from_url(redis_cluster.url, namespace=name, participant="prefill-0", max_connections=7)
    try:
        audit = StatusStore(serving.backend, namespace=name, participant="auditor")
        gate = serving.backend.gate(Gate)
        assert isinstance(gate, Gate) and gate.limit == 7
        assert audit.backend is serving.backend and audit.options.max_connections == 7
        assert audit._sender.gate is gate and serving.for_participant("decode-0")._sender.gate is gate
        alone = StatusStore(serving.client, namespace=name, participant="auditor")
        assert alone.backend is not serving.backend and alone._sender.gate is not gate
        assert alone._sender.gate is not None and alone._sender.gate.limit == ConnectionOptions().max_connections
        audit.update_status(1, KVPoll.Bootstrapping)
        assert serving.for_participant("auditor").get(1) == KVPoll.Bootstrapping
        with pytest.raises(InvalidArgumentError, match="AsyncStatusStore needs a redis.asyncio redis-py client"):
            AsyncStatusStore(serving.backend, namespace=name)
        with pytest.raises(InvalidArgumentError, match="this backend's gate is a Gate, not a AsyncGate"):
            serving.backend.gate(AsyncGate)
    finally:
        serving.for_participant("auditor").clear(1)
        serving.close()


def test_a_standalone_client_has_no_gate(redis_server: RedisServer) -> None:
    backend = Backend(redis_server.client())
    assert backend.gate(Gate) is None and backend.gate(AsyncGate) is None
    assert not backend.cluster and backend.options == ConnectionOptions()


def test_a_backend_carries_its_options_and_is_not_wrapped_twice(redis_server: RedisServer) -> None:
    backend = Backend(redis_server.client(), ConnectionOptions(deadline=2))
    with pytest.raises(InvalidArgumentError, match="options belong to the backend"):
        StatusStore(backend, namespace="be", options=ConnectionOptions(deadline=2))
    with pytest.raises(InvalidArgumentError, match="got a Backend"):
        Backend(backend)
    assert StatusStore(backend, namespace="be").options.deadline == 2


def test_waits_of_the_stores_on_a_backend_share_one_near_cache_closed_with_it(
    redis_server: RedisServer,
) -> None:
    admin = redis_server.client()
    name = fresh_namespace("be")
    serving = StatusStore.from_url(redis_server.url, namespace=name, participant="decode-0")
    other = StatusStore(serving.backend, namespace=name, participant="prefill-0")
    before = _watch_connections(admin)
    other.update_status(3, KVPoll.Success)
    assert serving.wait_for(3, KVPoll.Success, timeout=5, participant="prefill-0") == KVPoll.Success
    assert other.wait_for(3, KVPoll.Success, timeout=5) == KVPoll.Success
    opened = _watch_connections(admin) - before
    assert len(opened) == 2  # one near cache (a data and an invalidation connection) for both stores' waits
    other.clear(3)
    serving.close()
    assert not (_watch_connections(admin) & opened)


def test_an_async_store_shares_its_backend_too(redis_server: RedisServer) -> None:
    async def run() -> None:
        name = fresh_namespace("be")
        store = AsyncStatusStore.from_url(redis_server.url, namespace=name, participant="decode-0")
        other = AsyncStatusStore(store.backend, namespace=name, participant="prefill-0")
        await other.update_status(4, KVPoll.Transferring)
        assert await store.wait_for(4, KVPoll.Transferring, timeout=5, participant="prefill-0") == KVPoll.Transferring
        await other.clear(4)
        await store.close()

    asyncio.run(run())


def test_uncached_reads_redis_on_the_same_backend(redis_server: RedisServer) -> None:
    name = fresh_namespace("be")
    store = StatusStore.from_url(
        redis_server.url, namespace=name, participant="decode-0", near_cache=True, lease_ttl=5, timeline=True
    )
    try:
        plain = store.uncached()
        assert (plain.participant, plain.backend, plain.timeline) == ("decode-0", store.backend, True)
        assert plain.near_cache is None and plain.lease is None and store.lease is not None
        other = store.uncached("prefill-0")
        assert other.participant == "prefill-0" and other.near_cache is None
        store.update_status(5, KVPoll.WaitingForInput)
        assert plain.get(5) == KVPoll.WaitingForInput and other.get(5) is None
    finally:
        store.clear(5)
        store.close()


def test_the_doctor_leaves_the_callers_backend_open(redis_server: RedisServer) -> None:
    """The doctor's wait_for check watches on a near cache of its own, closed after it: the backend it is given
    keeps the cache its waits watch on, opened by the first wait and reused by the next."""
    from kvstatus.admin.doctor import run_checks
    from kvstatus.keys import KeySchema

    admin = redis_server.client()
    name = fresh_namespace("be")
    backend = Backend(redis_server.client())
    checks = {check.name: check for check in run_checks(backend, KeySchema(name))}
    assert checks["wait_for push"].ok, checks["wait_for push"]
    store = StatusStore(backend, namespace=name, participant="w")
    before = _watch_connections(admin)
    store.update_status(6, KVPoll.Success)
    assert store.wait_for(6, KVPoll.Success, timeout=5) == KVPoll.Success
    opened = _watch_connections(admin) - before
    assert len(opened) == 2  # the backend's near cache for waits: a data and an invalidation connection
    assert store.wait_for(6, KVPoll.Success, timeout=5) == KVPoll.Success
    assert _watch_connections(admin) - before == opened  # the next wait reuses them
    store.clear(6)
    store.close()  # Redis drops a closed client on its next turn: CLIENT LIST may show it a moment longer
    eventually(lambda: not (_watch_connections(admin) & opened), what="the waits' near cache closed")


def test_the_admin_reads_on_a_backend_share_one_sender(redis_server: RedisServer) -> None:
    """The admin tools build their sender once per backend (it was one per read): a second backend gets its own."""
    from kvstatus.admin.reads import sender_of, server_ms

    backend = Backend(redis_server.client())
    first = sender_of(backend)
    assert server_ms(backend) > 0 and server_ms(backend) > 0
    assert sender_of(backend) is first
    assert sender_of(Backend(backend.client)) is not first
    with pytest.raises(InvalidArgumentError, match="admin sender is a Sender, not a Gate"):
        backend.shared("admin sender", Gate, lambda: Gate(1))


def test_the_admin_sender_of_a_cluster_backend_takes_its_gate(redis_cluster: RedisClusterServers) -> None:
    """Building the sender takes the backend's gate: under the backend's lock it deadlocked (every admin read on a
    cluster hung, found by the suite before it landed)."""
    from kvstatus.admin.reads import sender_of, server_ms

    backend = Backend(redis_cluster.client())
    assert server_ms(backend) > 0
    assert sender_of(backend).gate is backend.gate(Gate) is not None


def test_a_store_refuses_a_client_of_the_other_kind_by_name(redis_server: RedisServer) -> None:
    """An asyncio client under StatusStore unpacked a coroutine at its first call (TypeError); a blocking one under
    AsyncStatusStore blocked the event loop on every call, without a word. Both are refused when built, naming
    the client and the store to use, as a Backend on either is."""
    blocking, asyncio_client = redis_server.client(), redis.asyncio.Redis(port=redis_server.port)
    for client in (asyncio_client, Backend(asyncio_client)):
        with pytest.raises(
            InvalidArgumentError,
            match=r"StatusStore needs a blocking redis-py client, not redis\.asyncio\.client\.Redis: use AsyncStatusStore",
        ):
            StatusStore(client, namespace="be")
    for client in (blocking, Backend(blocking)):
        with pytest.raises(
            InvalidArgumentError,
            match=r"AsyncStatusStore needs a redis\.asyncio redis-py client, not redis\.client\.Redis: use StatusStore",
        ):
            AsyncStatusStore(client, namespace="be")
    assert StatusStore(blocking, namespace="be").get(1) is None
