"""Which server holds a key, how to open connections to it, and whether the topology moved (no caching).

Shared by the near cache (its links, its periodic check) and ``wait_for`` (its watch).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

from redis.cluster import key_slot  # type: ignore[attr-defined]

from kvstatus.clients import is_cluster_client, is_sentinel_client


class SlotMoved(Exception):
    """A cluster node answered MOVED/ASK, or left the cluster; the cache was emptied."""


def _role(reply: Any) -> str:
    """The first field of a ROLE reply: "master", "slave" or "sentinel"."""
    if not isinstance(reply, (list, tuple)) or not reply:
        raise SlotMoved(f"unexpected ROLE reply {reply!r}")
    first = reply[0]
    return first.decode() if isinstance(first, bytes) else str(first)


def slot_fingerprint(reply: Any) -> tuple[Any, ...]:
    """Slot ranges and their primaries from a ``CLUSTER SLOTS`` reply, order-independent."""
    ranges = []
    for item in reply or ():
        start, end, primary = item[0], item[1], item[2]
        host = primary[0].decode() if isinstance(primary[0], bytes) else str(primary[0])
        ranges.append((int(start), int(end), host, int(primary[1])))
    return tuple(sorted(ranges))


class Topology:
    """Which server holds a key, and how to open connections to it (sync or async client)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.cluster = is_cluster_client(client)
        self.asynchronous = type(client).__module__.startswith("redis.asyncio") or type(client).__module__.startswith(
            "fakeredis.aioredis"
        )
        self.sentinel = is_sentinel_client(client)

    def probe_command(self) -> Optional[tuple[str, ...]]:
        """What the periodic topology check sends on a data connection: the slot map of a cluster, the role
        of a Sentinel-managed master, nothing on a plain server (a restart closes the connections)."""
        if self.cluster:
            return ("CLUSTER", "SLOTS")
        if self.sentinel:
            return ("ROLE",)
        return None

    def probe_changed(self, reply: Any, previous: Optional[tuple[Any, ...]]) -> tuple[Optional[str], Any]:
        """(why the cache must be emptied or None, the fingerprint to remember) for a probe reply."""
        if self.cluster:
            fingerprint = slot_fingerprint(reply)
            changed = previous is not None and fingerprint != previous
            return ("cluster slot map changed" if changed else None), fingerprint
        role = _role(reply)
        return (None if role == "master" else f"the server became a {role} (failover)"), None

    def group(self, keys: Sequence[str]) -> dict[str, list[int]]:
        """Indices of ``keys`` by the name of the node that serves them ("" on a single server)."""
        if not self.cluster:
            return {"": list(range(len(keys)))}
        manager = self.client.nodes_manager
        groups: dict[str, list[int]] = {}
        for i, key in enumerate(keys):
            node = manager.get_node_from_slot(key_slot(key.encode()))
            groups.setdefault(node.name, []).append(i)
        return groups

    def node_name(self, key: str) -> str:
        """The name of the node serving ``key`` ("" on a single server)."""
        if not self.cluster:
            return ""
        return str(self.client.nodes_manager.get_node_from_slot(key_slot(key.encode())).name)

    def new_data_connection(self, name: str) -> Any:
        """An unconnected connection to node ``name`` (any name on a single server)."""
        # Built from the pool's settings, not pool.make_connection(): these connections never return to the
        # pool, and make_connection() counts every one against max_connections for good.
        if not self.cluster:
            pool = self.client.connection_pool
            return pool.connection_class(**pool.connection_kwargs)
        node = self.client.get_node(node_name=name)
        if node is None:
            raise SlotMoved(f"node {name} left the cluster")
        if self.asynchronous:
            return node.connection_class(**node.connection_kwargs)
        pool = node.redis_connection.connection_pool
        return pool.connection_class(**pool.connection_kwargs)
