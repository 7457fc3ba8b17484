"""A master, a replica and Sentinels as throwaway ``redis-server`` processes, for failover tests."""

from __future__ import annotations

import time
from collections.abc import Sequence
from types import TracebackType
from urllib.parse import quote

import redis
from redis.sentinel import Sentinel

from kvstatus.demo.server import RedisServerError, stop_servers
from tests.servers.launch import DEFAULT_GROUP_TIMEOUT, info_section, wait_until
from tests.servers.standalone import RedisServer, userinfo
from tests.servers.tls import TLSFiles

__all__ = ["RedisSentinelServers"]


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
        return f"{scheme}://{userinfo(None, self.password)}{hosts}/{quote(self.service_name, safe='')}/0{query}"

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
            self.replica.extra_args = ("--replicaof", self.master.host, str(self.master.port), *self._auth_args())
            self.replica.start()
            wait_until(self._replication_problem, self.startup_timeout, "replica in sync")
            for _ in range(self.sentinel_count):
                sentinel = _SentinelServer(
                    config_lines=self._sentinel_config(), tls=self.tls, password=self.sentinel_password
                )
                self.sentinels.append(sentinel.start())
            wait_until(self._sentinels_problem, self.startup_timeout, "sentinels ready")
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop the sentinels first, then the data nodes (idempotent)."""
        stop_servers(self.sentinels)
        stop_servers(self.nodes)

    def __enter__(self) -> RedisSentinelServers:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
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
        wait_until(self._request_failover, timeout, "SENTINEL FAILOVER accepted")
        new = self.wait_for_new_master(old, max(0.0, deadline - time.monotonic()))
        self._demote(old, new)
        return new

    def wait_for_new_master(self, old: tuple[str, int], timeout: float = DEFAULT_GROUP_TIMEOUT) -> tuple[str, int]:
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
            with self._node_at(address).probe_client() as client:
                role = _text(client.execute_command("ROLE")[0])
            if role != "master":
                return f"{address} still has role {role}"
            new[:] = [address]
            return None

        wait_until(problem, timeout, "sentinel failover")
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
            with node.probe_client() as client:
                client.execute_command("REPLICAOF", new[0], str(new[1]))

    def _master_address_from(self, sentinel: RedisServer) -> tuple[str, int]:
        with sentinel.probe_client() as client:
            reply = client.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service_name)
        if not reply:
            raise RedisServerError(f"sentinel {sentinel.port} does not know {self.service_name}")
        return (_text(reply[0]), int(reply[1]))

    def _replication_problem(self) -> str | None:
        with self.replica.probe_client() as client:
            info = info_section(client, "replication")
        if info.get("master_link_status") != "up":
            return f"replica link is {info.get('master_link_status')}"
        return None

    def _request_failover(self) -> str | None:
        running = [s for s in self.sentinels if s.is_running]
        if not running:
            return "no sentinel is running"
        with running[0].probe_client() as client:
            try:
                client.execute_command("SENTINEL", "FAILOVER", self.service_name)
            except redis.ResponseError as exc:
                return str(exc)
        return None

    def _sentinels_problem(self) -> str | None:
        for sentinel in self.sentinels:
            with sentinel.probe_client() as client:
                master = client.sentinel_master(self.service_name)
                replicas = client.sentinel_slaves(self.service_name)
            if not master["is_master"] or master["is_sdown"] or master["is_odown"]:
                return f"sentinel {sentinel.port} sees master flags {master['flags']}"
            if master["num-other-sentinels"] != self.sentinel_count - 1:
                return f"sentinel {sentinel.port} knows {master['num-other-sentinels']} other sentinels"
            healthy = {int(r["port"]) for r in replicas if not (r["is_sdown"] or r["is_disconnected"])}
            if self.replica.port not in healthy:
                return f"sentinel {sentinel.port} does not see the replica yet"
        return None


def _conf_quote(value: str) -> str:
    """Quote a value for a redis config file line."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
