"""One redis-py client and what kvstatus keeps beside it, shared by every store built on it (docs/guide.md,
"Connections"; why read-your-writes is per process instead: docs/design.md, "Layout"). Nothing of it hangs on the
redis-py client or lives in a process-wide table keyed by the client: a backend is gone with its stores.
"""

from __future__ import annotations

import threading
from typing import Callable, Optional, TypeGuard, TypeVar, Union

import redis
import redis.asyncio
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster

from kvstatus.concurrency import AsyncGate, Gate
from kvstatus.connection import ASYNC_CLIENTS, is_cluster_client
from kvstatus.errors import InvalidArgumentError
from kvstatus.url import ConnectionOptions

Client = Union[redis.Redis, RedisCluster]
"""A blocking redis-py client: a server's (Sentinel's ``master_for`` and fakeredis' ``FakeRedis`` are ones too) or a
cluster's. :data:`AsyncClient` is its asyncio twin (tools/unasync.py maps the names), :data:`RedisClient` either."""
AsyncClient = Union[redis.asyncio.Redis, AsyncRedisCluster]
RedisClient = Union[Client, AsyncClient]


def is_blocking(client: object) -> TypeGuard[Client]:
    """Whether ``client`` is a blocking redis-py client, not a redis.asyncio one (fakeredis' are either kind)."""
    return not isinstance(client, ASYNC_CLIENTS)


def can_track(client: object) -> bool:
    """Whether ``client`` may reach a server that has CLIENT TRACKING: any but fakeredis'."""
    return not type(client).__module__.startswith("fakeredis")


def client_kind(client: object) -> str:
    """``client``'s class by its full name, for an error that says which client it was."""
    return f"{type(client).__module__}.{type(client).__qualname__}"


G = TypeVar("G", Gate, AsyncGate)
T = TypeVar("T")


class Backend:
    """A redis-py ``client`` (sync or asyncio; standalone, cluster or Sentinel), the :class:`ConnectionOptions`
    it was built with (None: the defaults), and what the stores on it share: the cluster :meth:`gate` and
    :meth:`shared` objects (the near cache ``wait_for`` watches on, the admin tools' sender)."""

    def __init__(self, client: RedisClient, options: Optional[ConnectionOptions] = None) -> None:
        if isinstance(client, Backend):
            raise InvalidArgumentError("Backend(client): got a Backend, which a store takes as it is")
        self.client = client
        self.options = options or ConnectionOptions()
        self.cluster = is_cluster_client(client)
        self._gate: Union[Gate, AsyncGate, None] = None
        self._shared: dict[str, object] = {}
        self._closers: list[Callable[[], None]] = []
        self._lock = threading.Lock()

    def gate(self, kind: type[G]) -> Optional[G]:
        """The gate of a cluster client (a ``kind`` admitting ``max_connections`` calls, made on first use), shared
        by every store on this backend; None for any other client. A store call holds at most one connection per
        node, so the gate keeps every node's pool within its size (redis-py fails a call past it at once)."""
        if not self.cluster:
            return None
        with self._lock:
            if self._gate is None:
                self._gate = kind(self.options.max_connections)
            gate = self._gate
        if not isinstance(gate, kind):  # a sync store on an asyncio client's backend, or the reverse
            raise InvalidArgumentError(f"this backend's gate is a {type(gate).__name__}, not a {kind.__name__}")
        return gate

    def shared(self, name: str, kind: type[T], make: Callable[[], T], close: Optional[Callable[[T], None]] = None) -> T:
        """The ``kind`` named ``name`` that users of this backend share, ``make()`` on first use; ``close(it)`` runs
        when the backend closes."""
        with self._lock:
            found = self._shared.get(name)
        if found is None:
            made = make()  # outside the lock: make() may take this backend's gate, under the same lock
            with self._lock:
                found = self._shared.setdefault(name, made)
                if found is made and close is not None:
                    self._closers.append(lambda: close(made))
            if found is not made and close is not None:
                close(made)
        if not isinstance(found, kind):
            raise InvalidArgumentError(f"this backend's {name} is a {type(found).__name__}, not a {kind.__name__}")
        return found

    def close(self) -> None:
        """Close what the stores share here (the near cache of their waits: the waits wake); the stores close
        the client and their own caches."""
        with self._lock:
            closers, self._closers, self._shared = self._closers, [], {}
        for close in closers:
            close()

    def __repr__(self) -> str:
        return f"Backend({type(self.client).__name__}, cluster={self.cluster})"
