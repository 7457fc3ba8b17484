"""The CLI tests' fixtures: fakeredis behind CliRunner (the client injected through CliEnv.connect), a store on the
same fake server in namespace :data:`tests.helpers.cli.NS`, and one real ``redis-server`` per module."""

from __future__ import annotations

from typing import Any, Callable, Iterator

import fakeredis
import pytest

from kvstatus import StatusStore
from tests.helpers.cli import NS
from tests.helpers.tiers import require_redis_server
from tests.servers import RedisServer


@pytest.fixture
def server() -> fakeredis.FakeServer:
    return fakeredis.FakeServer()


@pytest.fixture
def connect(server: fakeredis.FakeServer) -> Callable[[str], Any]:
    """The CLI's seam: every URL connects to ``server``."""
    return lambda url: fakeredis.FakeRedis(server=server)


@pytest.fixture
def store(server: fakeredis.FakeServer) -> StatusStore:
    return StatusStore(fakeredis.FakeRedis(server=server), namespace=NS)


@pytest.fixture(scope="module")
def real_server() -> Iterator[RedisServer]:
    """A redis-server without a password (a module with its own ACL users defines its own)."""
    require_redis_server()
    with RedisServer() as started:
        yield started
