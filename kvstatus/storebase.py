"""What the sync and async stores share around their I/O: settings, topology
detection, and every decision of the send loop (what to resend after NOSCRIPT,
which delays a failover gets, how errors are translated). Each store's loop
performs those decisions with blocking calls or awaits, and nothing else.

Sending a request: one call goes out with ``execute_command``, several in one
non-transactional pipeline. Script calls that meet NOSCRIPT (a restart,
``SCRIPT FLUSH``, a new cluster node) are sent again after ``SCRIPT LOAD``;
if the script is gone again by then, they are sent with their source
(``EVAL``), which cannot meet NOSCRIPT. A cluster or Sentinel client that meets
an unavailable backend resends the whole request after each failover delay.

Every call runs under a deadline (``ConnectionOptions.deadline``, plus
``CHUNK_SECONDS`` per further chunk of a batch): the store sets
:data:`kvstatus.deadline.DEADLINE` for its duration, kvstatus connections
cap every socket wait to the time left, and no resend starts whose backoff
would end past it. Clients whose pools cannot queue for a connection
(redis-py's cluster clients) pass a *gate* first: at most ``max_connections``
calls of one client run at a time, the others wait until their deadline.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import replace
from typing import Any, Callable, ClassVar, Optional, TypeVar

from redis.cluster import RedisCluster
from redis.exceptions import NoScriptError

from kvstatus.connection import DEFAULT_URL, ConnectionOptions
from kvstatus.deadline import ClientPoolExhausted, may_wait
from kvstatus.keys import DEFAULT_PREFIX, KeySchema
from kvstatus.operations import DEFAULT_TTL_SECONDS, Call, StoreCore
from kvstatus.rule import Policy
from kvstatus.scripts import LuaScript
from kvstatus.translate import translate_error

S = TypeVar("S", bound="StoreBase")
T = TypeVar("T")


def is_cluster_client(client: Any) -> bool:
    """True for redis-py cluster clients (sync or async), whose batches are split by slot."""
    from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

    return isinstance(client, (RedisCluster, AsyncRedisCluster))


def is_sentinel_client(client: Any) -> bool:
    """True for a redis-py client made by ``Sentinel.master_for`` (sync or async)."""
    from redis.asyncio.sentinel import SentinelConnectionPool as AsyncSentinelPool
    from redis.sentinel import SentinelConnectionPool

    return isinstance(getattr(client, "connection_pool", None), (SentinelConnectionPool, AsyncSentinelPool))


def failover_delays(client: Any, options: Optional[ConnectionOptions]) -> tuple[float, ...]:
    """Seconds to wait before each resend of a whole store call that met an unavailable backend.

    Only for cluster and Sentinel clients: redis-py surfaces a dead cluster
    node or a demoted Sentinel master at once ("The previous master is now a
    slave"), before the topology has moved. A standalone client already
    retries each command itself (same :class:`ConnectionOptions`), so it gets
    no second layer.
    """
    if not (is_cluster_client(client) or is_sentinel_client(client)):
        return ()
    return (options or ConnectionOptions()).retry_delays()


def gate_for(client: Any, options: ConnectionOptions, asynchronous: bool) -> Optional[Any]:
    """The semaphore that queues a cluster client's calls, shared by every store on ``client``; None elsewhere.

    redis-py's cluster clients have no blocking pool: a call past a node's ``max_connections`` fails at once.
    A store call holds at most one connection per node, so admitting ``max_connections`` calls at a time keeps
    every node's pool within its size.
    """
    if not is_cluster_client(client):
        return None
    made = asyncio.Semaphore(options.max_connections) if asynchronous \
        else threading.BoundedSemaphore(options.max_connections)
    return client.__dict__.setdefault("_kvstatus_gate", (made, options.max_connections))


def pool_exhausted(limit: int, waited: float) -> BaseException:
    """The error of a call that waited at the gate until its deadline (nothing was sent)."""
    return translate_error(ClientPoolExhausted(limit, waited))


class StoreBase:
    """Attributes common to :class:`~kvstatus.StatusStore` and :class:`~kvstatus.AsyncStatusStore`."""

    _connect: ClassVar[Callable[..., Any]]
    _asynchronous: ClassVar[bool]

    def __init__(
        self,
        client: Any,
        *,
        namespace: str,
        participant: Optional[str] = None,
        prefix: str = DEFAULT_PREFIX,
        ttl: float = DEFAULT_TTL_SECONDS,
        policy: str | Policy = Policy.SEED,
        options: Optional[ConnectionOptions] = None,
    ) -> None:
        self.client = client
        self.options = options or ConnectionOptions()
        self._failover_delays = failover_delays(client, self.options)
        self._deadline = self.options.deadline
        self._gate = gate_for(client, self.options, self._asynchronous)
        self._core = StoreCore(
            namespace=namespace,
            participant=participant,
            prefix=prefix,
            ttl=ttl,
            policy=policy,
            cluster=is_cluster_client(client),
        )

    @classmethod
    def from_url(
        cls: type[S],
        url: str = DEFAULT_URL,
        *,
        namespace: str,
        participant: Optional[str] = None,
        prefix: str = DEFAULT_PREFIX,
        ttl: float = DEFAULT_TTL_SECONDS,
        policy: str | Policy = Policy.SEED,
        options: Optional[ConnectionOptions] = None,
        **option_overrides: Any,
    ) -> S:
        """Connect to ``url`` (see :mod:`kvstatus.connection`); ``option_overrides`` are ConnectionOptions fields."""
        opts = replace(options or ConnectionOptions(), **option_overrides)
        return cls(cls._connect(url, opts), namespace=namespace, participant=participant, prefix=prefix, ttl=ttl,
                   policy=policy, options=opts)

    @property
    def namespace(self) -> str:
        return self._core.schema.namespace

    @property
    def prefix(self) -> str:
        return self._core.schema.prefix

    @property
    def participant(self) -> str:
        return self._core.participant

    @property
    def ttl(self) -> float:
        """TTL of every room key, in seconds."""
        return self._core.ttl_ms / 1000

    @property
    def policy(self) -> Policy:
        return self._core.policy

    @property
    def keys(self) -> KeySchema:
        """The :class:`~kvstatus.keys.KeySchema` of this store's namespace."""
        return self._core.schema

    def for_participant(self, participant: str) -> Any:
        """A store with the same client and settings, writing as ``participant``."""
        return type(self)(self.client, **{**self._core.settings(), "participant": participant}, options=self.options)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(namespace={self.namespace!r}, participant={self.participant!r}, "
            f"prefix={self.prefix!r}, ttl={self.ttl:g}, policy={self.policy.value!r})"
        )


def may_resend(delay: float) -> bool:
    """True if a resend after ``delay`` seconds still starts before the running call's deadline."""
    return may_wait(delay)


def noscript_resend(calls: list[Call], replies: list[Any], as_eval: bool) -> tuple[list[int], list[Call]]:
    """The script calls whose reply is NOSCRIPT: their indices, and the calls to send again in their place.

    ``as_eval`` False: the same EVALSHA (after SCRIPT LOAD of :func:`scripts_of` them);
    True: ``EVAL`` with the script's source, which no SCRIPT FLUSH can make fail.
    """
    indices = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError) and calls[i].script]
    return indices, [calls[i].as_eval() if as_eval else calls[i] for i in indices]


def scripts_of(calls: list[Call]) -> list[LuaScript]:
    """The distinct scripts of ``calls``, each to SCRIPT LOAD once."""
    return list({call.script.sha: call.script for call in calls if call.script}.values())


def merge(replies: list[Any], indices: list[int], resent: list[Any]) -> None:
    """Put the replies of resent calls in their places."""
    for i, reply in zip(indices, resent):
        replies[i] = reply


def checked(calls: list[Call], replies: list[Any]) -> list[Any]:
    """``replies`` if none is an error; else raise the first error as its kvstatus error."""
    for call, reply in zip(calls, replies):
        if isinstance(reply, Exception):
            error = translate_error(reply, call)
            if error is reply:
                raise reply
            raise error from reply
    return replies
