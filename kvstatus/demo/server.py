"""Throwaway ``redis-server`` processes on free loopback ports.

``kvstatus demo`` runs on one when no URL is configured; the test suite and the
benchmarks build their cluster, Sentinel and TLS servers on :class:`RedisServer`
(see ``tests/servers/``, which is not shipped). Nothing is persisted: every
server runs with ``--save ""`` and ``--appendonly no`` in its own temporary
directory, removed on :meth:`RedisServer.stop`. Servers still running when the
interpreter exits are stopped by an ``atexit`` hook.

Depends on the standard library and redis-py only.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Literal
from urllib.parse import quote

import redis

__all__ = [
    "RedisServer",
    "RedisServerError",
    "RedisServerNotFound",
    "TLSFiles",
    "find_redis_cli",
    "find_redis_server",
    "free_cluster_port",
    "free_port",
]


from kvstatus.demo.launch import (  # noqa: F401  (re-exported: tests/servers imports them from here)
    _BIND_FAILURE_MARKERS,
    _LOG_NAME,
    CLUSTER_BUS_OFFSET,
    CLUSTER_SLOTS,
    DEFAULT_GROUP_TIMEOUT,
    DEFAULT_STARTUP_TIMEOUT,
    DEFAULT_STOP_GRACE,
    GROUP_POLL_INTERVAL,
    LOOPBACK,
    POLL_INTERVAL,
    PORT_ATTEMPTS,
    RedisServerError,
    RedisServerNotFound,
    TLSFiles,
    _info_section,
    _no_retry,
    _parse_info,
    _port_is_free,
    _PortInUse,
    _require_executable,
    _server_version,
    _tail,
    _wait_until,
    find_redis_cli,
    find_redis_server,
    free_cluster_port,
    free_port,
)

TLSAuthClients = Literal["yes", "no", "optional"]


# ------------------------------------------------------------------ process registry

_registry_lock = threading.Lock()
_registry: set[RedisServer] = set()


def _register(server: RedisServer) -> None:
    with _registry_lock:
        _registry.add(server)


def _unregister(server: RedisServer) -> None:
    with _registry_lock:
        _registry.discard(server)


@atexit.register
def _stop_registered_servers() -> None:
    with _registry_lock:
        servers = list(_registry)
    _stop_servers(servers, grace=1.0)


def _stop_servers(servers: Iterable[RedisServer], grace: float = DEFAULT_STOP_GRACE) -> None:
    """SIGTERM all servers at once, SIGKILL those still alive after ``grace`` seconds."""
    servers = list(servers)
    for server in servers:
        server._signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for server in servers:
        server._reap(deadline)
    for server in servers:
        server._cleanup()


# ------------------------------------------------------------------------ standalone


class RedisServer:
    """One ``redis-server`` process bound to 127.0.0.1, with its own temp dir.

    ``port=None`` picks a free port (retrying with another one if redis cannot
    bind it); an explicit port is used as is.  With ``tls`` the server listens
    TLS-only on its port.  ``dir`` is used as the working directory instead of
    a fresh temp dir and is then left in place on stop.
    """

    def __init__(
        self,
        *,
        port: int | None = None,
        password: str | None = None,
        username: str | None = None,
        acl_file: str | os.PathLike[str] | None = None,
        tls: TLSFiles | None = None,
        tls_auth_clients: TLSAuthClients = "optional",
        extra_args: Sequence[str] = (),
        dir: str | os.PathLike[str] | None = None,
        startup_timeout: float = DEFAULT_STARTUP_TIMEOUT,
    ) -> None:
        self._port = port
        self._auto_port = port is None
        self.password = password
        self.username = username
        self.acl_file = Path(acl_file) if acl_file is not None else None
        self.tls = tls
        self.tls_auth_clients = tls_auth_clients
        self.extra_args = tuple(extra_args)
        self.startup_timeout = startup_timeout
        self._given_dir = Path(dir) if dir is not None else None
        self._dir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_offset = 0

    # -- properties

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
        return self.dir / _LOG_NAME

    @property
    def url(self) -> str:
        """``redis://`` or ``rediss://`` URL for db 0, including credentials if any."""
        scheme = "rediss" if self.tls is not None else "redis"
        return f"{scheme}://{_userinfo(self.username, self.password)}{self.host}:{self.port}/0"

    @property
    def address(self) -> tuple[str, int]:
        return (self.host, self.port)

    def ssl_kwargs(self) -> dict[str, object]:
        """redis-py TLS keyword arguments for this server (empty without TLS)."""
        return self.tls.redis_kwargs() if self.tls is not None else {}

    def client(self, **kwargs: object) -> redis.Redis:
        """A ``redis.Redis`` for this server; ``kwargs`` override the defaults."""
        params: dict[str, object] = {
            "host": self.host,
            "port": self.port,
            "username": self.username,
            "password": self.password,
            **self.ssl_kwargs(),
        }
        params.update(kwargs)
        return redis.Redis(**params)  # type: ignore[arg-type]

    # -- lifecycle

    def start(self) -> RedisServer:
        """Start the server and wait until it answers (up to ``startup_timeout`` seconds)."""
        if self.is_running:
            return self
        self._start(allow_new_port=self._auto_port)
        return self

    def restart(self) -> RedisServer:
        """Stop (if running) and start again on the same port with the same config.

        Data is not kept; a cluster node keeps its ``nodes.conf`` and rejoins.
        """
        if self._port is None:
            return self.start()
        self._signal(signal.SIGTERM)
        self._reap(time.monotonic() + DEFAULT_STOP_GRACE)
        self._start(allow_new_port=False)
        return self

    def stop(self, grace: float = DEFAULT_STOP_GRACE) -> None:
        """SIGTERM, SIGKILL after ``grace`` seconds, wait, remove the temp dir. Idempotent."""
        _stop_servers([self], grace)

    def kill(self) -> None:
        """SIGKILL immediately and reap; the directory is kept for :meth:`restart`."""
        self._signal(signal.SIGKILL)
        self._reap(time.monotonic() + DEFAULT_STOP_GRACE)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"pid={self.pid}" if self.is_running else "stopped"
        return f"<{type(self).__name__} {self.host}:{self._port} {state}>"

    # -- internals

    def _start(self, *, allow_new_port: bool) -> None:
        binary = _require_executable("redis-server", find_redis_server)
        self._ensure_dir()
        _register(self)
        for attempt in range(1, PORT_ATTEMPTS + 1):
            if self._port is None:
                self._port = self._pick_port()
            try:
                self._launch(binary)
                self._wait_ready()
                return
            except _PortInUse:
                if not allow_new_port or attempt == PORT_ATTEMPTS:
                    self.stop()
                    raise
                self._port = None
            except BaseException:
                self.stop()
                raise

    def _pick_port(self) -> int:
        if _flag_enabled(self.extra_args, "--cluster-enabled"):
            return free_cluster_port()
        return free_port()

    def _ensure_dir(self) -> None:
        if self._dir is not None and self._dir.is_dir():
            return
        if self._given_dir is not None:
            self._given_dir.mkdir(parents=True, exist_ok=True)
            self._dir = self._given_dir.resolve()
        else:
            self._dir = Path(tempfile.mkdtemp(prefix="kvstatus-redis-"))

    def _command(self, binary: str) -> list[str]:
        return [
            binary,
            *self._leading_args(),
            "--bind",
            LOOPBACK,
            *self._port_args(),
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--repl-diskless-sync-delay",
            "0",
            *self._shutdown_args(binary),
            "--dir",
            str(self.dir),
            *self._auth_args(),
            *self.extra_args,
        ]

    def _leading_args(self) -> list[str]:
        """Arguments that must precede the options (a config file path)."""
        return []

    @staticmethod
    def _shutdown_args(binary: str) -> list[str]:
        """Redis >= 7 waits up to 10 s for lagging replicas on SIGTERM; nothing to save here."""
        return ["--shutdown-timeout", "0"] if _server_version(binary) >= (7,) else []

    def _port_args(self) -> list[str]:
        if self.tls is None:
            return ["--port", str(self.port)]
        return [
            "--port",
            "0",
            "--tls-port",
            str(self.port),
            "--tls-cert-file",
            str(self.tls.cert),
            "--tls-key-file",
            str(self.tls.key),
            "--tls-ca-cert-file",
            str(self.tls.ca),
            "--tls-auth-clients",
            self.tls_auth_clients,
            "--tls-replication",
            "yes",
        ]

    def _auth_args(self) -> list[str]:
        args: list[str] = []
        if self.password is not None and self.acl_file is None:
            args += ["--requirepass", self.password]
        if self.acl_file is not None:
            args += ["--aclfile", str(self.acl_file.resolve())]
        return args

    def _launch(self, binary: str) -> None:
        log_path = self.log_path
        self._log_offset = log_path.stat().st_size if log_path.exists() else 0
        with open(log_path, "ab") as log:
            self._proc = subprocess.Popen(
                self._command(binary),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.dir,
            )

    def _log_since_launch(self) -> str:
        try:
            with open(self.log_path, "rb") as log:
                log.seek(self._log_offset)
                return log.read().decode(errors="replace")
        except OSError:
            return ""

    def _probe_client(self) -> redis.Redis:
        return self.client(
            socket_connect_timeout=0.5,
            socket_timeout=0.5,
            retry=_no_retry(),
        )

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        probe = self._probe_client()
        try:
            while not self._answers(probe):
                self._raise_if_exited()
                if time.monotonic() >= deadline:
                    raise RedisServerError(
                        f"redis-server on {self.host}:{self.port} did not answer within "
                        f"{self.startup_timeout:.1f} s; log tail:\n{_tail(self._log_since_launch())}"
                    )
                time.sleep(POLL_INTERVAL)
        finally:
            probe.close()

    def _answers(self, probe: redis.Redis) -> bool:
        """True once our own process answers on the port."""
        if not self.is_running:
            return False
        try:
            info = _info_section(probe, "server")
        except (redis.AuthenticationError, redis.ResponseError):
            return self.is_running
        except (redis.ConnectionError, redis.TimeoutError, OSError):
            return False
        return self._proc is not None and info.get("process_id") == str(self._proc.pid)

    def _raise_if_exited(self) -> None:
        if self._proc is None or self._proc.poll() is None:
            return
        code = self._proc.returncode
        self._proc = None
        log = self._log_since_launch()
        message = f"redis-server on port {self._port} exited with code {code} during startup; log tail:\n{_tail(log)}"
        if any(marker in log for marker in _BIND_FAILURE_MARKERS):
            raise _PortInUse(message)
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
        if self._dir is not None and self._given_dir is None:
            shutil.rmtree(self._dir, ignore_errors=True)
        self._dir = None
        _unregister(self)


def _userinfo(username: str | None, password: str | None) -> str:
    if password is None:
        return ""
    return f"{quote(username or '', safe='')}:{quote(password, safe='')}@"


def _flag_enabled(args: Sequence[str], flag: str) -> bool:
    pairs = zip(args, list(args)[1:], strict=False)
    return any(name == flag and value.lower() == "yes" for name, value in pairs)
