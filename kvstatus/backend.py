"""One redis-py client and what kvstatus keeps beside it, shared by every store built on it (docs/guide.md,
"Connections"; why read-your-writes is per process instead: docs/design.md, "Layout"). Nothing of it hangs on the
redis-py client or lives in a process-wide table keyed by the client: a backend is gone with its stores.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, Callable, Optional, TypeGuard, TypeVar, Union, cast

import redis
import redis.asyncio
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster

from kvstatus.concurrency import AsyncGate, AsyncLock, Gate, Lock
from kvstatus.connection import is_cluster_client
from kvstatus.errors import InvalidArgumentError
from kvstatus.url import ConnectionOptions

if TYPE_CHECKING:
    from kvstatus.waits import WatchHub

Client = Union[redis.Redis, RedisCluster]
"""A blocking redis-py client: a server's (Sentinel's ``master_for`` and fakeredis' ``FakeRedis`` are ones too) or a
cluster's. :data:`AsyncClient` is its asyncio twin (tools/unasync.py maps the names), :data:`RedisClient` either."""
AsyncClient = Union[redis.asyncio.Redis, AsyncRedisCluster]
RedisClient = Union[Client, AsyncClient]


def is_blocking(client: object) -> TypeGuard[Client]:
    """Whether ``client`` is a blocking redis-py client, not a redis.asyncio one (fakeredis' are either kind)."""
    return not isinstance(client, (redis.asyncio.Redis, AsyncRedisCluster))


def client_kind(client: object) -> str:
    """``client``'s class by its full name, for an error that says which client it was."""
    return f"{type(client).__module__}.{type(client).__qualname__}"


G = TypeVar("G", Gate, AsyncGate)
L = TypeVar("L", Lock, AsyncLock)
T = TypeVar("T")


class WatchPool:
    """The watch hubs of one backend, by node name; thread-safe. A forked child starts with none (the parent's
    sockets are left to the parent)."""

    def __init__(self) -> None:
        self._hubs: dict[str, WatchHub] = {}
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._closed = False
        self._opening: Union[Lock, AsyncLock, None] = None

    def opening(self, make: Callable[[], L]) -> L:
        """The lock one opener holds while it connects a hub (``make()``: a new one, made once; every opener of a
        pool passes the same kind, the one of its store)."""
        with self._lock:
            if self._opening is None:
                self._opening = make()
            return cast(L, self._opening)

    def hub(self, node: str) -> Optional[WatchHub]:
        """The live hub of ``node``, if any (a broken one is forgotten)."""
        with self._lock:
            if self._pid != os.getpid():
                self._hubs, self._pid, self._opening = {}, os.getpid(), None
            hub = self._hubs.get(node)
            if hub is not None and hub.broken:
                del self._hubs[node]
                hub = None
            return hub

    def add(self, node: str, hub: WatchHub) -> bool:
        """Keep ``hub`` for ``node``; False (and the caller closes it) once the pool is closed."""
        with self._lock:
            if self._closed or self._pid != os.getpid():
                return False
            self._hubs[node] = hub
            return True

    def close(self) -> None:
        """Close the hubs; their waits wake and see them broken."""
        with self._lock:
            hubs, self._hubs, self._closed = list(self._hubs.values()), {}, True
        for hub in hubs:
            hub.close()


class Backend:
    """A redis-py ``client`` (sync or asyncio; standalone, cluster or Sentinel), the :class:`ConnectionOptions`
    it was built with (None: the defaults), and what the stores on it share: the cluster :meth:`gate`,
    :attr:`watches` (``wait_for``'s watch connections, one per node) and :meth:`shared` objects."""

    def __init__(self, client: RedisClient, options: Optional[ConnectionOptions] = None) -> None:
        if isinstance(client, Backend):
            raise InvalidArgumentError("Backend(client): got a Backend, which a store takes as it is")
        self.client = client
        self.options = options or ConnectionOptions()
        self.cluster = is_cluster_client(client)
        self.watches = WatchPool()
        self._gate: Union[Gate, AsyncGate, None] = None
        self._shared: dict[str, object] = {}
        self._lock = threading.Lock()

    def gate(self, kind: type[G]) -> Optional[G]:
        """The gate of a cluster client (a ``kind`` admitting ``max_connections`` calls, made on first use), shared
        by every store on this backend; None for any other client. redis-py's cluster clients fail a call past a
        node's ``max_connections`` at once; a store call holds at most one connection per node, so the gate keeps
        every node's pool within its size."""
        if not self.cluster:
            return None
        with self._lock:
            if self._gate is None:
                self._gate = kind(self.options.max_connections)
            gate = self._gate
        if not isinstance(gate, kind):  # a sync store on an asyncio client's backend, or the reverse
            raise InvalidArgumentError(f"this backend's gate is a {type(gate).__name__}, not a {kind.__name__}")
        return gate

    def shared(self, name: str, kind: type[T], make: Callable[[], T]) -> T:
        """The object named ``name`` that users of this backend share, ``make()`` on first use (a ``kind``)."""
        with self._lock:
            found = self._shared.get(name)
        if found is None:
            made = make()  # outside the lock: make() may take this backend's gate, under the same lock
            with self._lock:
                found = self._shared.setdefault(name, made)
        if not isinstance(found, kind):
            raise InvalidArgumentError(f"this backend's {name} is a {type(found).__name__}, not a {kind.__name__}")
        return found

    def close(self) -> None:
        """Close the watch connections (the stores close the client and their caches); their waits wake."""
        self.watches.close()

    def __repr__(self) -> str:
        return f"Backend({type(self.client).__name__}, cluster={self.cluster})"
