"""Issue 35 item 2: a URL that points at the wrong place gets one line naming the problem and the fix, in the
library and in the CLI alike (kvstatus/translate.py), as an operator scripts it: exit
code 1, one line on stderr, no traceback.

- a server that is not Redis (an HTTP server): named by address, "check the URL's host and port";
- a host name that does not resolve: fails at the first attempt (no retries), names the host, "nothing was sent"
  (never "may or may not have been applied", which a read must not say anyway);
- a database the server does not have: names it, and how many the server has, or that its limit is unknown
  when the user may not CONFIG GET.
"""

from __future__ import annotations

import socket
import threading
from typing import Any, Iterator

import pytest
from redis import exceptions as rx

from kvstatus import StatusStore, connection
from kvstatus.errors import BackendError, BackendRefusedError, BackendUnavailableError
from kvstatus.requests import Call, script_call
from kvstatus.scripts import GET_MANY, UPDATE
from kvstatus.translate import translate_error
from tests.helpers.cli import assert_clean_failure, invoke, run_cli
from tests.servers import RedisServer, free_port

NOWHERE = "no-such-host.invalid"  # RFC 6761: never resolves


def _one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    return lines[0]


@pytest.fixture
def http_server() -> Iterator[int]:
    """A TCP server that answers every connection like an HTTP server does: with HTML."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", free_port()))
    listener.listen(16)
    port = listener.getsockname()[1]
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            with conn:
                try:
                    conn.recv(4096)
                    conn.sendall(b"<!DOCTYPE html><html><body>400 Bad Request</body></html>\r\n")
                except OSError:
                    pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield port
    stop.set()
    thread.join(5)
    listener.close()


@pytest.mark.real
def test_a_server_that_is_not_redis_is_named_with_the_fix(http_server: int) -> None:
    url = f"redis://127.0.0.1:{http_server}/0"
    for args in (("get", "1"), ("ls",), ("set", "1", "bootstrapping")):
        done = run_cli("--url", url, "--namespace", "ns", *args)
        assert_clean_failure(done.stderr, done.returncode, 1)
        line = _one_line(done.stderr)
        assert f"the server at 127.0.0.1:{http_server} did not answer as Redis" in line, line
        assert "check the URL's host and port" in line
    with StatusStore.from_url(url, namespace="ns") as store, pytest.raises(BackendError) as raised:
        store.get(1)
    assert f"127.0.0.1:{http_server} did not answer as Redis" in str(raised.value)


def test_a_host_name_that_does_not_resolve_fails_at_once_and_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    looked_up: list[Any] = []
    real = socket.getaddrinfo

    def counting(host: Any, *args: Any, **kwargs: Any) -> Any:
        looked_up.append(host)
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", counting)
    url = f"redis://{NOWHERE}:6390/0?retries=5"
    done = invoke(connection.connect, "--url", url, "--namespace", "ns", "get", "1")
    assert_clean_failure(done.stderr, done.exit_code, 1)
    line = _one_line(done.stderr)
    assert f"the host name {NOWHERE} (port 6390) does not resolve" in line, line
    assert "nothing was sent" in line and "may or may not" not in line and "check the host in the URL" in line
    assert looked_up == [NOWHERE]  # one attempt: the retries are not spent on a name that does not exist
    with StatusStore.from_url(url, namespace="ns") as store, pytest.raises(BackendRefusedError) as raised:
        store.update_status(1, 1)
    assert raised.value.not_sent and NOWHERE in str(raised.value)


def test_a_subprocess_names_the_host_that_does_not_resolve() -> None:
    done = run_cli("--url", f"redis://{NOWHERE}/0", "--namespace", "ns", "stats")
    assert_clean_failure(done.stderr, done.returncode, 1)
    assert f"the host name {NOWHERE} (port 6379) does not resolve" in _one_line(done.stderr)


@pytest.fixture(scope="module")
def acl_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        server.client().execute_command("ACL", "SETUSER", "noconfig", "on", ">pw", "~*", "+@all", "-config")
        yield server


@pytest.mark.real
def test_a_database_the_server_does_not_have_names_it_and_the_count(acl_server: RedisServer) -> None:
    url = f"redis://{acl_server.host}:{acl_server.port}/99"
    done = run_cli("--url", url, "--namespace", "ns", "get", "1")
    assert_clean_failure(done.stderr, done.returncode, 1)
    line = _one_line(done.stderr)
    assert f"the server at {acl_server.host}:{acl_server.port} has no database 99: it has 16" in line, line
    assert "use /0 to /15" in line
    with StatusStore.from_url(url, namespace="ns") as store, pytest.raises(BackendError) as raised:
        store.update_status(1, 1)
    assert "has no database 99: it has 16" in str(raised.value)


@pytest.mark.real
def test_a_user_that_may_not_config_get_is_told_the_limit_is_unknown(acl_server: RedisServer) -> None:
    url = f"redis://noconfig:pw@{acl_server.host}:{acl_server.port}/99"
    done = run_cli("--url", url, "--namespace", "ns", "ls")
    assert_clean_failure(done.stderr, done.returncode, 1, secrets=("pw@",))
    line = _one_line(done.stderr)
    assert "has no database 99" in line and "limit is unknown (CONFIG GET databases was refused" in line, line
    ok = run_cli("--url", url.replace("/99", "/3"), "--namespace", "ns", "ls")
    assert ok.returncode == 0, ok.stderr  # the connection works on a database the server has


def test_an_interrupted_read_never_says_it_may_have_been_applied() -> None:
    reads = [Call(("HGET", "k", "f")), script_call(GET_MANY, ["k"], ["p"]), None]
    for call in reads:
        error = translate_error(rx.TimeoutError("Timeout reading from 127.0.0.1:6379"), call)
        assert isinstance(error, BackendUnavailableError)
        assert "may or may not" not in str(error) and "a read: nothing was changed" in str(error), call
    write = translate_error(rx.TimeoutError("Timeout reading"), script_call(UPDATE, ["k"], ["1"]))
    assert "the call may or may not have been applied" in str(write)
