"""TLS mistakes (issue 9, item 15): rediss:// at a plain-text server fails at once and says so; ssl_* options
on a plain-text scheme are refused instead of being ignored."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterator

import pytest
import redis

from kvstatus import AsyncStatusStore, StatusStore
from kvstatus.connection import _BUILDERS, connect, connect_async
from kvstatus.errors import BackendUnavailableError, InvalidURLError
from kvstatus.url import TLS_SCHEMES, parse_url
from tests.helpers.tiers import require_redis_server
from tests.servers import RedisServer
from tests.servers.tls import make_tls_files

PLAIN_SCHEMES = sorted(set(_BUILDERS) - TLS_SCHEMES)
SSL_OPTIONS = [
    "ssl_ca_certs=/ca.pem",
    "ssl_certfile=/c.pem",
    "ssl_keyfile=/k.pem",
    "ssl_check_hostname=false",
]


def plain_url(scheme: str) -> str:
    return {"unix": "unix:///run/redis.sock", "redis+sentinel": "redis+sentinel://h:26379/svc/0"}.get(
        scheme, f"{scheme}://127.0.0.1:6379"
    )


@pytest.mark.parametrize("scheme", PLAIN_SCHEMES)
@pytest.mark.parametrize("option", SSL_OPTIONS)
def test_ssl_options_on_a_plain_scheme_are_refused(scheme: str, option: str) -> None:
    with pytest.raises(InvalidURLError, match="need a TLS scheme"):
        parse_url(f"{plain_url(scheme)}?{option}")


@pytest.mark.parametrize("scheme", PLAIN_SCHEMES)
def test_ssl_keyword_options_on_a_plain_scheme_are_refused(scheme: str) -> None:
    for make in (connect, connect_async):
        with pytest.raises(InvalidURLError, match="plain text; use a TLS scheme"):
            make(plain_url(scheme), ssl_ca_certs="/ca.pem")


@pytest.fixture(scope="module")
def plain_server() -> Iterator[RedisServer]:
    require_redis_server()
    with RedisServer() as server:
        yield server


@pytest.fixture
def connections(plain_server: RedisServer) -> Iterator[Callable[[], int]]:
    """Connections the server has accepted so far (read over one connection kept open)."""
    with redis.Redis(host=plain_server.host, port=plain_server.port) as admin:
        yield lambda: int(admin.info("stats")["total_connections_received"])


@pytest.mark.real
def test_rediss_against_plain_text_says_so_and_does_not_retry(plain_server: RedisServer, connections) -> None:
    before = connections()
    store = StatusStore.from_url(f"rediss://127.0.0.1:{plain_server.port}/0", namespace="x")
    with pytest.raises(BackendUnavailableError, match="TLS handshake failed: is the server TLS"):
        store.get(1)
    # One handshake (bounded by socket_connect_timeout) and one plain PING that proves the server is plain
    # text: never the 6 x 5 s of resends that took 34 s before.
    assert connections() - before == 2


@pytest.mark.real
async def test_rediss_against_plain_text_says_so_async(plain_server: RedisServer, connections) -> None:
    before = connections()
    store = AsyncStatusStore.from_url(f"rediss://127.0.0.1:{plain_server.port}/0", namespace="x")
    with pytest.raises(BackendUnavailableError, match="TLS handshake failed: is the server TLS"):
        await store.get(1)
    assert connections() - before == 2


@pytest.mark.real
@pytest.mark.tls
def test_a_bad_certificate_is_named_and_not_retried(tmp_path: Path) -> None:
    require_redis_server()
    tls = make_tls_files(tmp_path)
    with RedisServer(tls=tls) as server:
        store = StatusStore.from_url(f"rediss://127.0.0.1:{server.port}/0", namespace="x")  # no ssl_ca_certs
        with pytest.raises(BackendUnavailableError, match="TLS certificate verification failed"):
            store.get(1)
        good = StatusStore.from_url(f"rediss://127.0.0.1:{server.port}/0?ssl_ca_certs={tls.ca}", namespace="x")
        assert good.get(1) is None
