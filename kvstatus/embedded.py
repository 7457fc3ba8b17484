"""Throwaway ``redis-server`` processes on free loopback ports.

Used by ``kvstatus demo`` (an embedded server when no URL is configured), by
the test suite (standalone, cluster, sentinel, TLS and ACL servers) and by
benchmarks.  Nothing is persisted: every server runs with ``--save ""`` and
``--appendonly no`` in its own temporary directory, which is removed on
:meth:`RedisServer.stop`.  Servers still running when the interpreter exits
are stopped by an ``atexit`` hook.

This module is standalone on purpose: it depends on the standard library and
redis-py only.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Literal
from urllib.parse import quote

import redis
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.retry import Retry
from redis.sentinel import Sentinel

__all__ = [
    "RedisClusterServers",
    "RedisSentinelServers",
    "RedisServer",
    "RedisServerError",
    "RedisServerNotFound",
    "TLSFiles",
    "find_redis_cli",
    "find_redis_server",
    "free_cluster_port",
    "free_port",
    "make_tls_files",
]

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

TLSAuthClients = Literal["yes", "no", "optional"]


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


def _wait_until(check: Callable[[], str | None], timeout: float, what: str,
                interval: float = GROUP_POLL_INTERVAL) -> None:
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


def make_tls_files(directory: str | os.PathLike[str]) -> TLSFiles:
    """Write a CA, a server cert for 127.0.0.1/localhost and a client cert into ``directory``.

    Uses ``trustme`` when importable, else the ``openssl`` command line tool.
    """
    target = Path(directory)
    target.mkdir(parents=True, exist_ok=True)
    try:
        import trustme  # noqa: F401
    except ImportError:
        return _make_tls_files_openssl(target)
    return _make_tls_files_trustme(target)


def _tls_paths(directory: Path) -> tuple[Path, Path, Path, Path, Path]:
    """CA cert, server cert, server key, client cert, client key."""
    names = ("ca.crt", "server.crt", "server.key", "client.crt", "client.key")
    ca, cert, key, client_cert, client_key = (directory / name for name in names)
    return ca, cert, key, client_cert, client_key


def _make_tls_files_trustme(directory: Path) -> TLSFiles:
    import trustme

    ca_path, cert, key, client_cert, client_key = _tls_paths(directory)
    ca = trustme.CA(organization_name="kvstatus test CA")
    server = ca.issue_cert(LOOPBACK, "localhost")
    client = ca.issue_cert("kvstatus-client@example.invalid", common_name="kvstatus-client")
    ca.cert_pem.write_to_path(str(ca_path))
    server.cert_chain_pems[0].write_to_path(str(cert))
    server.private_key_pem.write_to_path(str(key))
    client.cert_chain_pems[0].write_to_path(str(client_cert))
    client.private_key_pem.write_to_path(str(client_key))
    return TLSFiles(ca_path, cert, key, client_cert, client_key)


def _make_tls_files_openssl(directory: Path) -> TLSFiles:
    openssl = shutil.which("openssl")
    if openssl is None:
        raise RedisServerError("neither trustme nor the openssl command is available")
    ca, cert, key, client_cert, client_key = _tls_paths(directory)
    ca_key = directory / "ca.key"
    _run_openssl(openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-sha256",
                 "-days", "3650", "-subj", "/CN=kvstatus test CA",
                 "-keyout", str(ca_key), "-out", str(ca),
                 "-addext", "basicConstraints=critical,CA:TRUE",
                 "-addext", "keyUsage=critical,keyCertSign,cRLSign",
                 "-addext", "subjectKeyIdentifier=hash")
    _openssl_issue(openssl, directory, "server", "/CN=localhost", cert, key, ca_key, ca,
                   "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                   "extendedKeyUsage=serverAuth,clientAuth\n")
    _openssl_issue(openssl, directory, "client", "/CN=kvstatus-client", client_cert, client_key,
                   ca_key, ca, "extendedKeyUsage=clientAuth\n")
    return TLSFiles(ca, cert, key, client_cert, client_key)


def _openssl_issue(openssl: str, directory: Path, name: str, subject: str, cert: Path,
                   key: Path, ca_key: Path, ca_cert: Path, extensions: str) -> None:
    csr = directory / f"{name}.csr"
    ext = directory / f"{name}.ext"
    ext.write_text(
        "basicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\n"
        "subjectKeyIdentifier=hash\n"
        "authorityKeyIdentifier=keyid,issuer\n" + extensions
    )
    _run_openssl(openssl, "req", "-newkey", "rsa:2048", "-nodes", "-sha256", "-subj", subject,
                 "-keyout", str(key), "-out", str(csr))
    _run_openssl(openssl, "x509", "-req", "-sha256", "-days", "3650", "-in", str(csr),
                 "-CA", str(ca_cert), "-CAkey", str(ca_key), "-CAcreateserial",
                 "-extfile", str(ext), "-out", str(cert))


def _run_openssl(openssl: str, *args: str) -> None:
    result = subprocess.run([openssl, *args], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RedisServerError(f"openssl {args[0]} failed:\n{_tail(result.stderr)}")


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

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
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
            "--bind", LOOPBACK,
            *self._port_args(),
            "--save", "",
            "--appendonly", "no",
            "--daemonize", "no",
            "--repl-diskless-sync-delay", "0",
            *self._shutdown_args(binary),
            "--dir", str(self.dir),
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
            "--port", "0",
            "--tls-port", str(self.port),
            "--tls-cert-file", str(self.tls.cert),
            "--tls-key-file", str(self.tls.key),
            "--tls-ca-cert-file", str(self.tls.ca),
            "--tls-auth-clients", self.tls_auth_clients,
            "--tls-replication", "yes",
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
        message = (f"redis-server on port {self._port} exited with code {code} during "
                   f"startup; log tail:\n{_tail(log)}")
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


# --------------------------------------------------------------------------- cluster


@dataclass(frozen=True)
class _ClusterNodeView:
    """One line of CLUSTER NODES as seen by some node."""

    node_id: str
    port: int
    flags: frozenset[str]
    master_id: str
    connected: bool
    slots: tuple[tuple[int, int], ...]

    @property
    def is_master(self) -> bool:
        return "master" in self.flags

    @property
    def failing(self) -> bool:
        return bool(self.flags & {"fail", "fail?", "handshake", "noaddr"})


def _parse_cluster_nodes(text: str) -> list[_ClusterNodeView]:
    views = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 8:
            continue
        address = parts[1].split("@", 1)[0].split(",", 1)[0]
        port = int(address.rsplit(":", 1)[1]) if ":" in address else 0
        slots = []
        for token in parts[8:]:
            if token.startswith("["):
                continue
            start, _, end = token.partition("-")
            slots.append((int(start), int(end or start)))
        views.append(_ClusterNodeView(
            node_id=parts[0],
            port=port,
            flags=frozenset(parts[2].split(",")),
            master_id=parts[3],
            connected=parts[7] == "connected",
            slots=tuple(sorted(slots)),
        ))
    return views


def _slot_map(views: Sequence[_ClusterNodeView]) -> tuple[tuple[int, int, int], ...]:
    """Sorted (first slot, last slot, owner port) ranges claimed by masters."""
    return tuple(sorted(
        (start, end, view.port) for view in views if view.is_master for start, end in view.slots
    ))


def _uncovered_slots(slot_map: Sequence[tuple[int, int, int]]) -> int:
    covered = sum(end - start + 1 for start, end, _ in slot_map)
    return CLUSTER_SLOTS - covered


class RedisClusterServers:
    """A Redis Cluster of ``masters`` primaries with ``replicas`` replicas each.

    ``node_timeout_ms`` is ``cluster-node-timeout`` in milliseconds;
    ``startup_timeout`` is in seconds.
    """

    def __init__(
        self,
        *,
        masters: int = 3,
        replicas: int = 0,
        password: str | None = None,
        node_timeout_ms: int = 1000,
        extra_args: Sequence[str] = (),
        startup_timeout: float = DEFAULT_GROUP_TIMEOUT,
        tls: TLSFiles | None = None,
    ) -> None:
        if masters < 3:
            raise ValueError("redis-cli --cluster create needs at least 3 masters")
        if replicas < 0:
            raise ValueError("replicas must be >= 0")
        self.master_count = masters
        self.replicas_per_master = replicas
        self.password = password
        self.node_timeout_ms = node_timeout_ms
        self.extra_args = tuple(extra_args)
        self.startup_timeout = startup_timeout
        self.tls = tls
        self.nodes: list[RedisServer] = []

    @property
    def startup_nodes(self) -> list[tuple[str, int]]:
        return [node.address for node in self.nodes]

    @property
    def url(self) -> str:
        """``redis+cluster://[:password@]127.0.0.1:p1,127.0.0.1:p2,...`` (``rediss+cluster`` with TLS,
        without the certificate options)."""
        hosts = ",".join(f"{host}:{port}" for host, port in self.startup_nodes)
        scheme = "rediss+cluster" if self.tls is not None else "redis+cluster"
        return f"{scheme}://{_userinfo(None, self.password)}{hosts}"

    def client(self, **kwargs: object) -> RedisCluster:
        """A ``redis.cluster.RedisCluster``; ``kwargs`` override the defaults."""
        params: dict[str, object] = {
            "startup_nodes": [ClusterNode(h, p) for h, p in self.startup_nodes if self._is_up(p)],
            "password": self.password,
            **(self.tls.redis_kwargs() if self.tls is not None else {}),
        }
        params.update(kwargs)
        return RedisCluster(**params)  # type: ignore[arg-type]

    def start(self) -> RedisClusterServers:
        """Start all nodes, create the cluster and wait until it is healthy."""
        if any(node.is_running for node in self.nodes):
            return self
        cli = _require_executable("redis-cli", find_redis_cli)
        _require_executable("redis-server", find_redis_server)
        self.nodes = []
        try:
            for _ in range(self.master_count * (self.replicas_per_master + 1)):
                self.nodes.append(RedisServer(password=self.password, tls=self.tls,
                                              extra_args=self._node_args()).start())
            self._create(cli)
            self.wait_healthy(self.startup_timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every node (idempotent)."""
        _stop_servers(self.nodes)

    def __enter__(self) -> RedisClusterServers:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def masters(self) -> list[RedisServer]:
        """Running nodes that currently serve slots, per CLUSTER NODES of a live node."""
        return [self._node_by_port(v.port) for v in self._live_view()
                if v.is_master and v.slots and not v.failing and self._is_up(v.port)]

    def replicas(self) -> list[RedisServer]:
        """Running nodes that are currently replicas, per CLUSTER NODES of a live node."""
        return [self._node_by_port(v.port) for v in self._live_view()
                if "slave" in v.flags and not v.failing and self._is_up(v.port)]

    def wait_healthy(self, timeout: float = DEFAULT_GROUP_TIMEOUT) -> None:
        """Wait up to ``timeout`` seconds until every running node reports a healthy cluster.

        Healthy: cluster_state:ok everywhere, all nodes show the same slot map,
        all 16384 slots are served by running masters, running nodes see each
        other as connected, and every running replica's link is up.
        """
        _wait_until(self._health_problem, timeout, "healthy cluster")

    # -- internals

    def _node_args(self) -> list[str]:
        args = [
            "--cluster-enabled", "yes",
            "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", str(self.node_timeout_ms),
        ]
        if self.password is not None:
            args += ["--masterauth", self.password]
        if self.tls is not None:
            args += ["--tls-cluster", "yes"]
        return args + list(self.extra_args)

    def _create(self, cli: str) -> None:
        command = [cli, "--cluster", "create",
                   *(f"{host}:{port}" for host, port in self.startup_nodes),
                   "--cluster-replicas", str(self.replicas_per_master), "--cluster-yes"]
        if self.tls is not None:
            command += ["--tls", "--cacert", str(self.tls.ca)]
        env = dict(os.environ)
        if self.password is not None:
            env["REDISCLI_AUTH"] = self.password
        try:
            result = subprocess.run(command, capture_output=True, text=True, env=env,
                                    timeout=self.startup_timeout, check=False)
        except subprocess.TimeoutExpired as exc:
            raise RedisServerError(
                f"redis-cli --cluster create did not finish within {self.startup_timeout:.1f} s"
            ) from exc
        if result.returncode != 0 or "[ERR]" in result.stdout:
            raise RedisServerError(
                f"redis-cli --cluster create failed (exit {result.returncode}):\n"
                f"{_tail(result.stdout + result.stderr)}"
            )

    def _is_up(self, port: int) -> bool:
        return any(node.port == port and node.is_running for node in self.nodes)

    def _node_by_port(self, port: int) -> RedisServer:
        for node in self.nodes:
            if node.port == port:
                return node
        raise RedisServerError(f"no node of this cluster listens on port {port}")

    def _cluster_nodes(self, node: RedisServer) -> list[_ClusterNodeView]:
        with node._probe_client() as client:
            raw = client.execute_command("CLUSTER", "NODES")
        return _parse_cluster_nodes(raw.decode() if isinstance(raw, bytes) else str(raw))

    def _live_view(self) -> list[_ClusterNodeView]:
        errors = []
        for node in self.nodes:
            if node.is_running:
                try:
                    return self._cluster_nodes(node)
                except redis.RedisError as exc:
                    errors.append(f"{node.port}: {exc}")
        raise RedisServerError(f"no cluster node answered CLUSTER NODES: {errors}")

    def _health_problem(self) -> str | None:
        live = [node for node in self.nodes if node.is_running]
        if not live:
            return "no node is running"
        live_ports = {node.port for node in live}
        slot_maps = set()
        role_maps = set()
        for node in live:
            problem, slot_map = self._node_problem(node, live_ports)
            if problem is not None:
                return f"node {node.port}: {problem}"
            slot_maps.add(slot_map)
            role_maps.add(self._role_map(node, live_ports))
        if len(slot_maps) > 1:
            return "nodes disagree on the slot map"
        if len(role_maps) > 1:
            return "nodes disagree on which nodes are replicas"  # gossip still spreading a role change
        return None

    def _role_map(self, node: RedisServer, live_ports: set[int]) -> frozenset[tuple[int, bool]]:
        """(port, is replica) of every running node, as ``node`` sees them."""
        return frozenset((v.port, "slave" in v.flags) for v in self._cluster_nodes(node) if v.port in live_ports)

    def _node_problem(self, node: RedisServer, live_ports: set[int]
                      ) -> tuple[str | None, tuple[tuple[int, int, int], ...]]:
        with node._probe_client() as client:
            info = _parse_info(client.execute_command("CLUSTER", "INFO").decode())
            views = _parse_cluster_nodes(client.execute_command("CLUSTER", "NODES").decode())
            replication = _info_section(client, "replication")
        slot_map = _slot_map([v for v in views if not v.failing])
        if info.get("cluster_state") != "ok":
            return f"cluster_state:{info.get('cluster_state')}", slot_map
        missing = _uncovered_slots(slot_map)
        if missing:
            return f"{missing} slots not served by a healthy master", slot_map
        dead_owners = {port for _, _, port in slot_map} - live_ports
        if dead_owners:
            return f"slots still owned by stopped nodes {sorted(dead_owners)}", slot_map
        seen = {v.port for v in views if not v.failing and (v.connected or "myself" in v.flags)}
        if not live_ports <= seen:
            return f"does not see {sorted(live_ports - seen)} as healthy", slot_map
        if replication.get("role") == "slave" and replication.get("master_link_status") != "up":
            return "replica link to its master is down", slot_map
        return None, slot_map


