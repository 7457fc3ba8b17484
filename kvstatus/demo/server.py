"""The processes the demo starts: its one embedded ``redis-server``, a throwaway process on a free loopback port,
and the worker processes of ``--faults`` and ``--stuck`` (:class:`Child`).

``kvstatus demo`` runs on it when no URL is given. Nothing is persisted: the
server runs with ``--save ""`` and ``--appendonly no`` in its own temporary
directory, removed on :meth:`EmbeddedServer.stop`; servers still running when
the interpreter exits are stopped by an ``atexit`` hook. The test suite's
launchers (TLS, ACL, cluster, Sentinel) build on this class in ``tests/servers/``,
which is not shipped.

Depends on the standard library and redis-py only.
"""

from __future__ import annotations

import atexit
import contextlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType
from typing import TypeVar

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

__all__ = ["Child", "EmbeddedServer", "RedisServerError", "RedisServerNotFound", "find_redis_server", "free_port"]

LOOPBACK = "127.0.0.1"
BINARY = "redis-server"
POLL_INTERVAL = 0.02
"""Seconds between readiness polls."""
DEFAULT_STARTUP_TIMEOUT = 10.0
"""Seconds the server may take to answer."""
DEFAULT_STOP_GRACE = 5.0
"""Seconds between SIGTERM and SIGKILL when stopping."""
PORT_ATTEMPTS = 5
INSTALL = "Install Redis (for example 'apt-get install redis-server' or 'brew install redis')"

_Server = TypeVar("_Server", bound="EmbeddedServer")
_BIND_FAILURE_MARKERS = ("Address already in use", "Failed listening on port")


class RedisServerError(RuntimeError):
    """A redis-server process failed or did not become healthy."""


class RedisServerNotFound(RedisServerError):
    """The server executable is not on PATH."""


class PortInUse(RedisServerError):
    """redis-server exited because its port was already taken."""


def find_redis_server() -> str | None:
    """The path of ``redis-server`` on PATH, or None."""
    return shutil.which(BINARY)


def not_found(name: str, install: str = INSTALL) -> RedisServerNotFound:
    """The error for a missing executable: what to install, or which URL to give instead."""
    return RedisServerNotFound(
        f"{name} was not found on PATH. {install}, or point kvstatus at an existing server with a Redis URL."
    )


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def tail(text: str, lines: int = 25) -> str:
    """The last ``lines`` lines of a log."""
    return "\n".join(text.splitlines()[-lines:])


_registry_lock = threading.Lock()
_registry: set[EmbeddedServer] = set()


@atexit.register
def _stop_registered_servers() -> None:
    with _registry_lock:
        servers = list(_registry)
    stop_servers(servers, grace=1.0)


def stop_servers(servers: Iterable[EmbeddedServer], grace: float = DEFAULT_STOP_GRACE) -> None:
    """SIGTERM all servers at once, SIGKILL those still alive after ``grace`` seconds."""
    servers = list(servers)
    for server in servers:
        server._signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for server in servers:
        server._reap(deadline)
    for server in servers:
        server._cleanup()


