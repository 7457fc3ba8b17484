"""A read the near cache sends raises the store's kvstatus errors, never a redis-py exception."""

from __future__ import annotations

import asyncio
import logging

import pytest

from kvstatus import AsyncStatusStore, KVPoll, StatusStore
from kvstatus.admin.acl import acl_rules
from kvstatus.errors import CorruptedValueError
from tests.servers import RedisServer

pytestmark = pytest.mark.real


def test_a_key_of_another_type_is_a_corrupted_value_as_without_the_cache(
    redis_server: RedisServer, url: str, namespace: str
) -> None:
    with StatusStore.from_url(url, namespace=namespace, near_cache=True) as store:
        redis_server.client().set(store.schema.room_key(77), "not a hash")
        for read in (lambda: store.get(77), lambda: store.room(77), lambda: store.get_many([77, 78])):
            with pytest.raises(CorruptedValueError, match="not a kvstatus room hash"):
                read()

    async def run() -> None:
        async with AsyncStatusStore.from_url(url, namespace=namespace, near_cache=True) as store:
            with pytest.raises(CorruptedValueError, match="not a kvstatus room hash"):
                await store.get(77)
            with pytest.raises(CorruptedValueError, match="not a kvstatus room hash"):
                await store.room(77)

    asyncio.run(run())


def test_a_user_without_tracking_runs_uncached_and_is_told_once(
    redis_server: RedisServer, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    admin = redis_server.client()
    rules = [r for r in acl_rules(namespace, password="pw-nce", scripts="eval") if r != "+client|tracking"]
    admin.execute_command("ACL", "SETUSER", "nc-notrack", *rules)
    writer = StatusStore(redis_server.client(), namespace=namespace, participant="p")
    try:
        url = f"redis://nc-notrack:pw-nce@{redis_server.host}:{redis_server.port}/0"
        with caplog.at_level(logging.WARNING, logger="kvstatus"):
            with StatusStore.from_url(url, namespace=namespace, participant="p", near_cache=True) as store:
                assert store.get(5) is None
                writer.update_status(5, KVPoll.Bootstrapping)
                assert store.get(5) is KVPoll.Bootstrapping  # read from Redis: nothing was cached
                assert store.get_many([5, 6]) == {5: KVPoll.Bootstrapping, 6: None}
                assert store.near_cache.refused and not store.near_cache.state.entries

            async def run() -> None:
                async with AsyncStatusStore.from_url(
                    url, namespace=namespace, participant="p", near_cache=True
                ) as store:
                    assert await store.get(5) is KVPoll.Bootstrapping
                    writer.update_status(5, KVPoll.Transferring)
                    assert await store.get(5) is KVPoll.Transferring

            asyncio.run(run())
        told = [r.getMessage() for r in caplog.records if "client|tracking" in r.getMessage()]
        assert len(told) == 2, told  # once per cache: the sync store's and the async store's
    finally:
        admin.execute_command("ACL", "DELUSER", "nc-notrack")


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_the_cache_needs_no_channel_and_a_published_invalidation_reaches_nobody(
    redis_server: RedisServer, namespace: str, asynchronous: bool
) -> None:
    """Issue 19 item 1: a tenant's PUBLISH __redis__:invalidate blinded every near cache on the server (the
    reader took the payload as a key list, raised, and lost the real invalidations of the same batch). The
    invalidations now arrive as RESP3 push messages on a connection subscribed to nothing: a user without any
    channel keeps a coherent cache, and what anyone publishes on that channel reaches no cache."""
    admin = redis_server.client()
    rules = acl_rules(namespace, password="pw-nce", scripts="eval")
    # No channel but the presence channels (a lease holder's subscription): none the near cache could read.
    assert "resetchannels" in rules and [r for r in rules if r.startswith("&")] == [f"&kvstatus:{namespace}:presence:*"]
    admin.execute_command("ACL", "SETUSER", "nc-nochan", *rules)
    writer = StatusStore(redis_server.client(), namespace=namespace, participant="p")
    url = f"redis://nc-nochan:pw-nce@{redis_server.host}:{redis_server.port}/0"

    async def run() -> None:
        store = (AsyncStatusStore if asynchronous else StatusStore).from_url(
            url, namespace=namespace, participant="p", near_cache=True
        )

        async def call(value: object) -> object:
            return await value if asynchronous else value  # type: ignore[misc]

        try:
            writer.update_status(5, KVPoll.Bootstrapping)
            assert await call(store.get(5)) is KVPoll.Bootstrapping  # cached now
            flushes = store.near_cache.state.flushes
            for payload in ("x", "kvstatus:other:{5}", ""):
                admin.publish("__redis__:invalidate", payload)
            writer.update_status(5, KVPoll.Transferring)
            for _ in range(200):
                if await call(store.get(5)) is KVPoll.Transferring:
                    break
                await asyncio.sleep(0.01)
            assert await call(store.get(5)) is KVPoll.Transferring  # the real invalidation arrived
            assert store.near_cache.state.flushes == flushes  # and nothing published emptied the cache
        finally:
            await call(store.close())

    try:
        asyncio.run(run())
    finally:
        admin.execute_command("ACL", "DELUSER", "nc-nochan")
