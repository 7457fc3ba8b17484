"""kvstatus.demo.server, the demo's one embedded redis-server: a process on a free loopback port."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from kvstatus.demo import server as embedded
from kvstatus.demo.server import EmbeddedServer, RedisServerError, RedisServerNotFound, find_redis_server, free_port


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


def test_free_port_is_free() -> None:
    port = free_port()
    assert 1024 <= port <= 65535
    assert _port_refuses(port)  # nobody listens there
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))  # and it can be bound


def test_missing_binary_raises_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert find_redis_server() is None
    with pytest.raises(RedisServerNotFound, match="redis-server was not found on PATH. Install Redis.*Redis URL"):
        EmbeddedServer().start()
    assert issubclass(RedisServerNotFound, RuntimeError)


# ------------------------------------------------------------------------ with redis-server


@pytest.mark.real
def test_start_and_stop() -> None:
    with EmbeddedServer() as server:
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
def test_start_retries_on_a_taken_port(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        taken = blocker.getsockname()[1]
        picks = iter([taken])
        real_free_port = embedded.free_port
        monkeypatch.setattr(embedded, "free_port", lambda: next(picks, None) or real_free_port())
        with EmbeddedServer() as server:
            assert server.port != taken
            assert server.client().ping()
            assert "Address already in use" in server.log_path.read_text()
        with pytest.raises(RedisServerError, match="Address already in use"):
            EmbeddedServer(port=taken).start()


@pytest.mark.real
def test_servers_are_stopped_at_interpreter_exit() -> None:
    code = "from kvstatus.demo.server import EmbeddedServer; print(EmbeddedServer().start().pid)"
    package_root = str(Path(embedded.__file__).resolve().parents[2])  # holds kvstatus/
    env = {**os.environ, "PYTHONPATH": package_root}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=30, check=True
    )
    assert not _pid_alive(int(result.stdout.strip()))
