"""Issue 19 item 6: SWAPDB sends no invalidation (Redis 7.0.15), and near-cache readers kept serving the
swapped-out database. A single server's cache now watches a marker of its database (``<base>db``) at each
topology check (every ``max_staleness``): another database under it empties the cache."""

from __future__ import annotations

import asyncio

import pytest

from kvstatus import AsyncStatusStore, KVPoll, NearCacheOptions, StatusStore
from tests.helpers.backends import fresh_namespace
from tests.servers import RedisServer

pytestmark = pytest.mark.real

STALENESS = 0.1


def _db_url(server: RedisServer, db: int) -> str:
    return server.url.rsplit("/", 1)[0] + f"/{db}"


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_a_swapped_database_empties_the_cache(redis_server: RedisServer, asynchronous: bool) -> None:
    namespace = fresh_namespace("swap")
    db0 = StatusStore.from_url(_db_url(redis_server, 0), namespace=namespace, participant="p")
    db1 = StatusStore.from_url(_db_url(redis_server, 1), namespace=namespace, participant="p")
    db0.update_status(1, KVPoll.Bootstrapping)
    db1.update_status(1, KVPoll.Success)
    options = NearCacheOptions(max_staleness=STALENESS)

    async def run() -> None:
        store = (AsyncStatusStore if asynchronous else StatusStore).from_url(
            _db_url(redis_server, 0), namespace=namespace, participant="p", near_cache=options
        )

        async def get() -> object:
            value = store.get(1)
            return await value if asynchronous else value  # type: ignore[misc]

        try:
            assert await get() is KVPoll.Bootstrapping  # cached from database 0
            redis_server.client().execute_command("SWAPDB", 0, 1)
            seen = None
            for _ in range(100):
                seen = await get()
                if seen is KVPoll.Success:
                    break
                await asyncio.sleep(STALENESS / 2)
            assert seen is KVPoll.Success  # what database 0 holds now, within a few checks
            assert any("SWAPDB" in reason for reason in store.near_cache.state.flush_reasons)
        finally:
            closed = store.close()
            if asynchronous:
                await closed  # type: ignore[misc]

    asyncio.run(run())
    db0.close()
    db1.close()


def test_the_marker_has_a_ttl_and_no_room_scan_sees_it(redis_server: RedisServer) -> None:
    namespace = fresh_namespace("marker")
    with StatusStore.from_url(redis_server.url, namespace=namespace, participant="p", near_cache=True) as store:
        assert store.get(1) is None  # opens the link, which marks the database
        raw = redis_server.client()
        marker = store.schema.database_marker_key
        assert raw.hget(marker, "id") is not None and raw.pttl(marker) > 0
        assert list(raw.scan_iter(match=store.schema.scan_pattern)) == []
        assert store.schema.room_of(marker) is None
