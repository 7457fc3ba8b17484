"""TLS on every topology (standalone, cluster, Sentinel) and credentials that never leak, on real servers."""

from __future__ import annotations

import asyncio
import logging
from typing import Iterator

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
from tests.servers import (
    RedisClusterServers,
    RedisSentinelServers,
    RedisServer,
    TLSFiles,
    make_tls_files,
)

SECRET = "Top-s3cret-pw"
SENTINEL_SECRET = "Sentinel-s3cret"

# One xdist worker runs this module, so the TLS cluster and Sentinel group below start once, not on each.
pytestmark = [pytest.mark.xdist_group("tls-topologies"), pytest.mark.tls]


# ------------------------------------------------------------------ real TLS groups


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TLSFiles:
    return make_tls_files(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def tls_standalone(tls_files: TLSFiles) -> Iterator[RedisServer]:
    with RedisServer(tls=tls_files, password=SECRET, tls_auth_clients="yes") as server:
        yield server


@pytest.fixture(scope="module")
def tls_cluster(tls_files: TLSFiles) -> Iterator[RedisClusterServers]:
    with RedisClusterServers(tls=tls_files, password=SECRET) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def tls_sentinel(tls_files: TLSFiles) -> Iterator[RedisSentinelServers]:
    with RedisSentinelServers(tls=tls_files, password=SECRET, sentinel_password=SENTINEL_SECRET) as group:
        yield group


def _tls_url(request: pytest.FixtureRequest, topology: str, tls: TLSFiles, *, client_cert: bool = True) -> str:
    group = request.getfixturevalue(f"tls_{topology}")
    url = group.url
    options = f"ssl_ca_certs={tls.ca}&ssl_check_hostname=true"
    if client_cert:
        options += f"&ssl_certfile={tls.client_cert}&ssl_keyfile={tls.client_key}"
    return url + ("&" if "?" in url else "?") + options


TOPOLOGIES = [pytest.param(t, marks=pytest.mark.real) for t in ("standalone", "cluster", "sentinel")]


@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_tls_only_servers_work_on_every_topology(
    request: pytest.FixtureRequest, topology: str, tls_files: TLSFiles, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    url = _tls_url(request, topology, tls_files)
    assert url.startswith("rediss")
    with StatusStore.from_url(url, namespace=fresh_namespace("tls")) as store:
        assert store.update_status(1, KVPoll.Bootstrapping).outcome is Outcome.CREATED
        assert store.update_many({r: KVPoll.Transferring for r in range(100)})[99].outcome is Outcome.CREATED
        assert store.get_many([1, 99]) == {1: KVPoll.Transferring, 99: KVPoll.Transferring}
        for text in (repr(store), repr(store.client), caplog.text):
            assert SECRET not in text and SENTINEL_SECRET not in text


@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_tls_async_store(request: pytest.FixtureRequest, topology: str, tls_files: TLSFiles) -> None:
    async def run() -> None:
        async with AsyncStatusStore.from_url(
            _tls_url(request, topology, tls_files), namespace=fresh_namespace("atls")
        ) as store:
            await store.update_many({r: KVPoll.WaitingForInput for r in range(20)})
            assert await store.get(19) is KVPoll.WaitingForInput

    asyncio.run(run())


@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_wrong_passwords_never_leak(
    request: pytest.FixtureRequest, topology: str, tls_files: TLSFiles, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    wrong = "Wr0ng-" + SECRET
    url = _tls_url(request, topology, tls_files).replace(f":{SECRET}@", f":{wrong}@")
    stores = []
    with pytest.raises(AuthenticationError) as info:  # a sync cluster client refuses already in from_url
        stores.append(StatusStore.from_url(url, namespace="x", retries=1))
        stores[0].update_status(1, KVPoll.Bootstrapping)
    async_store = AsyncStatusStore.from_url(url, namespace="x", retries=1)
    with pytest.raises(AuthenticationError) as async_info:  # the async cluster client connects lazily
        asyncio.run(async_store.get(1))
    texts = [
        str(info.value),
        repr(info.value),
        caplog.text,
        str(info.value.__cause__),
        str(async_info.value),
        repr(async_store),
        *(repr(store) for store in stores),
        *(repr(store.client) for store in stores),
    ]
    for text in texts:
        assert wrong not in text and SECRET not in text and SENTINEL_SECRET not in text


@pytest.mark.real
def test_wrong_sentinel_password_never_leaks(request: pytest.FixtureRequest, tls_files: TLSFiles) -> None:
    wrong = "Wr0ng-" + SENTINEL_SECRET
    url = _tls_url(request, "sentinel", tls_files).replace(
        f"sentinel_password={SENTINEL_SECRET}", f"sentinel_password={wrong}"
    )
    store = StatusStore.from_url(url, namespace="x", retries=1)
    with pytest.raises(AuthenticationError, match="Sentinels refused the credentials") as info:
        store.get(1)
    assert wrong not in str(info.value) and SECRET not in str(info.value)
    assert len(str(info.value)) < 200


@pytest.mark.real
def test_tls_client_certificate_is_passed_through(request: pytest.FixtureRequest, tls_files: TLSFiles) -> None:
    url = _tls_url(request, "standalone", tls_files, client_cert=False)  # this server requires one
    with pytest.raises(BackendUnavailableError) as info:
        StatusStore.from_url(url, namespace="x", retries=0).get(1)
    assert SECRET not in str(info.value)


@pytest.mark.real
def test_tls_needs_the_ca(tls_standalone: RedisServer) -> None:
    url = f"rediss://:{SECRET}@127.0.0.1:{tls_standalone.port}/0"  # no CA: the test CA is not trusted
    with pytest.raises(BackendUnavailableError, match="certificate") as info:
        StatusStore.from_url(url, namespace="x", retries=0).get(1)
    assert SECRET not in str(info.value)