class EmbeddedServer:
    """One ``redis-server`` process bound to 127.0.0.1, in its own temp dir.

    ``port=None`` picks a free port (and another one if redis cannot bind it);
    an explicit port is used as is.
    """

    def __init__(self, *, port: int | None = None, startup_timeout: float = DEFAULT_STARTUP_TIMEOUT) -> None:
        self._port = port
        self._auto_port = port is None
        self.startup_timeout = startup_timeout
        self._dir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_offset = 0

    @property
    def host(self) -> str:
        return LOOPBACK

    @property
    def port(self) -> int:
        if self._port is None:
            raise RedisServerError("server has no port yet; call start() first")
        return self._port

    @property
    def pid(self) -> int | None:
        """PID of the running process, or None when not running."""
        return self._proc.pid if self.is_running and self._proc is not None else None

    @property
    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def dir(self) -> Path:
        if self._dir is None:
            raise RedisServerError("server has no directory yet; call start() first")
        return self._dir

    @property
    def log_path(self) -> Path:
        return self.dir / "redis.log"

    @property
    def url(self) -> str:
        """The ``redis://`` URL of db 0."""
        return f"redis://{self.host}:{self.port}/0"

    def client(self, **kwargs: object) -> redis.Redis:
        """A ``redis.Redis`` for this server; ``kwargs`` override the defaults."""
        params: dict[str, object] = {"host": self.host, "port": self.port, **kwargs}
        return redis.Redis(**params)  # type: ignore[arg-type]

    def probe_client(self) -> redis.Redis:
        """A client that fails at once (no retries, short timeouts): for readiness and health polls."""
        return self.client(socket_connect_timeout=0.5, socket_timeout=0.5, retry=Retry(NoBackoff(), 0))

    def start(self: _Server) -> _Server:
        """Start the server and wait until it answers (up to ``startup_timeout`` seconds)."""
        if not self.is_running:
            self._start(allow_new_port=self._auto_port)
        return self

    def stop(self, grace: float = DEFAULT_STOP_GRACE) -> None:
        """SIGTERM, SIGKILL after ``grace`` seconds, wait, remove the temp dir. Idempotent."""
        stop_servers([self], grace)

    def __enter__(self: _Server) -> _Server:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"pid={self.pid}" if self.is_running else "stopped"
        return f"<{type(self).__name__} {self.host}:{self._port} {state}>"

    # -- what a subclass may change

    def _binary(self) -> str:
        """The executable to run; raises :class:`RedisServerNotFound` without one."""
        found = find_redis_server()
        if found is None:
            raise not_found(BINARY)
        return found

    def _pick_port(self) -> int:
        return free_port()

    def _command(self, binary: str) -> list[str]:
        return [binary, *self._options()]

    def _options(self) -> list[str]:
        return [
            "--bind",
            LOOPBACK,
            *self._port_args(),
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--dir",
            str(self.dir),
        ]

    def _port_args(self) -> list[str]:
        return ["--port", str(self.port)]

    # -- the process

    def _start(self, *, allow_new_port: bool) -> None:
        binary = self._binary()
        if self._dir is None or not self._dir.is_dir():
            self._dir = Path(tempfile.mkdtemp(prefix="kvstatus-redis-"))
        with _registry_lock:
            _registry.add(self)
        for attempt in range(1, PORT_ATTEMPTS + 1):
            if self._port is None:
                self._port = self._pick_port()
            try:
                self._launch(binary)
                self._wait_ready()
                return
            except PortInUse:
                if not allow_new_port or attempt == PORT_ATTEMPTS:
                    self.stop()
                    raise
                self._port = None
            except BaseException:
                self.stop()
                raise

    def _launch(self, binary: str) -> None:
        log_path = self.log_path
        self._log_offset = log_path.stat().st_size if log_path.exists() else 0
        with open(log_path, "ab") as log:
            self._proc = subprocess.Popen(
                self._command(binary), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=self.dir
            )

    def _log_since_launch(self) -> str:
        try:
            with open(self.log_path, "rb") as log:
                log.seek(self._log_offset)
                return log.read().decode(errors="replace")
        except OSError:
            return ""

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        probe = self.probe_client()
        try:
            while not self._answers(probe):
                self._raise_if_exited()
                if time.monotonic() >= deadline:
                    raise RedisServerError(
                        f"redis-server on {self.host}:{self.port} did not answer within "
                        f"{self.startup_timeout:.1f} s; log tail:\n{tail(self._log_since_launch())}"
                    )
                time.sleep(POLL_INTERVAL)
        finally:
            probe.close()

    def _answers(self, probe: redis.Redis) -> bool:
        """True once our own process answers on the port (another process may hold it)."""
        if not self.is_running:
            return False
        try:
            info = probe.info("server")
        except (redis.AuthenticationError, redis.ResponseError):
            return self.is_running
        except (redis.ConnectionError, redis.TimeoutError, OSError):
            return False
        return self._proc is not None and str(info.get("process_id")) == str(self._proc.pid)

    def _raise_if_exited(self) -> None:
        if self._proc is None or self._proc.poll() is None:
            return
        code = self._proc.returncode
        self._proc = None
        log = self._log_since_launch()
        message = f"redis-server on port {self._port} exited with code {code} during startup; log tail:\n{tail(log)}"
        if any(marker in log for marker in _BIND_FAILURE_MARKERS):
            raise PortInUse(message)
        raise RedisServerError(message)

    def _signal(self, sig: signal.Signals) -> None:
        if self._proc is not None and self._proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.send_signal(sig)

    def _reap(self, deadline: float) -> None:
        proc = self._proc
        if proc is None:
            return
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        self._proc = None

    def _cleanup(self) -> None:
        self._reap(time.monotonic())
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
        self._dir = None
        with _registry_lock:
            _registry.discard(self)


class Child:
    """A demo process running ``code`` (``python -c``) with ``args``: started, ready once it printed "ready",
    released by :meth:`go`, killed by :meth:`stop` (the fault trials and the stuck scenario)."""

    def __init__(self, code: str, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None
        if self.proc.stdout.readline() != "ready\n":
            self.stop()
            raise RuntimeError(f"a demo process exited before it was ready (exit code {self.proc.returncode})")

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
