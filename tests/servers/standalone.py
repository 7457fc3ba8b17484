"""The tests' standalone server: the demo's embedded one, with what tests add (TLS, a password or an ACL file,
extra arguments, kill and restart), on the test family's binary and the worker's ports."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Literal
from urllib.parse import quote

import redis

from kvstatus.demo.server import DEFAULT_STARTUP_TIMEOUT, DEFAULT_STOP_GRACE, EmbeddedServer
from tests.servers import ports
from tests.servers.launch import find_redis_server, require_executable, server_family, server_version
from tests.servers.tls import TLSFiles

__all__ = ["RedisServer", "userinfo"]

TLSAuthClients = Literal["yes", "no", "optional"]


class RedisServer(EmbeddedServer):
    """One test ``redis-server`` (or ``valkey-server``) on 127.0.0.1.

    With ``tls`` the server listens TLS-only on its port; ``extra_args`` come
    last on its command line.
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
        startup_timeout: float = DEFAULT_STARTUP_TIMEOUT,
    ) -> None:
        super().__init__(port=port, startup_timeout=startup_timeout)
        self.password = password
        self.username = username
        self.acl_file = Path(acl_file) if acl_file is not None else None
        self.tls = tls
        self.tls_auth_clients = tls_auth_clients
        self.extra_args = tuple(extra_args)

    @property
    def address(self) -> tuple[str, int]:
        return (self.host, self.port)

    @property
    def url(self) -> str:
        """``redis://`` or ``rediss://`` URL for db 0, including credentials if any."""
        scheme = "rediss" if self.tls is not None else "redis"
        return f"{scheme}://{userinfo(self.username, self.password)}{self.host}:{self.port}/0"

    def client(self, **kwargs: object) -> redis.Redis:
        """A ``redis.Redis`` for this server, with its credentials and TLS files; ``kwargs`` override them."""
        tls = self.tls.redis_kwargs() if self.tls is not None else {}
        return super().client(**{"username": self.username, "password": self.password, **tls, **kwargs})

    def restart(self, wait: bool = True) -> RedisServer:
        """Stop (if running) and start again on the same port with the same config.

        Data is not kept, unless a ``SAVE`` wrote it to the server's directory; a cluster node keeps its
        ``nodes.conf`` and rejoins. ``wait`` False: return once the process is launched, without waiting for it
        to answer (a server loading its data answers ``LOADING`` until it is done).
        """
        if self._port is None:
            return self.start()
        self._signal(signal.SIGTERM)
        self._reap(time.monotonic() + DEFAULT_STOP_GRACE)
        if wait:
            self._start(allow_new_port=False)
        else:
            self._launch(self._binary())
        return self

    def kill(self) -> None:
        """SIGKILL immediately and reap; the directory is kept for :meth:`restart`."""
        self._signal(signal.SIGKILL)
        self._reap(time.monotonic() + DEFAULT_STOP_GRACE)

    def _binary(self) -> str:
        return require_executable(server_family().server, find_redis_server)

    def _pick_port(self) -> int:
        return ports.free_port()

    def _command(self, binary: str) -> list[str]:
        return [
            binary,
            *self._leading_args(),
            *self._options(),
            "--repl-diskless-sync-delay",
            "0",
            *self._shutdown_args(binary),
            *self._auth_args(),
            *self.extra_args,
        ]

    def _leading_args(self) -> list[str]:
        """Arguments that must precede the options (a config file path)."""
        return []

    @staticmethod
    def _shutdown_args(binary: str) -> list[str]:
        """Redis >= 7 waits up to 10 s for lagging replicas on SIGTERM; nothing to save here."""
        return ["--shutdown-timeout", "0"] if server_version(binary) >= (7,) else []

    def _port_args(self) -> list[str]:
        if self.tls is None:
            return super()._port_args()
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
        if self.acl_file is not None:
            return ["--aclfile", str(self.acl_file.resolve())]
        return ["--requirepass", self.password] if self.password is not None else []


def userinfo(username: str | None, password: str | None) -> str:
    """The ``user:password@`` part of a URL (quoted), empty without a password."""
    if password is None:
        return ""
    return f"{quote(username or '', safe='')}:{quote(password, safe='')}@"
