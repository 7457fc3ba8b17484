"""A cancel of an asyncio caller always lands (issue 36): thousands of cancels at random points of
``wait_for``, ``get``, ``update_status`` and ``get_many`` (cached and not), while the rooms keep changing.
Every task ends, and the connections go back: the server's count returns to what the stores hold idle."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from typing import Any

import pytest

from kvstatus import AsyncStatusStore, KVPoll
from tests.helpers.backends import client_count, fresh_namespace
from tests.servers import RedisServer

pytestmark = pytest.mark.real

ROOMS = 200
ROUNDS = 15
MAX_CONNECTIONS = 16


@pytest.fixture(scope="module")
def own_server() -> Iterator[RedisServer]:
    """A server of this module's own: CLIENT LIST counts only its clients."""
    with RedisServer() as server:
        yield server


async def _until(condition: Any, seconds: float = 60.0) -> bool:
    """Poll ``condition()`` until true, for up to ``seconds`` (generous: a loaded box)."""
    for _ in range(int(seconds / 0.05)):
        if condition():
            return True
        await asyncio.sleep(0.05)
    return bool(condition())


async def _touch(store: AsyncStatusStore, stop: asyncio.Event) -> None:
    """Keep every room key changing (a TTL refresh is a write: it wakes the rooms' watches)."""
    keys = [store._core.schema.room_key(room) for room in range(ROOMS)]
    raw = store.client
    while not stop.is_set():
        async with raw.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.pexpire(key, 600_000)
            await pipe.execute()
        await asyncio.sleep(0.002)


@pytest.mark.parametrize("near_cache", [False, True], ids=["uncached", "cached"])
async def test_thousands_of_cancels_all_land_and_return_their_connections(
    own_server: RedisServer, near_cache: bool
) -> None:
    namespace = fresh_namespace("cancel")
    rng = random.Random(36)
    baseline = client_count(own_server)
    async with (
        AsyncStatusStore.from_url(
            own_server.url, namespace=namespace, participant="w", max_connections=MAX_CONNECTIONS
        ) as writer,
        AsyncStatusStore.from_url(
            own_server.url,
            namespace=namespace,
            participant="w",
            near_cache=near_cache,
            max_connections=MAX_CONNECTIONS,
        ) as store,
    ):
        await writer.update_many({room: KVPoll.Bootstrapping for room in range(ROOMS)})
        stop = asyncio.Event()
        toucher = asyncio.create_task(_touch(writer, stop))
        ops = [
            lambda room: store.wait_for(room, KVPoll.Success, timeout=None),  # never reached: only a cancel ends it
            lambda room: store.wait_for(room, KVPoll.Success, timeout=None),
            lambda room: store.get(room),
            lambda room: store.get_many(range(room, min(room + 8, ROOMS))),
            lambda room: store.update_status(room, KVPoll.Bootstrapping),
        ]
        stuck: list[asyncio.Task[Any]] = []
        try:
            for _ in range(ROUNDS):
                tasks = [asyncio.create_task(ops[rng.randrange(len(ops))](room)) for room in range(ROOMS)]
                for task in tasks:  # cancels at random points: before the first step, mid-arm, mid-read, mid-wait
                    asyncio.get_running_loop().call_later(rng.uniform(0, 0.05), task.cancel)
                done, pending = await asyncio.wait(tasks, timeout=30)
                stuck += pending
                for task in done:
                    assert task.cancelled() or task.exception() is None, task.exception()
        finally:
            stop.set()
            await toucher
            for task in stuck:
                task.cancel()
        assert not stuck, f"{len(stuck)} of {ROOMS * ROUNDS} cancelled tasks still ran 30 s later"
        # Each store holds at most its pool, plus its waits' and its near cache's connections.
        held = 2 * MAX_CONNECTIONS + 6
        assert await _until(lambda: client_count(own_server) - baseline <= held), (
            f"{client_count(own_server) - baseline} connections held after the cancels (bound {held})"
        )
    assert await _until(lambda: client_count(own_server) <= baseline), "connections left open after close"
