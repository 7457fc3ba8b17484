"""Tests for kvstatus.demo.server: real redis-server processes on free loopback ports."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from kvstatus.demo import server as embedded
from tests.servers import tls as tls_files
from tests.servers import (
    RedisClusterServers,
    RedisSentinelServers,
    RedisServer,
    RedisServerError,
    RedisServerNotFound,
    TLSFiles,
    find_redis_server,
    free_port,
)


def _no_retry_client(host: str, port: int, **kwargs: object) -> redis.Redis:
    return redis.Redis(host=host, port=port, socket_connect_timeout=1, socket_timeout=2,
                       retry=Retry(NoBackoff(), 0), **kwargs)  # type: ignore[arg-type]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _port_refuses(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except ConnectionRefusedError:
        return True
    return False


# ---------------------------------------------------------------- without redis-server


def test_free_port_is_bindable() -> None:
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_missing_binary_raises_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert find_redis_server() is None
    with pytest.raises(RedisServerNotFound, match="redis-server was not found on PATH"):
        RedisServer().start()
    with pytest.raises(RedisServerNotFound, match="redis-cli"):
        RedisClusterServers().start()
    assert issubclass(RedisServerNotFound, RuntimeError)


# ------------------------------------------------------------------------ standalone


@pytest.mark.real
def test_start_and_stop() -> None:
    with RedisServer() as server:
        pid, port = server.pid, server.port
        assert pid is not None and _pid_alive(pid)
        assert server.url == f"redis://127.0.0.1:{port}/0"
        assert server.log_path.is_file()
        with redis.Redis.from_url(server.url) as client:
            assert client.ping()
            assert client.config_get("save") == {"save": ""}
            assert client.config_get("appendonly") == {"appendonly": "no"}
            assert client.config_get("bind")["bind"] == "127.0.0.1"
        workdir = server.dir
    assert server.pid is None
    assert not _pid_alive(pid)
    assert _port_refuses(port)
    assert not workdir.exists()
    server.stop()


@pytest.mark.real
def test_restart_keeps_port_and_drops_data() -> None:
    with RedisServer() as server:
        port, old_pid = server.port, server.pid
        with server.client() as client:
            client.set("k", "v")
        server.restart()
        assert server.port == port
        assert server.pid not in (None, old_pid)
        with server.client() as client:
            assert client.get("k") is None


@pytest.mark.real
def test_kill_then_restart() -> None:
    with RedisServer() as server:
        pid = server.pid
        assert pid is not None
        server.kill()
        assert server.pid is None and not _pid_alive(pid)
        with pytest.raises(redis.ConnectionError):
            _no_retry_client(server.host, server.port).ping()
        server.kill()
        server.restart()
        assert server.client().ping()


@pytest.mark.real
def test_password() -> None:
    with RedisServer(password="p@ss word") as server:
        assert server.url == f"redis://:p%40ss%20word@127.0.0.1:{server.port}/0"
        with pytest.raises(redis.AuthenticationError):
            _no_retry_client(server.host, server.port).ping()
        with redis.Redis.from_url(server.url) as client:
            assert client.ping()
        assert server.client().ping()


@pytest.mark.real
def test_acl_file(tmp_path: Path) -> None:
    acl = tmp_path / "users.acl"
    acl.write_text("user default off\nuser alice on >secret ~* &* +@all\n")
    with RedisServer(acl_file=acl, username="alice", password="secret") as server:
        assert server.url == f"redis://alice:secret@127.0.0.1:{server.port}/0"
        assert server.client(decode_responses=True).acl_whoami() == "alice"
        with pytest.raises(redis.AuthenticationError):
            _no_retry_client(server.host, server.port).ping()


@pytest.mark.real
def test_start_retries_on_a_taken_port(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        taken = blocker.getsockname()[1]
        picks = iter([taken])
        real_free_port = embedded.free_port
        monkeypatch.setattr(embedded, "free_port", lambda: next(picks, None) or real_free_port())
        with RedisServer() as server:
            assert server.port != taken
            assert server.client().ping()
            assert "Address already in use" in server.log_path.read_text()
        with pytest.raises(RedisServerError, match="Address already in use"):
            RedisServer(port=taken).start()


@pytest.mark.real
def test_startup_failure_reports_log_tail() -> None:
    server = RedisServer(extra_args=["--no-such-directive", "x"])
    with pytest.raises(RedisServerError, match="Bad directive"):
        server.start()
    assert server.pid is None


@pytest.mark.real
def test_servers_are_stopped_at_interpreter_exit() -> None:
    code = "from kvstatus.demo.server import RedisServer; print(RedisServer().start().pid)"
    package_root = str(Path(embedded.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": package_root}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=env, timeout=30, check=True)
    assert not _pid_alive(int(result.stdout.strip()))


# ------------------------------------------------------------------------------- TLS


def _tls_generators() -> list[object]:
    return [
        pytest.param(tls_files._make_tls_files_trustme, id="trustme"),
        pytest.param(tls_files._make_tls_files_openssl, id="openssl"),
    ]


@pytest.mark.real
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
def test_tls_client_certificate_required(tmp_path: Path) -> None:
    files = tls_files.make_tls_files(tmp_path)
    with RedisServer(tls=files, tls_auth_clients="yes") as server:
        assert server.client().ping()
        with pytest.raises(redis.ConnectionError):
            _no_retry_client(server.host, server.port, **files.redis_kwargs(client_cert=False)).ping()


# --------------------------------------------------------------------------- cluster


@pytest.mark.real
@pytest.mark.slow
def test_cluster_of_three_masters() -> None:
    with RedisClusterServers() as cluster:
        ports = sorted(node.port for node in cluster.nodes)
        assert len(ports) == 3
        assert cluster.url == "redis+cluster://" + ",".join(
            f"127.0.0.1:{node.port}" for node in cluster.nodes)
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


# -------------------------------------------------------------------------- sentinel


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
