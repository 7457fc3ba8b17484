"""A read the near cache sends raises the store's kvstatus errors, never a redis-py exception."""

from __future__ import annotations

import asyncio

import pytest

from kvstatus import AsyncStatusStore, StatusStore
from kvstatus.admin.acl import acl_rules
from kvstatus.demo.server import RedisServer
from kvstatus.errors import CorruptedValueError, PermissionDeniedError

pytestmark = pytest.mark.real


def test_a_key_of_another_type_is_a_corrupted_value_as_without_the_cache(redis_server: RedisServer, url: str,
                                                                          namespace: str) -> None:
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


def test_a_user_without_the_invalidation_channel_gets_permission_denied(redis_server: RedisServer,
                                                                        namespace: str) -> None:
    admin = redis_server.client()
    rules = [r for r in acl_rules(namespace, password="pw-nce", scripts="eval") if r != "+subscribe"]
    admin.execute_command("ACL", "SETUSER", "nc-nosub", *rules)
    try:
        url = f"redis://nc-nosub:pw-nce@{redis_server.host}:{redis_server.port}/0"
        with StatusStore.from_url(url, namespace=namespace, near_cache=True) as store:
            with pytest.raises(PermissionDeniedError, match="subscribe"):
                store.get(5)

        async def run() -> None:
            async with AsyncStatusStore.from_url(url, namespace=namespace, near_cache=True) as store:
                with pytest.raises(PermissionDeniedError, match="subscribe"):
                    await store.get(5)
        asyncio.run(run())
    finally:
        admin.execute_command("ACL", "DELUSER", "nc-nosub")
