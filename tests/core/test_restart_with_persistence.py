"""A Redis restarted *with* its data: while it loads the dataset it answers LOADING to reads and writes.

A store call resends within its deadline and then raises ``BackendUnavailableError``, naming the load
(``Redis is loading the dataset in memory``) whether its last attempt got that reply or ran out of time after
it (sync and async); ``kvstatus get`` exits 1 with the one-line "Redis unavailable" error, no traceback. Once
the load ends, the room reads what it held before the restart: nothing was written or lost by the calls made
during the load.

The load is slowed on purpose (``key-load-delay``, microseconds per key) and Redis is told to answer clients
while it loads (``loading-process-events-interval-bytes``; without it a small dataset loads without answering,
which is a hung server, tested in test_hung_server_reads.py).
"""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Callable, Optional

import pytest

from kvstatus import AsyncStatusStore, BackendUnavailableError, KVPoll, StatusStore
from kvstatus.connection import connect
from tests.helpers.backends import fresh_namespace
from tests.helpers.cli import assert_clean_failure, invoke
from tests.helpers.tiers import require_redis_server
from tests.servers import RedisServer

pytestmark = [pytest.mark.real, pytest.mark.slow]

FILLER_KEYS = 600
"""Keys loaded before the room's; each takes :data:`KEY_LOAD_DELAY_US` to load."""
FILLER_BYTES = 2048
KEY_LOAD_DELAY_US = 20_000
"""Microseconds Redis sleeps after loading each key: the load takes about 12 s, many times a call's 1 s deadline,
and Redis answers every 20 ms meanwhile (a connection's handshake completes, and its command gets LOADING)."""
TRIES = 3
"""Calls of each kind made during the load: a box loaded by other work may spend a call's deadline before
Redis' first reply, and then the call says only that its deadline passed."""
LOADING = "loading the dataset"
LOAD_WAIT = 120.0
"""Seconds the test waits for the load to end (a bound for a stuck server, not a measure)."""


def _loading(server: RedisServer) -> Optional[bool]:
    """True while the server answers LOADING, False once it answers PING, None while nothing listens.

    A bare socket: redis-py's own client would resend through the LOADING replies."""
    try:
        with socket.create_connection((server.host, server.port), timeout=5) as sock:
            sock.sendall(b"PING\r\n")
            reply = sock.recv(64)
    except OSError:
        return None
    return reply.startswith(b"-LOADING") if reply else None


def _wait(server: RedisServer, until: Callable[[Optional[bool]], bool], what: str) -> None:
    deadline = time.monotonic() + LOAD_WAIT
    while not until(_loading(server)):
        assert time.monotonic() < deadline, f"redis-server not {what} after {LOAD_WAIT:.0f} s"
        time.sleep(0.05)


def _said(call: Callable[[], object]) -> str:
    """What ``call``'s BackendUnavailableError says (it must raise one)."""
    with pytest.raises(BackendUnavailableError) as raised:
        call()
    return str(raised.value)


def test_calls_during_the_load_fail_clearly_within_the_deadline_and_nothing_is_lost() -> None:
    require_redis_server()
    namespace = fresh_namespace("persist")
    args = (
        *("--key-load-delay", str(KEY_LOAD_DELAY_US)),
        *("--loading-process-events-interval-bytes", "1024"),
        *("--rdbcompression", "no"),  # the filler's bytes, read from the file, are what make Redis answer
    )
    with RedisServer(extra_args=args) as server:
        url = f"{server.url}?deadline=1"
        store = StatusStore.from_url(url, namespace=namespace, participant="prefill-0")
        admin = server.client()
        try:
            admin.mset({f"filler:{i}": "x" * FILLER_BYTES for i in range(FILLER_KEYS)})
            store.update_status(7, KVPoll.Transferring)
            admin.save()
        finally:
            admin.close()
        server.restart(wait=False)
        _wait(server, lambda loading: loading is not None, "listening")
        assert _loading(server), "the restarted server should still be loading its dataset"

        said = [_said(lambda: store.update_status(7, KVPoll.Success)) for _ in range(TRIES)]

        async def read_async() -> list[str]:
            async_store = AsyncStatusStore.from_url(url, namespace=namespace, participant="decode-0")
            said: list[str] = []
            try:
                for _ in range(TRIES):
                    with pytest.raises(BackendUnavailableError) as raised:
                        await async_store.get(7)
                    said.append(str(raised.value))
            finally:
                await async_store.close()
            return said

        said_async = asyncio.run(read_async())
        run = invoke(connect, "--namespace", namespace, "get", "7", env={"KVSTATUS_URL": url})
        assert _loading(server), "the load ended before every call met it: make the load longer"
        assert any(LOADING in text for text in said), said
        assert any(LOADING in text for text in said_async), said_async
        assert_clean_failure(run.output, run.exit_code, 1, "Redis unavailable")

        _wait(server, lambda loading: loading is False, "loaded")
        assert store.get(7) is KVPoll.Transferring
        shown = invoke(connect, "--namespace", namespace, "get", "7", env={"KVSTATUS_URL": url})
        assert shown.exit_code == 0 and "Transferring" in shown.output, shown.output
        store.close()
