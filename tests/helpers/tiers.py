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
- ``slow``: the slow run. ``./dev test`` runs every test *not* marked ``slow``
  (``-m "not slow"``, on pytest-xdist workers), ``./dev test-slow`` the rest, and
  CI runs both (tests/packaging/test_runs.py checks that together they hold every
  test). Every test under ``tests/torture/`` is ``slow``; so are fault injections
  that take seconds, and the ``deep`` case of property tests
  (:mod:`tests.helpers.depth`).

This module is a pytest plugin: ``tests/conftest.py`` imports its hooks, and a
test of the tiers themselves loads it with ``-p tests.helpers.tiers``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterator

import pytest

from kvstatus.demo import server as server_module
from kvstatus.demo.server import find_redis_server

TESTS = Path(__file__).resolve().parents[1]
FOLDER_MARKERS = {"unit": ("unit",), "torture": ("slow",)}
"""Markers every test under ``tests/<folder>/`` gets."""
REAL_FIXTURES = frozenset({"redis_server", "redis_cluster"})
"""Fixtures that start real servers: a test using one (even indirectly) is marked ``real``."""
MISSING = "redis-server is not on PATH, so the real-Redis tier cannot run (Debian: apt-get install redis-server)"


def real_redis_required() -> bool:
    """True in CI (or when asked): a missing redis-server then fails the real tier instead of skipping it."""
    ci = os.environ.get("CI", "").lower() in ("1", "true", "yes")
    return ci or os.environ.get("KVSTATUS_REQUIRE_REDIS") == "1"


def require_redis_server() -> str:
    """The redis-server binary's path; skips the calling test (fails it in CI) when there is none."""
    path = find_redis_server()
    if path is None:
        if real_redis_required():
            pytest.fail(f"{MISSING}; CI=true or KVSTATUS_REQUIRE_REDIS=1 requires it", pytrace=False)
        pytest.skip(MISSING)
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


@pytest.fixture(autouse=True)
def _redis_server_needs_the_real_marker(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a test that starts a redis-server in this process without carrying the ``real`` marker."""
    if request.node.get_closest_marker("real"):
        yield
        return
    original = server_module.RedisServer._launch

    def refuse(self: Any, binary: str) -> None:
        pytest.fail(
            f"{request.node.nodeid} starts a redis-server but is not marked real "
            "(add @pytest.mark.real, or use the redis_server fixture)",
            pytrace=False,
        )

    server_module.RedisServer._launch = refuse  # type: ignore[method-assign]
    try:
        yield
    finally:
        server_module.RedisServer._launch = original  # type: ignore[method-assign]
