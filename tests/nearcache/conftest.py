"""Fixtures of the near cache tests: stores with the cache on a real Redis."""

from __future__ import annotations

from typing import Iterator

import pytest

from kvstatus import StatusStore
from tests.helpers.backends import fresh_namespace
from tests.servers import RedisServer


@pytest.fixture
def namespace() -> str:
    return fresh_namespace("nc")


@pytest.fixture
def url(redis_server: RedisServer) -> str:
    return redis_server.url


@pytest.fixture
def writer(url: str, namespace: str) -> Iterator[StatusStore]:
    """An uncached store of another process's view: participant "w"."""
    with StatusStore.from_url(url, namespace=namespace, participant="w") as store:
        yield store


@pytest.fixture
def cached(url: str, namespace: str) -> Iterator[StatusStore]:
    """A cached store reading participant "w"'s entries."""
    with StatusStore.from_url(url, namespace=namespace, participant="w", near_cache=True) as store:
        yield store
