"""The test launchers of tests/servers: TLS files, a Redis Cluster, a Sentinel group (real processes)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from tests.servers import RedisClusterServers, RedisSentinelServers, RedisServer, RedisServerNotFound, TLSFiles
from tests.servers import tls as tls_files


def _no_retry_client(host: str, port: int, **kwargs: object) -> redis.Redis:
    return redis.Redis(
        host=host, port=port, socket_connect_timeout=1, socket_timeout=2, retry=Retry(NoBackoff(), 0), **kwargs
    )  # type: ignore[arg-type]


def test_missing_redis_cli_raises_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(RedisServerNotFound, match="redis-cli"):
        RedisClusterServers().start()


def _tls_generators() -> list[object]:
    return [
        pytest.param(tls_files._make_tls_files_trustme, id="trustme"),
        pytest.param(tls_files._make_tls_files_openssl, id="openssl"),
    ]


@pytest.mark.real
@pytest.mark.tls
@pytest.mark.parametrize("generate", _tls_generators())
def test_tls(generate: Callable[[Path], TLSFiles], tmp_path: Path) -> None:
    files = generate(tmp_path)
    with RedisServer(tls=files) as server:
        assert server.url == f"rediss://127.0.0.1:{server.port}/0"
        with redis.Redis.from_url(server.url, ssl_ca_certs=str(files.ca)) as client:
            assert client.ping()
        with pytest.raises((redis.ConnectionError, redis.TimeoutError)):
            _no_retry_client(server.host, server.port).ping()


@pytest.mark.real
@pytest.mark.tls
def test_tls_client_certificate_required(tmp_path: Path) -> None:
    files = tls_files.make_tls_files(tmp_path)
    with RedisServer(tls=files, tls_auth_clients="yes") as server:
        assert server.client().ping()
        with pytest.raises(redis.ConnectionError):
            _no_retry_client(server.host, server.port, **files.redis_kwargs(client_cert=False)).ping()


@pytest.mark.real
@pytest.mark.slow
def test_cluster_of_three_masters() -> None:
    with RedisClusterServers() as cluster:
        ports = sorted(node.port for node in cluster.nodes)
        assert len(ports) == 3
        assert cluster.url == "redis+cluster://" + ",".join(f"127.0.0.1:{node.port}" for node in cluster.nodes)
        assert sorted(m.port for m in cluster.masters()) == ports
        client = cluster.client()
        try:
            keys = [f"key:{i}" for i in range(60)]
            assert len({client.keyslot(key) for key in keys}) > 3
            for key in keys:
                client.set(key, key)
            assert all(client.get(key) == key.encode() for key in keys)
        finally:
            client.close()
        for master in cluster.masters():
            with master.client() as node_client:
                assert node_client.dbsize() > 0
    assert all(node.pid is None for node in cluster.nodes)


@pytest.mark.real
@pytest.mark.slow
def test_cluster_failover_after_master_is_killed() -> None:
    with RedisClusterServers(replicas=1, password="pw") as cluster:
        assert len(cluster.nodes) == 6
        assert cluster.url.startswith("redis+cluster://:pw@127.0.0.1:")
        assert len(cluster.masters()) == 3 and len(cluster.replicas()) == 3
        victim = cluster.masters()[0]
        victim.kill()
        cluster.wait_healthy(timeout=20)
        masters = cluster.masters()
        assert len(masters) == 3 and victim not in masters
        client = cluster.client()
        try:
            for i in range(60):
                client.set(f"after:{i}", i)
            assert client.get("after:59") == b"59"
        finally:
            client.close()
        victim.restart()
        cluster.wait_healthy(timeout=20)
        assert victim in cluster.replicas()


@pytest.mark.real
@pytest.mark.slow
@pytest.mark.parametrize("password", [None, 'p w"1'])
def test_sentinel_failover(password: str | None) -> None:
    with RedisSentinelServers(password=password) as group:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in group.sentinels)
        auth = f":{quote(password, safe='')}@" if password else ""
        assert group.url == f"redis+sentinel://{auth}{hosts}/mymaster/0"
        assert group.current_master_address() == group.master.address
        client = group.client()
        client.set("before", "1")
        new_master = group.failover()
        assert new_master == group.replica.address != group.master.address
        assert group.current_master_address() == new_master
        assert group.current_master() is group.replica
        with group.replica.client() as replica_client:
            assert replica_client.execute_command("ROLE")[0] == b"master"
        assert group.sentinel().discover_master("mymaster") == new_master
        with group.master.client() as old_master_client:
            assert old_master_client.execute_command("ROLE")[0] == b"slave"
        group.client().set("after", "2")
        with group.replica.client() as new_master_client:
            assert new_master_client.get("after") == b"2"
    assert all(server.pid is None for server in [*group.sentinels, *group.nodes])


@pytest.mark.real
@pytest.mark.slow
def test_sentinel_promotes_replica_when_master_is_killed() -> None:
    with RedisSentinelServers() as group:
        old = group.current_master_address()
        group.master.kill()
        assert group.wait_for_new_master(old, timeout=20) == group.replica.address
        assert group.client().set("k", "v")
