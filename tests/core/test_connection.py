"""URLs, timeouts, retries and errors of real connections; passwords never leak."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from kvstatus import (
    AsyncStatusStore,
    AuthenticationError,
    BackendUnavailableError,
    InvalidURLError,
    KVPoll,
    Outcome,
    StatusStore,
)
from kvstatus.connection import ConnectionOptions, connect, parse_url
from kvstatus.redact import mask_url
from tests.servers import RedisServer, free_port, make_tls_files
from tests.helpers.backends import fresh_namespace

SECRET = "s3cr3t-Pa55"


@pytest.mark.parametrize(
    "url, hosts, db, username, password",
    [
        ("redis://localhost:6379/0", (("localhost", 6379),), 0, None, None),
        ("redis://h", (("h", 6379),), 0, None, None),
        ("redis://:pw@h:7000/3", (("h", 7000),), 3, None, "pw"),
        ("redis://user:p%40ss@h:7000", (("h", 7000),), 0, "user", "p@ss"),
        ("rediss://[::1]:6380/1", (("::1", 6380),), 1, None, None),
        ("redis://h:1/?db=5", (("h", 1),), 5, None, None),
    ],
)
def test_parse_url_accepts_the_documented_forms(url, hosts, db, username, password) -> None:
    parsed = parse_url(url)
    assert (parsed.hosts, parsed.db, parsed.username, parsed.password) == (hosts, db, username, password)


def test_parse_unix_url() -> None:
    parsed = parse_url("unix:///run/redis.sock?db=2")
    assert (parsed.path, parsed.db, parsed.hosts) == ("/run/redis.sock", 2, ())


@pytest.mark.parametrize(
    "url, complaint",
    [
        ("http://h:6379", "unsupported scheme 'http'"),
        ("redis://h:notaport", "bad port"),
        ("redis://h:70000", "bad port"),
        ("redis://h/abc", "database is not a number"),
        ("redis://h?colour=red", "unknown option 'colour'"),
        ("redis://h?socket_timeout=soon", "bad value for option 'socket_timeout'"),
        ("rediss://h?ssl_cert_reqs=maybe", "bad value for option 'ssl_cert_reqs'"),
        ("unix://", "needs a socket path"),
        ("", "expected a string"),
        ("redis://a:1,b:2", "takes one host"),
    ],
)
def test_bad_urls_name_the_problem(url: str, complaint: str) -> None:
    with pytest.raises(InvalidURLError, match=complaint):
        connect(url)


def test_bad_url_errors_never_show_the_password() -> None:
    for url in (
        f"redis://user:{SECRET}@h:bad",
        f"redis://:{SECRET}@h?nope=1",
        f"ftp://u:{SECRET}@h",
        # Unencoded / ? # @ in a password move urlsplit's boundaries; no part of it may show.
        "redis://:Ab/s3cr3t-Pa55==@127.0.0.1:1/0",
        "redis://:Ab?s3cr3t-Pa55@127.0.0.1:1/0",
        "redis://:Ab#s3cr3t-Pa55@127.0.0.1:1/0",
        "redis://:s3cr3t@-Pa55@127.0.0.1:x/0",
        "redis://us/er:s3cr3t-Pa55@127.0.0.1:x/0",
    ):
        with pytest.raises(InvalidURLError) as info:
            connect(url)
        text = str(info.value)
        assert "s3cr3t" not in text and "Pa55" not in text and "***" in text, text


def test_mask_url_hides_passwords_only() -> None:
    assert mask_url(f"redis://user:{SECRET}@h:1/0") == "redis://user:***@h:1/0"
    assert mask_url("redis://h:1/0") == "redis://h:1/0"
    assert SECRET not in repr(parse_url(f"rediss://:{SECRET}@h:1"))


def test_retry_budget_is_documented_in_seconds() -> None:
    options = ConnectionOptions()
    assert options.retry_budget() == pytest.approx(0.1 + 0.2 + 0.4 + 0.8 + 1.6)


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