# -------------------------------------------------------------------------- sentinel


class _SentinelServer(RedisServer):
    """A ``redis-server sentinel.conf --sentinel`` process."""

    def __init__(self, *, config_lines: Sequence[str], **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self._config_lines = tuple(config_lines)

    def _leading_args(self) -> list[str]:
        config = self.dir / "sentinel.conf"
        if not config.exists():
            config.write_text("\n".join(self._config_lines) + "\n")
        return [str(config), "--sentinel"]


class RedisSentinelServers:
    """A master, one replica and ``sentinels`` sentinels monitoring ``service_name``.

    ``down_after_ms`` and ``failover_timeout_ms`` are in milliseconds; other
    timeouts are in seconds.  ``password`` protects the data nodes (the
    sentinels use ``sentinel auth-pass``); ``sentinel_password`` protects the
    sentinels themselves (``requirepass`` and ``sentinel sentinel-pass``).
    ``tls`` makes every node and sentinel TLS-only.
    """

    def __init__(
        self,
        *,
        service_name: str = "mymaster",
        sentinels: int = 3,
        quorum: int = 2,
        password: str | None = None,
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 5000,
        startup_timeout: float = DEFAULT_GROUP_TIMEOUT,
        tls: TLSFiles | None = None,
        sentinel_password: str | None = None,
    ) -> None:
        if not service_name or any(char.isspace() for char in service_name):
            raise ValueError(f"invalid sentinel service name {service_name!r}")
        self.service_name = service_name
        self.sentinel_count = sentinels
        self.quorum = quorum
        self.password = password
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        self.startup_timeout = startup_timeout
        self.tls = tls
        self.sentinel_password = sentinel_password
        self.master = RedisServer(password=password, tls=tls, extra_args=self._auth_args())
        self.replica = RedisServer(password=password, tls=tls)
        self.sentinels: list[RedisServer] = []

    @property
    def sentinel_addresses(self) -> list[tuple[str, int]]:
        return [sentinel.address for sentinel in self.sentinels]

    @property
    def url(self) -> str:
        """``redis+sentinel://[:password@]127.0.0.1:s1,...,127.0.0.1:sN/<service>/0[?sentinel_password=...]``
        (``rediss+sentinel`` with TLS, without the certificate options)."""
        hosts = ",".join(f"{host}:{port}" for host, port in self.sentinel_addresses)
        scheme = "rediss+sentinel" if self.tls is not None else "redis+sentinel"
        query = f"?sentinel_password={quote(self.sentinel_password, safe='')}" if self.sentinel_password else ""
        return (f"{scheme}://{_userinfo(None, self.password)}{hosts}/"
                f"{quote(self.service_name, safe='')}/0{query}")

    @property
    def nodes(self) -> list[RedisServer]:
        """The data nodes: original master and replica."""
        return [self.master, self.replica]

    def sentinel(self, **kwargs: object) -> Sentinel:
        """A ``redis.sentinel.Sentinel`` for this group; ``kwargs`` go to data connections."""
        tls = self.tls.redis_kwargs() if self.tls is not None else {}
        params: dict[str, object] = {"password": self.password, **tls}
        params.update(kwargs)
        sentinel_kwargs = {"password": self.sentinel_password, **tls}
        return Sentinel(self.sentinel_addresses, sentinel_kwargs=sentinel_kwargs, **params)

    def client(self, **kwargs: object) -> redis.Redis:
        """A ``redis.Redis`` that follows the current master through the sentinels."""
        client: redis.Redis = self.sentinel(**kwargs).master_for(self.service_name)
        return client

    def start(self) -> RedisSentinelServers:
        """Start master, replica and sentinels; wait until the sentinels see everything."""
        if any(server.is_running for server in [*self.sentinels, *self.nodes]):
            return self
        self.sentinels = []
        try:
            self.master.start()
            self.replica.extra_args = (
                "--replicaof", self.master.host, str(self.master.port), *self._auth_args())
            self.replica.start()
            _wait_until(self._replication_problem, self.startup_timeout, "replica in sync")
            for _ in range(self.sentinel_count):
                sentinel = _SentinelServer(config_lines=self._sentinel_config(), tls=self.tls,
                                           password=self.sentinel_password)
                self.sentinels.append(sentinel.start())
            _wait_until(self._sentinels_problem, self.startup_timeout, "sentinels ready")
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop the sentinels first, then the data nodes (idempotent)."""
        _stop_servers(self.sentinels)
        _stop_servers(self.nodes)

    def __enter__(self) -> RedisSentinelServers:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def current_master_address(self) -> tuple[str, int]:
        """(host, port) of the master according to the first sentinel that answers."""
        errors = []
        for sentinel in self.sentinels:
            if not sentinel.is_running:
                continue
            try:
                return self._master_address_from(sentinel)
            except (redis.RedisError, RedisServerError) as exc:
                errors.append(f"{sentinel.port}: {exc}")
        raise RedisServerError(f"no sentinel reported a master address: {errors}")

    def current_master(self) -> RedisServer:
        """The data node that the sentinels currently report as master."""
        _, port = self.current_master_address()
        for node in self.nodes:
            if node.port == port:
                return node
        raise RedisServerError(f"sentinels report unknown master port {port}")

    def failover(self, timeout: float = DEFAULT_GROUP_TIMEOUT) -> tuple[str, int]:
        """Force a failover and return the new master's address.

        Waits up to ``timeout`` seconds until every sentinel reports the same new
        master and it answers ROLE as master.  A still running old master is then
        made a replica of the new one right away (sentinel itself would do so
        only about 8 s later), so no client keeps writing to it.
        """
        old = self.current_master_address()
        deadline = time.monotonic() + timeout
        _wait_until(self._request_failover, timeout, "SENTINEL FAILOVER accepted")
        new = self.wait_for_new_master(old, max(0.0, deadline - time.monotonic()))
        self._demote(old, new)
        return new

    def wait_for_new_master(self, old: tuple[str, int],
                            timeout: float = DEFAULT_GROUP_TIMEOUT) -> tuple[str, int]:
        """Wait up to ``timeout`` seconds until every running sentinel reports the same
        master other than ``old`` and that node answers ROLE as master; return it.

        Use after killing the master to wait for the automatic failover.
        """
        new: list[tuple[str, int]] = []

        def problem() -> str | None:
            addresses = {self._master_address_from(s) for s in self.sentinels if s.is_running}
            if len(addresses) != 1 or old in addresses:
                return f"sentinels report {sorted(addresses)} (old master {old})"
            address = addresses.pop()
            with self._node_at(address)._probe_client() as client:
                role = _text(client.execute_command("ROLE")[0])
            if role != "master":
                return f"{address} still has role {role}"
            new[:] = [address]
            return None

        _wait_until(problem, timeout, "sentinel failover")
        return new[0]

    # -- internals

    def _auth_args(self) -> list[str]:
        return ["--masterauth", self.password] if self.password is not None else []

    def _sentinel_config(self) -> list[str]:
        name = self.service_name
        lines = [
            "sentinel resolve-hostnames no",
            f"sentinel monitor {name} {self.master.host} {self.master.port} {self.quorum}",
            f"sentinel down-after-milliseconds {name} {self.down_after_ms}",
            f"sentinel failover-timeout {name} {self.failover_timeout_ms}",
            f"sentinel parallel-syncs {name} 1",
        ]
        if self.password is not None:
            lines.append(f"sentinel auth-pass {name} {_conf_quote(self.password)}")
        if self.sentinel_password is not None:
            lines.append(f"sentinel sentinel-pass {_conf_quote(self.sentinel_password)}")
        return lines

    def _node_at(self, address: tuple[str, int]) -> RedisServer:
        for node in self.nodes:
            if node.address == address:
                return node
        raise RedisServerError(f"{address} is not a data node of this group")

    def _demote(self, old: tuple[str, int], new: tuple[str, int]) -> None:
        node = self._node_at(old)
        if node.is_running:
            with node._probe_client() as client:
                client.execute_command("REPLICAOF", new[0], str(new[1]))

    def _master_address_from(self, sentinel: RedisServer) -> tuple[str, int]:
        with sentinel._probe_client() as client:
            reply = client.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service_name)
        if not reply:
            raise RedisServerError(f"sentinel {sentinel.port} does not know {self.service_name}")
        return (_text(reply[0]), int(reply[1]))

    def _replication_problem(self) -> str | None:
        with self.replica._probe_client() as client:
            info = _info_section(client, "replication")
        if info.get("master_link_status") != "up":
            return f"replica link is {info.get('master_link_status')}"
        return None

    def _request_failover(self) -> str | None:
        running = [s for s in self.sentinels if s.is_running]
        if not running:
            return "no sentinel is running"
        with running[0]._probe_client() as client:
            try:
                client.execute_command("SENTINEL", "FAILOVER", self.service_name)
            except redis.ResponseError as exc:
                return str(exc)
        return None

    def _sentinels_problem(self) -> str | None:
        for sentinel in self.sentinels:
            with sentinel._probe_client() as client:
                master = client.sentinel_master(self.service_name)
                replicas = client.sentinel_slaves(self.service_name)
            if not master["is_master"] or master["is_sdown"] or master["is_odown"]:
                return f"sentinel {sentinel.port} sees master flags {master['flags']}"
            if master["num-other-sentinels"] != self.sentinel_count - 1:
                return (f"sentinel {sentinel.port} knows "
                        f"{master['num-other-sentinels']} other sentinels")
            healthy = {int(r["port"]) for r in replicas
                       if not (r["is_sdown"] or r["is_disconnected"])}
            if self.replica.port not in healthy:
                return f"sentinel {sentinel.port} does not see the replica yet"
        return None


def _conf_quote(value: str) -> str:
    """Quote a value for a redis config file line."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
