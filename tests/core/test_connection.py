"""Timeouts, retries and errors of connections (unreachable ports, real password, unix and TLS servers)."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from kvstatus import (
    AsyncStatusStore,
    AuthenticationError,
    BackendUnavailableError,
    KVPoll,
    Outcome,
    StatusStore,
)
from tests.helpers.backends import fresh_namespace
from tests.servers import RedisServer, free_port, make_tls_files

SECRET = "s3cr3t-Pa55"


def _closed_port() -> int:
    port = free_port()
    with socket.socket() as probe:  # nothing listens there
        assert probe.connect_ex(("127.0.0.1", port)) != 0
    return port


def test_unreachable_server_is_a_clear_error_after_retries() -> None:
    port = _closed_port()
    store = StatusStore.from_url(f"redis://:{SECRET}@127.0.0.1:{port}/0", namespace="x", retries=1)
    with pytest.raises(BackendUnavailableError, match=f"127.0.0.1:{port}") as info:
        store.update_status(1, KVPoll.Bootstrapping)
    assert SECRET not in str(info.value)


async def test_unreachable_server_async() -> None:
    store = AsyncStatusStore.from_url(f"redis://127.0.0.1:{_closed_port()}/0", namespace="x", retries=0)
    with pytest.raises(BackendUnavailableError):
        await store.get(1)


@pytest.fixture(scope="module")
def password_server():
    with RedisServer(password=SECRET) as server:
        yield server


@pytest.mark.real
def test_from_url_with_password_works(password_server: RedisServer) -> None:
    url = f"redis://:{SECRET}@127.0.0.1:{password_server.port}/0"
    with StatusStore.from_url(url, namespace=fresh_namespace()) as store:
        assert store.update_status(1, KVPoll.Bootstrapping).outcome is Outcome.CREATED
        assert SECRET not in repr(store)


@pytest.mark.real
def test_wrong_password_is_an_authentication_error_without_the_password(password_server: RedisServer) -> None:
    store = StatusStore.from_url(f"redis://:wrong-{SECRET}@127.0.0.1:{password_server.port}/0", namespace="x")
    with pytest.raises(AuthenticationError) as info:
        store.get(1)
    assert SECRET not in str(info.value)


def _connections_received(server: RedisServer) -> int:
    return int(server.client().info("stats")["total_connections_received"])


@pytest.mark.real
def test_refused_credentials_are_not_retried(password_server: RedisServer) -> None:
    url = f"redis://:wrong-{SECRET}@127.0.0.1:{password_server.port}/0"
    for store in (StatusStore.from_url(url, namespace="x"), AsyncStatusStore.from_url(url, namespace="x")):
        before = _connections_received(password_server)
        with pytest.raises(AuthenticationError):
            result = store.get(1)
            if not isinstance(store, StatusStore):
                asyncio.run(result)
        # One connection for the attempt (plus the one counting them), not one per configured retry.
        assert _connections_received(password_server) - before == 2


@pytest.mark.real
def test_unix_socket(tmp_path: Path) -> None:
    sock = tmp_path / "redis.sock"
    with RedisServer(extra_args=["--unixsocket", str(sock), "--unixsocketperm", "700"]):
        with StatusStore.from_url(f"unix://{sock}?db=1", namespace=fresh_namespace()) as store:
            store.update_status(5, KVPoll.WaitingForInput)
            assert store.get(5) is KVPoll.WaitingForInput


@pytest.mark.real
@pytest.mark.tls
def test_tls(tmp_path: Path) -> None:
    tls = make_tls_files(tmp_path)
    with RedisServer(tls=tls) as server:
        url = f"rediss://127.0.0.1:{server.port}/0?ssl_ca_certs={tls.ca}"
        with StatusStore.from_url(url, namespace=fresh_namespace()) as store:
            assert store.update_status(1, KVPoll.Transferring).outcome is Outcome.CREATED
        plain = StatusStore.from_url(f"redis://127.0.0.1:{server.port}/0", namespace="x", retries=0)
        with pytest.raises(BackendUnavailableError):
            plain.get(1)


async def test_unreachable_cluster_is_a_clear_error_async() -> None:
    store = AsyncStatusStore.from_url(f"redis+cluster://:{SECRET}@127.0.0.1:{_closed_port()}", namespace="x", retries=1)
    with pytest.raises(BackendUnavailableError) as info:
        await store.update_status(1, KVPoll.Bootstrapping)
    assert SECRET not in str(info.value)


def test_unreachable_cluster_is_a_clear_error() -> None:
    with pytest.raises(BackendUnavailableError) as info:
        StatusStore.from_url(f"redis+cluster://:{SECRET}@127.0.0.1:{_closed_port()}", namespace="x", retries=1)
    assert SECRET not in str(info.value)
