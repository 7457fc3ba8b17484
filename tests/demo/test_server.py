"""kvstatus.demo.server, the one embedded redis-server: processes on free loopback ports."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from kvstatus.demo import launch
from kvstatus.demo import server as embedded
from kvstatus.demo.server import RedisServer, RedisServerError, RedisServerNotFound, find_redis_server, free_port


def _no_retry_client(host: str, port: int, **kwargs: object) -> redis.Redis:
    return redis.Redis(
        host=host, port=port, socket_connect_timeout=1, socket_timeout=2, retry=Retry(NoBackoff(), 0), **kwargs
    )  # type: ignore[arg-type]


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


def test_free_port_is_free_and_a_listener_makes_it_taken() -> None:
    port = free_port()
    assert 1024 <= port <= 65535
    assert embedded._port_is_free(port)
    assert _port_refuses(port)  # nobody listens there
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
        sock.listen()
        assert not embedded._port_is_free(port)


def test_free_cluster_port_skips_a_port_whose_bus_port_is_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as bus:
        bus.bind(("127.0.0.1", 0))
        bus.listen()
        taken_bus = bus.getsockname()[1]
        if taken_bus < 1024 + embedded.CLUSTER_BUS_OFFSET:
            pytest.skip(f"the OS gave port {taken_bus}, too low to be anyone's cluster bus port")
        good = free_port()
        while good + embedded.CLUSTER_BUS_OFFSET > 65535 or not embedded._port_is_free(
            good + embedded.CLUSTER_BUS_OFFSET
        ):
            good = free_port()
        picks = iter([taken_bus - embedded.CLUSTER_BUS_OFFSET, good])
        monkeypatch.setattr(launch, "free_port", lambda: next(picks))
        assert embedded.free_cluster_port() == good
        monkeypatch.setattr(launch, "free_port", lambda: taken_bus - embedded.CLUSTER_BUS_OFFSET)
        with pytest.raises(RedisServerError, match="free port pair"):
            embedded.free_cluster_port()


def test_missing_binary_raises_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert find_redis_server() is None
    with pytest.raises(RedisServerNotFound, match="redis-server was not found on PATH"):
        RedisServer().start()
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
    package_root = str(Path(embedded.__file__).resolve().parents[2])  # holds kvstatus/
    env = {**os.environ, "PYTHONPATH": package_root}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=30, check=True
    )
    assert not _pid_alive(int(result.stdout.strip()))
