"""Issue 19 item 17: a refused connection to a standalone Redis is definite. The call fails at once (one connect
attempt, no retry storm) and says nothing was sent; cluster clients still retry a refused node within their budget.

Attempts are counted by wrapping redis-py's own ``_connect`` (the real connect still runs), not timed."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from typing import Any, Iterator

import pytest
import redis.asyncio.connection
import redis.connection
from click.testing import CliRunner

from kvstatus import AsyncStatusStore, BackendRefusedError, BackendUnavailableError, KVPoll, StatusStore
from kvstatus.cli import CliEnv, main
from kvstatus.connection import connect
from tests.servers import RedisServer, free_port

SECRET = "s3cr3t-refused"


@pytest.fixture
def connects(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every socket connect redis-py attempts (sync and async), in order."""
    seen: list[str] = []
    sync_connect = redis.connection.Connection._connect
    async_connect = redis.asyncio.connection.Connection._connect

    def counted(self: Any) -> Any:
        seen.append(f"{self.host}:{self.port}")
        return sync_connect(self)

    async def counted_async(self: Any) -> Any:
        seen.append(f"{self.host}:{self.port}")
        return await async_connect(self)

    monkeypatch.setattr(redis.connection.Connection, "_connect", counted)
    monkeypatch.setattr(redis.asyncio.connection.Connection, "_connect", counted_async)
    yield seen


def _closed_url(password: bool = True) -> str:
    auth = f":{SECRET}@" if password else ""
    return f"redis://{auth}127.0.0.1:{free_port()}/0"  # nothing listens there


OPERATIONS = {
    "update_status": lambda s: s.update_status(1, KVPoll.Bootstrapping),
    "get": lambda s: s.get(1),
    "get_many": lambda s: s.get_many([1, 2]),
    "room": lambda s: s.room(1),
    "clear": lambda s: s.clear(1),
}


@pytest.mark.parametrize("operation", list(OPERATIONS))
def test_a_refused_connection_fails_at_once_saying_nothing_was_sent(connects: list[str], operation: str) -> None:
    store = StatusStore.from_url(_closed_url(), namespace="x")  # default options: 5 retries
    with pytest.raises(BackendRefusedError) as info:
        OPERATIONS[operation](store)
    assert len(connects) == 1, connects
    assert info.value.not_sent is True
    assert "refused the connection, so nothing was sent and the call was not applied" in str(info.value)
    assert "may or may not" not in str(info.value) and SECRET not in str(info.value)
    assert isinstance(info.value, BackendUnavailableError)  # callers catching the base class still do


@pytest.mark.parametrize("operation", list(OPERATIONS))
def test_a_refused_connection_fails_at_once_async(connects: list[str], operation: str) -> None:
    async def call() -> None:
        store = AsyncStatusStore.from_url(_closed_url(), namespace="x")
        await OPERATIONS[operation](store)

    with pytest.raises(BackendRefusedError) as info:
        asyncio.run(call())
    assert len(connects) == 1, connects
    assert info.value.not_sent is True and "nothing was sent" in str(info.value)
    assert SECRET not in str(info.value)


def test_localhost_with_two_addresses_is_refused_as_one(connects: list[str]) -> None:
    """asyncio joins the refusals of ::1 and 127.0.0.1 into one OSError without an errno."""
    port = free_port()

    async def call() -> None:
        await AsyncStatusStore.from_url(f"redis://localhost:{port}/0", namespace="x").get(1)

    for attempt in (
        lambda: StatusStore.from_url(f"redis://localhost:{port}/0", namespace="x").get(1),
        lambda: asyncio.run(call()),
    ):
        with pytest.raises(BackendRefusedError, match="nothing was sent"):
            attempt()
    assert len(connects) == 2


def test_a_missing_unix_socket_is_refused_at_once(connects: list[str], tmp_path: Any) -> None:
    with pytest.raises(BackendRefusedError, match="nothing was sent"):
        StatusStore.from_url(f"unix://{tmp_path}/redis.sock", namespace="x").get(1)


@pytest.mark.real
@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_a_call_sent_before_the_server_died_is_not_called_unsent(asynchronous: bool) -> None:
    """The call is sent to a stopped server, which is then killed; the resend's connect is refused: unknown
    whether applied. A later call opens a new connection and is refused before sending: not applied."""
    server = RedisServer(extra_args=["--save", "", "--appendonly", "no"]).start()
    loop = asyncio.new_event_loop()
    try:
        if asynchronous:
            aio = AsyncStatusStore.from_url(server.url, namespace="x")
            call = lambda: loop.run_until_complete(aio.update_status(1, KVPoll.Bootstrapping))  # noqa: E731
        else:
            store = StatusStore.from_url(server.url, namespace="x")
            call = lambda: store.update_status(1, KVPoll.Bootstrapping)  # noqa: E731
        call()  # connected, script loaded
        errors: list[BaseException] = []

        def in_flight() -> None:
            try:
                call()
            except BaseException as exc:  # noqa: BLE001 - handed to the test thread
                errors.append(exc)

        assert server.pid is not None
        os.kill(server.pid, signal.SIGSTOP)
        sender = threading.Thread(target=in_flight)
        sender.start()
        time.sleep(0.5)  # the command sits in the stopped server's socket
        server.kill()
        sender.join(timeout=30)
        assert len(errors) == 1 and isinstance(errors[0], BackendRefusedError), errors
        assert errors[0].not_sent is False
        assert "may or may not have been applied" in str(errors[0])
        with pytest.raises(BackendRefusedError) as again:
            call()
        assert again.value.not_sent is True
    finally:
        loop.close()
        server.stop()


def test_a_cluster_client_still_retries_a_refused_node(connects: list[str]) -> None:
    """A refused cluster node may be a failover in progress: the budget is spent, as before."""

    async def call() -> None:
        await AsyncStatusStore.from_url(f"redis+cluster://127.0.0.1:{free_port()}", namespace="x", retries=2).get(1)

    with pytest.raises(BackendUnavailableError) as info:
        asyncio.run(call())
    assert not isinstance(info.value, BackendRefusedError)
    assert len(connects) > 1, connects


def test_the_cli_says_nothing_was_sent_and_exits_1() -> None:
    url = _closed_url()
    result = CliRunner().invoke(
        main,
        ["--url", url, "--namespace", "x", "get", "5"],
        obj=CliEnv(connect=connect),
        env={"KVSTATUS_URL": None, "KVSTATUS_NAMESPACE": None},
    )
    assert result.exit_code == 1, result.output
    assert "nothing was sent" in result.output and "Traceback" not in result.output
    assert "that Redis is running" in result.output and SECRET not in result.output


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_a_near_cache_read_of_a_refused_server_fails_at_once(connects: list[str], asynchronous: bool) -> None:
    """The near cache's fill had its own resends: 3.1 s of them before."""
    if asynchronous:

        async def call() -> None:
            await AsyncStatusStore.from_url(_closed_url(), namespace="x", near_cache=True).get(1)

        attempt: Any = lambda: asyncio.run(call())  # noqa: E731
    else:
        attempt = lambda: StatusStore.from_url(_closed_url(), namespace="x", near_cache=True).get(1)  # noqa: E731
    with pytest.raises(BackendRefusedError, match="nothing was sent"):
        attempt()
    assert len(connects) == 1, connects
