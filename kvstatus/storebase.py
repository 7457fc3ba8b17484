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
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, ClassVar, Optional, TypeVar

from redis.cluster import RedisCluster
from redis.exceptions import NoScriptError

from kvstatus.connection import DEFAULT_URL, ConnectionOptions
from kvstatus.keys import DEFAULT_PREFIX, KeySchema
from kvstatus.leases import LeaseCore, validate_lease_ttl
from kvstatus.operations import DEFAULT_TOMBSTONE_TTL_SECONDS, DEFAULT_TTL_SECONDS, Call, StoreCore
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


class StoreBase:
    """Attributes common to :class:`~kvstatus.StatusStore` and :class:`~kvstatus.AsyncStatusStore`."""

    _connect: ClassVar[Callable[..., Any]]
    _keeper_class: ClassVar[Callable[..., Any]]

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
        lease_ttl: Optional[float] = None,
        tombstone_ttl: float = DEFAULT_TOMBSTONE_TTL_SECONDS,
    ) -> None:
        self.client = client
        self.options = options or ConnectionOptions()
        self._failover_delays = failover_delays(client, self.options)
        self._core = StoreCore(
            namespace=namespace,
            participant=participant,
            prefix=prefix,
            ttl=ttl,
            policy=policy,
            cluster=is_cluster_client(client),
            tombstone_ttl=tombstone_ttl,
        )
        self._keeper: Any = None
        if lease_ttl is not None:
            # The record outlives the lease by the room TTL: a dead participant stays "lost" while its entries live.
            lease_ttl = validate_lease_ttl(lease_ttl)
            lease = LeaseCore(self._core.schema, self._core.participant, lease_ttl,
                              keep_ms=self._core.ttl_ms + round(lease_ttl * 1000))
            self._keeper = self._keeper_class(lease, self._send)

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
        lease_ttl: Optional[float] = None,
        tombstone_ttl: float = DEFAULT_TOMBSTONE_TTL_SECONDS,
        **option_overrides: Any,
    ) -> S:
        """Connect to ``url`` (see :mod:`kvstatus.connection`); ``option_overrides`` are ConnectionOptions fields.

        ``lease_ttl`` (seconds, None: no lease) makes the store hold a lease for its participant
        (:mod:`kvstatus.leases`); ``tombstone_ttl`` (seconds, 0: none) is how long ``clear()``'s
        tombstone lives.
        """
        opts = replace(options or ConnectionOptions(), **option_overrides)
        return cls(cls._connect(url, opts), namespace=namespace, participant=participant, prefix=prefix, ttl=ttl,
                   policy=policy, options=opts, lease_ttl=lease_ttl, tombstone_ttl=tombstone_ttl)

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
    def lease(self) -> Optional[LeaseCore]:
        """This store's lease (participant, ttl, incarnation, generation, held, lost), or None without one."""
        return None if self._keeper is None else self._keeper.core

    @property
    def keys(self) -> KeySchema:
        """The :class:`~kvstatus.keys.KeySchema` of this store's namespace."""
        return self._core.schema

    def for_participant(self, participant: str) -> Any:
        """A store with the same client and settings, writing as ``participant`` (with its own lease, if this one has one)."""
        lease_ttl = None if self._keeper is None else self._keeper.core.ttl
        return type(self)(self.client, **{**self._core.settings(), "participant": participant}, options=self.options,
                          lease_ttl=lease_ttl)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(namespace={self.namespace!r}, participant={self.participant!r}, "
            f"prefix={self.prefix!r}, ttl={self.ttl:g}, policy={self.policy.value!r})"
        )


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
