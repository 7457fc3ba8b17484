"""What the sync and async stores share around their I/O: settings, topology
detection, and :func:`send_plan`, the way a batch of calls is sent (NOSCRIPT
healing, resends during a failover) written once as a generator of I/O actions
that each store performs with blocking calls or awaits."""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import replace
from typing import Any, Callable, ClassVar, Optional, TypeVar

from redis import exceptions as rx
from redis.cluster import RedisCluster

from kvstatus.connection import DEFAULT_URL, ConnectionOptions
from kvstatus.errors import BackendUnavailableError
from kvstatus.keys import DEFAULT_PREFIX, KeySchema
from kvstatus.nearcache import make_near_cache, near_cache_setting
from kvstatus.operations import DEFAULT_TTL_SECONDS, Call, StoreCore
from kvstatus.rule import Policy
from kvstatus.translate import REDIS_ERRORS, raise_first_error, scripts_to_reload, translate_error, unique_scripts

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
        near_cache: Any = None,
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
        )
        # near_cache: True or NearCacheOptions for a new cache (kvstatus.nearcache), a cache to share, or None.
        self._near = make_near_cache(near_cache, client, self._core.schema, self.options.retry_delays())

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
        near_cache: Any = None,
        **option_overrides: Any,
    ) -> S:
        """Connect to ``url`` (see :mod:`kvstatus.connection`); ``option_overrides`` are ConnectionOptions fields.
        ``near_cache`` (or the URL's ``near_cache=true&near_cache_size=N``) turns the near cache on."""
        opts = replace(options or ConnectionOptions(), **option_overrides)
        cache = near_cache_setting(url, near_cache)
        return cls(cls._connect(url, opts), namespace=namespace, participant=participant, prefix=prefix, ttl=ttl,
                   policy=policy, options=opts, near_cache=cache)

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
        return type(self)(self.client, **{**self._core.settings(), "participant": participant}, options=self.options,
                          near_cache=self._near)

    @property
    def near_cache(self) -> Any:
        """The :mod:`kvstatus.nearcache` cache serving this store's reads, or None."""
        return self._near

    def _wrote(self, rooms: Any) -> None:
        """Drop rooms this store wrote (or may have written) from its near cache: read-your-writes."""
        if self._near is not None:
            try:
                self._near.invalidate(list(rooms))
            except TypeError:
                pass  # not an iterable of rooms: the operation itself raised about it

    def _uncached(self, participant: str) -> Any:
        """A store on the same client reading ``participant``'s entry without the near cache (for wait_for)."""
        return type(self)(self.client, **{**self._core.settings(), "participant": participant}, options=self.options)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(namespace={self.namespace!r}, participant={self.participant!r}, "
            f"prefix={self.prefix!r}, ttl={self.ttl:g}, policy={self.policy.value!r})"
        )


# The I/O actions of a send plan: (kind, argument).
EXECUTE = "execute"  # argument: a Call; reply: its result
PIPELINE = "pipeline"  # argument: list[Call]; reply: their results, errors in place
LOAD = "load"  # argument: a LuaScript to SCRIPT LOAD
SLEEP = "sleep"  # argument: seconds
REFRESH = "refresh"  # re-read a cluster's slot map
Action = tuple[str, Any]
Plan = Generator[Action, Any, T]


def send_plan(calls: list[Call], resend_delays: Sequence[float], cluster: bool) -> Plan[list[Any]]:
    """Send ``calls`` in one round trip and return their replies, raising kvstatus errors.

    A store performs each yielded action and sends back its reply, or throws
    the redis-py error it raised into the plan. Scripts a server does not know
    are loaded and sent again. After an unavailable backend the calls are sent
    again after each of ``resend_delays`` (seconds; cluster and Sentinel only),
    re-reading a cluster's slot map first.
    """
    for delay in resend_delays:
        try:
            return (yield from _attempt(calls))
        except BackendUnavailableError:
            yield SLEEP, delay
            if cluster:
                try:
                    yield REFRESH, None
                except REDIS_ERRORS:
                    pass  # the resend reports the failure if the cluster is still down
    return (yield from _attempt(calls))


def _attempt(calls: list[Call]) -> Plan[list[Any]]:
    """One round trip for ``calls``, loading scripts the server lacks; redis-py errors become kvstatus errors."""
    try:
        if len(calls) > 1:
            return (yield from _pipeline(calls))
        call = calls[0]
        try:
            return [(yield EXECUTE, call)]
        except rx.NoScriptError:
            if call.script is None:
                raise
            yield LOAD, call.script
            return [(yield EXECUTE, call)]
    except REDIS_ERRORS as exc:
        raise translate_error(exc, calls[0] if len(calls) == 1 else None) from exc


def _pipeline(calls: list[Call]) -> Plan[list[Any]]:
    replies = yield PIPELINE, calls
    again = scripts_to_reload(calls, replies)
    if again:
        for script in unique_scripts(calls, again):
            yield LOAD, script
        for i, reply in zip(again, (yield PIPELINE, [calls[i] for i in again])):
            replies[i] = reply
    raise_first_error(calls, replies)
    return replies
