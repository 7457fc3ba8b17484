"""wait_for takes no connection per waiter (issue 36, Medium 3): 500 waiters gave 524-601 server connections,
outside ``max_connections``; at ``maxclients`` they raised. Now the waits of a client share one watch connection
per node: the server's count stays within the store's pool plus a small constant, and every waiter is woken."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any, Optional

import pytest

from kvstatus import AsyncStatusStore, KVPoll, StatusStore
from tests.helpers.backends import client_count, fresh_namespace
from tests.servers import RedisServer

pytestmark = pytest.mark.real

MAX_CONNECTIONS = 8
SMALL = 3  # the watch hub, and a connection or two in passing


@pytest.fixture(scope="module")
def own_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


def _poll_until(condition: Any, seconds: float = 60.0) -> bool:
    event = threading.Event()
    for _ in range(int(seconds / 0.05)):
        if condition():
            return True
        event.wait(0.05)
    return bool(condition())


async def test_300_async_waiters_share_the_stores_connections(own_server: RedisServer) -> None:
    waiters = 300
    baseline = client_count(own_server)
    namespace = fresh_namespace("wc")
    async with AsyncStatusStore.from_url(
        own_server.url, namespace=namespace, participant="w", max_connections=MAX_CONNECTIONS
    ) as store:
        await store.update_many({room: KVPoll.Bootstrapping for room in range(waiters)})
        tasks = [asyncio.create_task(store.wait_for(room, KVPoll.Success, timeout=120)) for room in range(waiters)]
        most = 0
        for _ in range(40):  # while every waiter is armed and waiting
            await asyncio.sleep(0.05)
            most = max(most, client_count(own_server) - baseline)
        assert not any(task.done() for task in tasks)
        assert most <= MAX_CONNECTIONS + SMALL, f"{most} connections for {waiters} waiters"
        writer = store.for_participant("w")
        await writer.update_many({room: KVPoll.Success for room in range(waiters)})
        results = await asyncio.wait_for(asyncio.gather(*tasks), 120)
        assert results == [KVPoll.Success] * waiters
    assert _poll_until(lambda: client_count(own_server) <= baseline)


def test_100_threads_waiting_share_the_stores_connections(own_server: RedisServer) -> None:
    waiters = 100
    baseline = client_count(own_server)
    namespace = fresh_namespace("wc")
    results: list[Optional[KVPoll]] = []
    with StatusStore.from_url(
        own_server.url, namespace=namespace, participant="w", max_connections=MAX_CONNECTIONS
    ) as store:
        store.update_many({room: KVPoll.Bootstrapping for room in range(waiters)})

        def wait(room: int) -> None:
            results.append(store.wait_for(room, KVPoll.Success, timeout=120))

        threads = [threading.Thread(target=wait, args=(room,), daemon=True) for room in range(waiters)]
        for thread in threads:
            thread.start()
        most = 0
        for _ in range(40):
            threading.Event().wait(0.05)
            most = max(most, client_count(own_server) - baseline)
        assert most <= MAX_CONNECTIONS + SMALL, f"{most} connections for {waiters} waiting threads"
        store.update_many({room: KVPoll.Success for room in range(waiters)})
        for thread in threads:
            thread.join(120)
        assert results == [KVPoll.Success] * waiters
    assert _poll_until(lambda: client_count(own_server) <= baseline)
