"""A real Redis Cluster of throwaway ``redis-server`` processes on loopback ports, for tests and benchmarks."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType

import redis
from redis.cluster import ClusterNode, RedisCluster

from kvstatus.demo.server import RedisServerError, stop_servers, tail
from tests.servers.launch import (
    CLUSTER_SLOTS,
    DEFAULT_GROUP_TIMEOUT,
    find_redis_cli,
    find_redis_server,
    info_section,
    parse_info,
    require_executable,
    server_family,
    wait_until,
)
from tests.servers.standalone import RedisServer, userinfo
from tests.servers.tls import TLSFiles

__all__ = ["RedisClusterServers"]


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
        views.append(
            _ClusterNodeView(
                node_id=parts[0],
                port=port,
                flags=frozenset(parts[2].split(",")),
                master_id=parts[3],
                connected=parts[7] == "connected",
                slots=tuple(sorted(slots)),
            )
        )
    return views


def _slot_map(views: Sequence[_ClusterNodeView]) -> tuple[tuple[int, int, int], ...]:
    """Sorted (first slot, last slot, owner port) ranges claimed by masters."""
    return tuple(sorted((start, end, view.port) for view in views if view.is_master for start, end in view.slots))


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
        return f"{scheme}://{userinfo(None, self.password)}{hosts}"

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
        family = server_family()
        cli = require_executable(" or ".join(family.clis), find_redis_cli)
        require_executable(family.server, find_redis_server)
        self.nodes = []
        try:
            for _ in range(self.master_count * (self.replicas_per_master + 1)):
                self.nodes.append(
                    RedisServer(password=self.password, tls=self.tls, extra_args=self._node_args()).start()
                )
            self._create(cli)
            self.wait_healthy(self.startup_timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every node (idempotent)."""
        stop_servers(self.nodes)

    def __enter__(self) -> RedisClusterServers:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def masters(self) -> list[RedisServer]:
        """Running nodes that currently serve slots, per CLUSTER NODES of a live node."""
        return [
            self._node_by_port(v.port)
            for v in self._live_view()
            if v.is_master and v.slots and not v.failing and self._is_up(v.port)
        ]

    def replicas(self) -> list[RedisServer]:
        """Running nodes that are currently replicas, per CLUSTER NODES of a live node."""
        return [
            self._node_by_port(v.port)
            for v in self._live_view()
            if "slave" in v.flags and not v.failing and self._is_up(v.port)
        ]

    def wait_healthy(self, timeout: float = DEFAULT_GROUP_TIMEOUT) -> None:
        """Wait up to ``timeout`` seconds until every running node reports a healthy cluster.

        Healthy: cluster_state:ok everywhere, all nodes show the same slot map,
        all 16384 slots are served by running masters, running nodes see each
        other as connected, and every running replica's link is up.
        """
        wait_until(self._health_problem, timeout, "healthy cluster")

    # -- internals

    def _node_args(self) -> list[str]:
        args = [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            str(self.node_timeout_ms),
        ]
        if self.password is not None:
            args += ["--masterauth", self.password]
        if self.tls is not None:
            args += ["--tls-cluster", "yes"]
        return args + list(self.extra_args)

    def _create(self, cli: str) -> None:
        command = [
            cli,
            "--cluster",
            "create",
            *(f"{host}:{port}" for host, port in self.startup_nodes),
            "--cluster-replicas",
            str(self.replicas_per_master),
            "--cluster-yes",
        ]
        if self.tls is not None:
            command += ["--tls", "--cacert", str(self.tls.ca)]
        env = dict(os.environ)
        if self.password is not None:
            env["REDISCLI_AUTH"] = self.password
        try:
            result = subprocess.run(
                command, capture_output=True, text=True, env=env, timeout=self.startup_timeout, check=False
            )
        except subprocess.TimeoutExpired as exc:
            raise RedisServerError(
                f"redis-cli --cluster create did not finish within {self.startup_timeout:.1f} s"
            ) from exc
        if result.returncode != 0 or "[ERR]" in result.stdout:
            raise RedisServerError(
                f"redis-cli --cluster create failed (exit {result.returncode}):\n{tail(result.stdout + result.stderr)}"
            )

    def _is_up(self, port: int) -> bool:
        return any(node.port == port and node.is_running for node in self.nodes)

    def _node_by_port(self, port: int) -> RedisServer:
        for node in self.nodes:
            if node.port == port:
                return node
        raise RedisServerError(f"no node of this cluster listens on port {port}")

    def _cluster_nodes(self, node: RedisServer) -> list[_ClusterNodeView]:
        with node.probe_client() as client:
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

    def _node_problem(
        self, node: RedisServer, live_ports: set[int]
    ) -> tuple[str | None, tuple[tuple[int, int, int], ...]]:
        with node.probe_client() as client:
            info = parse_info(client.execute_command("CLUSTER", "INFO").decode())
            views = _parse_cluster_nodes(client.execute_command("CLUSTER", "NODES").decode())
            replication = info_section(client, "replication")
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
