"""What launching a throwaway ``redis-server`` needs, beside the process itself: the binaries and their
versions, free loopback ports, readiness waits, INFO parsing and TLS file sets. :mod:`kvstatus.demo.server`
runs the process.

Depends on the standard library and redis-py only.
"""

from __future__ import annotations

import functools
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

LOOPBACK = "127.0.0.1"
CLUSTER_SLOTS = 16384
CLUSTER_BUS_OFFSET = 10000

POLL_INTERVAL = 0.02
"""Seconds between readiness polls of a single server."""
GROUP_POLL_INTERVAL = 0.05
"""Seconds between health polls of a cluster or sentinel group."""
DEFAULT_STARTUP_TIMEOUT = 10.0
"""Seconds a single server may take to answer PING."""
DEFAULT_GROUP_TIMEOUT = 30.0
"""Seconds a cluster or sentinel group may take to become healthy."""
DEFAULT_STOP_GRACE = 5.0
"""Seconds between SIGTERM and SIGKILL when stopping."""
PORT_ATTEMPTS = 5

_BIND_FAILURE_MARKERS = ("Address already in use", "Failed listening on port")
_LOG_NAME = "redis.log"


class RedisServerError(RuntimeError):
    """A redis-server (or redis-cli) process failed or did not become healthy."""


class RedisServerNotFound(RedisServerError):
    """The ``redis-server`` or ``redis-cli`` executable is not on PATH."""


class _PortInUse(RedisServerError):
    """redis-server exited because its port was already taken."""


def find_redis_server() -> str | None:
    """Return the path of ``redis-server`` on PATH, or None."""
    return shutil.which("redis-server")


def find_redis_cli() -> str | None:
    """Return the path of ``redis-cli`` on PATH, or None."""
    return shutil.which("redis-cli")


@functools.cache
def _server_version(binary: str) -> tuple[int, ...]:
    """Version of a redis-server binary, (0,) if it cannot be told."""
    result = subprocess.run([binary, "--version"], capture_output=True, text=True, check=False)
    match = re.search(r"v=(\d+)\.(\d+)\.(\d+)", result.stdout)
    return tuple(int(part) for part in match.groups()) if match else (0,)


def _require_executable(name: str, finder: Callable[[], str | None]) -> str:
    path = finder()
    if path is None:
        raise RedisServerNotFound(
            f"{name} was not found on PATH. Install Redis (for example "
            f"'apt-get install redis-server' or 'brew install redis') or point "
            f"kvstatus at an existing server with a Redis URL."
        )
    return path


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((LOOPBACK, port))
        except OSError:
            return False
        return True


def free_cluster_port() -> int:
    """Return a free port whose cluster bus port (port + 10000) is free too."""
    for _ in range(200):
        port = free_port()
        if port + CLUSTER_BUS_OFFSET <= 65535 and _port_is_free(port + CLUSTER_BUS_OFFSET):
            return port
    raise RedisServerError("could not find a free port pair for a cluster node")


def _no_retry() -> Retry:
    return Retry(NoBackoff(), 0)


def _tail(text: str, lines: int = 25) -> str:
    return "\n".join(text.splitlines()[-lines:])


def _wait_until(
    check: Callable[[], str | None], timeout: float, what: str, interval: float = GROUP_POLL_INTERVAL
) -> None:
    """Poll ``check`` every ``interval`` seconds until it returns None.

    ``check`` returns a description of what is still missing, or None when
    satisfied; redis errors count as "not yet".  Raises RedisServerError with
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


def _parse_info(text: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and not key.startswith("#"):
            fields[key.strip()] = value.strip()
    return fields


def _info_section(client: redis.Redis, section: str) -> dict[str, str]:
    return {str(key): str(value) for key, value in client.info(section).items()}


# --------------------------------------------------------------------------- TLS


@dataclass(frozen=True)
class TLSFiles:
    """PEM files for a TLS server: CA, server cert/key and optional client cert/key."""

    ca: Path
    cert: Path
    key: Path
    client_cert: Path | None = None
    client_key: Path | None = None

    def redis_kwargs(self, *, client_cert: bool = True) -> dict[str, object]:
        """Keyword arguments for ``redis.Redis`` to connect to a server using these files."""
        kwargs: dict[str, object] = {"ssl": True, "ssl_ca_certs": str(self.ca)}
        if client_cert and self.client_cert is not None and self.client_key is not None:
            kwargs["ssl_certfile"] = str(self.client_cert)
            kwargs["ssl_keyfile"] = str(self.client_key)
        return kwargs
