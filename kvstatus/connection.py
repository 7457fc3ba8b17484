"""How kvstatus reaches Redis: a URL (grammar: :mod:`kvstatus.url`) made a redis-py client by scheme
(:data:`_BUILDERS`), what kind of client a store was given, and which server holds a key (the near cache's links
and ``wait_for``'s watch). What a user sees of it: docs/guide.md ("Connections", "Topologies and URLs")."""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Sequence
from typing import Any, Callable, Optional, Union

import redis
import redis.asyncio
import redis.asyncio.connection
import redis.asyncio.retry
import redis.asyncio.sentinel
import redis.sentinel
from redis.asyncio.cluster import ClusterNode as AsyncClusterNode
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.cluster import ClusterNode, RedisCluster, key_slot  # type: ignore[attr-defined]
from redis.retry import Retry

from kvstatus.deadline import (
    AsyncDeadlineConnection,
    AsyncDeadlineRetry,
    AsyncWaitingConnectionPool,
    AsyncWaitingPool,
    DeadlineConnection,
    DeadlineRetry,
    WaitingConnectionPool,
    WaitingPool,
)
from kvstatus.errors import InvalidURLError
from kvstatus.translate import (
    NOT_SENT,
    REDIS_ERRORS,
    AsyncNamedServerConnection,
    NamedServerConnection,
    connection_refused,
    translate_error,
    unresolved_host,
)
from kvstatus.url import (
    BACKOFF_BASE_SECONDS,
    BACKOFF_CAP_SECONDS,
    CLIENT_NAME,
    CLUSTER_SCHEMES,
    HEALTH_CHECK_SECONDS,
    SCHEMES,
    SENTINEL_SCHEMES,
    ConnectionOptions,
    ParsedURL,
    _options,
    parse_url,
)


def _common_kwargs(parsed: ParsedURL, options: ConnectionOptions) -> dict[str, Any]:
    """redis-py keyword arguments; ``options`` already hold the URL's query options."""
    kwargs: dict[str, Any] = {
        "username": parsed.username,
        "password": parsed.password,
        "db": parsed.db,
        "socket_timeout": options.socket_timeout,
        "socket_connect_timeout": options.socket_connect_timeout,
        "health_check_interval": HEALTH_CHECK_SECONDS,
        "client_name": CLIENT_NAME,
    }
    if parsed.tls:
        kwargs.update(ssl=True, **options.tls_options())
    return kwargs


def _standalone(parsed: ParsedURL, options: ConnectionOptions, asynchronous: bool) -> object:
    kwargs = _common_kwargs(parsed, options)
    if parsed.path:
        kwargs["unix_socket_path"] = parsed.path
    else:
        kwargs["host"], kwargs["port"] = parsed.hosts[0]
        if len(parsed.hosts) > 1:
            raise InvalidURLError(f"invalid Redis URL {parsed.masked}: {parsed.scheme}:// takes one host")
    client_class = redis.asyncio.Redis if asynchronous else redis.Redis
    client = client_class(retry=_retry(options, asynchronous, refused_is_final=True), **kwargs)
    # The same connections on a pool that queues for a free one (redis-py's default pool fails at once).
    made = client.connection_pool
    pool_class = AsyncWaitingConnectionPool if asynchronous else WaitingConnectionPool
    client.connection_pool = pool_class(
        connection_class=connection_class(made.connection_class, parsed.tls),
        max_connections=options.max_connections,
        timeout=options.deadline,
        **made.connection_kwargs,
    )
    return client


TLS_HANDSHAKE_FAILED = "TLS handshake failed: is the server TLS?"


class TLSHandshakeError(redis.exceptions.ConnectionError):
    """A TLS connection met a server that does not speak TLS, or a certificate that failed; never resent."""


def _speaks_plain_redis(host: str, port: int, timeout: Optional[float]) -> bool:
    """True if ``host:port`` answers a plain-text ``PING`` like Redis does (``+PONG`` or an ``-ERR``)."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as probe:
            probe.sendall(b"PING\r\n")
            return probe.recv(16)[:1] in (b"+", b"-")
    except OSError:
        return False


def _handshake_error(exc: BaseException, host: str, port: int, timeout: Optional[float]) -> Optional[TLSHandshakeError]:
    """The error to raise for a failed TLS handshake, or None to let ``exc`` through (a hung server is retried)."""
    where = f"{host}:{port}"
    if isinstance(exc, ssl.SSLCertVerificationError):
        return TLSHandshakeError(
            f"TLS certificate verification failed for {where}: {exc.verify_message} "
            "(check ssl_ca_certs and ssl_check_hostname)"
        )
    if _speaks_plain_redis(host, port, timeout):
        return TLSHandshakeError(
            f"{TLS_HANDSHAKE_FAILED} {where} answers in plain text; use redis:// for it, or enable TLS on the server"
        )
    if isinstance(exc, ssl.SSLError):
        return TLSHandshakeError(f"{TLS_HANDSHAKE_FAILED} {where} did not complete a TLS handshake ({exc})")
    return None


class _TLSHandshake:
    """Mixin for redis-py's sync TLS connections: the handshake runs under ``socket_connect_timeout``."""

    host: str  # the connection's own (declared here, set by redis-py)
    port: int
    socket_timeout: Optional[float]
    socket_connect_timeout: Optional[float]

    def _wrap_socket_with_ssl(self, sock: socket.socket) -> object:
        sock.settimeout(self.socket_connect_timeout)
        try:
            tls = super()._wrap_socket_with_ssl(sock)  # type: ignore[misc]
        except (TimeoutError, ssl.SSLError) as exc:
            error = _handshake_error(exc, self.host, self.port, self.socket_connect_timeout)
            if error is None:
                raise
            raise error from None
        tls.settimeout(self.socket_timeout)
        return tls


class _AsyncTLSHandshake:
    """Mixin for redis.asyncio's TLS connections (the handshake already runs under the connect timeout)."""

    host: str  # the connection's own (declared here, set by redis.asyncio)
    port: int
    socket_connect_timeout: Optional[float]

    async def _connect(self) -> None:
        try:
            await super()._connect()  # type: ignore[misc]
        except (ssl.SSLError, asyncio.TimeoutError) as exc:
            error = await asyncio.to_thread(_handshake_error, exc, self.host, self.port, self.socket_connect_timeout)
            if error is None:
                raise
            raise error from None


ASYNC_CLIENTS = (redis.asyncio.Redis, AsyncRedisCluster)  # fakeredis' async client is a redis.asyncio.Redis


_CLASSES: dict[tuple[type, bool], type] = {}


def connection_class(base: type, tls: bool) -> type:
    """``base`` (a redis-py connection class) with the deadline of store calls, the server named in errors and
    the TLS handshake checks (one class per base, made once)."""
    if (base, tls) not in _CLASSES:
        asynchronous = issubclass(base, redis.asyncio.connection.AbstractConnection)
        named = AsyncNamedServerConnection if asynchronous else NamedServerConnection
        mixins: tuple[type, ...] = (named, AsyncDeadlineConnection if asynchronous else DeadlineConnection)
        if tls:
            mixins += (_AsyncTLSHandshake if asynchronous else _TLSHandshake,)
        _CLASSES[(base, tls)] = type(f"KVStatus{base.__name__}", (*mixins, base), {})
    return _CLASSES[(base, tls)]


def _is_final(error: Exception, failures: int = 0) -> bool:
    """Errors never resent: refused credentials, a failed TLS handshake (or, from redis.asyncio, their cause)."""
    final = (redis.exceptions.AuthenticationError, TLSHandshakeError)
    return isinstance(error, final) or isinstance(error.__cause__, final)


def _is_final_standalone(error: Exception, failures: int) -> bool:
    """:func:`_is_final`, and a refused connection (one server: nobody else could answer). The error records in
    ``NOT_SENT`` whether no attempt reached Redis (``failures`` at any level of redis-py's nested retries)."""
    if connection_refused(error) or unresolved_host(error) is not None:  # nobody there, or no such host name
        setattr(error, NOT_SENT, getattr(error, NOT_SENT, True) and failures == 0)
        return True
    return _is_final(error)


def _retry(options: ConnectionOptions, asynchronous: bool, refused_is_final: bool = False) -> Any:
    """The per-command retry policy; ``refused_is_final`` for a standalone server (a cluster or a failover may
    move the node that refused)."""
    backoff = ExponentialBackoff(cap=BACKOFF_CAP_SECONDS, base=BACKOFF_BASE_SECONDS)
    retry_class = AsyncDeadlineRetry if asynchronous else DeadlineRetry
    return retry_class(backoff, options.retries, _is_final_standalone if refused_is_final else _is_final)


def _cluster(parsed: ParsedURL, options: ConnectionOptions, asynchronous: bool) -> object:
    """A RedisCluster; its retry object also drives topology refreshes after MOVED or a dead node. It has no
    blocking pool: the store queues its calls instead (:meth:`kvstatus.backend.Backend.gate`)."""
    kwargs = _common_kwargs(parsed, options)
    del kwargs["db"]
    kwargs["max_connections"] = options.max_connections
    if asynchronous:
        nodes = [AsyncClusterNode(host, port) for host, port in parsed.hosts]
        cluster = AsyncRedisCluster(startup_nodes=nodes, retry=_retry(options, True), **kwargs)
        # Nodes are built from these kwargs when the client first connects.
        manager = cluster.nodes_manager
        default = redis.asyncio.SSLConnection if parsed.tls else redis.asyncio.Connection
        made = connection_class(manager.connection_kwargs.get("connection_class", default), parsed.tls)
        manager.connection_kwargs["connection_class"] = made
        for node in manager.startup_nodes.values():
            node.connection_class = made
        return cluster
    try:  # the sync client reads the slot map right away
        sync_cluster = RedisCluster(
            startup_nodes=[ClusterNode(h, p) for h, p in parsed.hosts],  # type: ignore[no-untyped-call]
            retry=_retry(options, False),
            **kwargs,
        )
    except REDIS_ERRORS as exc:
        raise translate_error(exc) from exc
    _deadline_nodes(sync_cluster, parsed.tls)
    return sync_cluster


def _deadline_nodes(cluster: Any, tls: bool) -> None:
    """Give every node client of a sync RedisCluster, present and future, kvstatus connections (its ``Redis`` takes
    no connection class: set on each node's pool as the node is made; the first slot map's nodes redone here)."""
    manager = cluster.nodes_manager
    make_node = manager.create_redis_node

    def create_redis_node(*args: object, **kwargs: object) -> object:
        node = make_node(*args, **kwargs)
        pool = node.connection_pool
        pool.connection_class = connection_class(pool.connection_class, tls)
        return node

    manager.create_redis_node = create_redis_node
    for node in manager.nodes_cache.values():
        if node.redis_connection is not None:
            pool = node.redis_connection.connection_pool
            pool.disconnect()
            pool.connection_class = connection_class(pool.connection_class, tls)
            pool.reset()


def _sentinel(parsed: ParsedURL, options: ConnectionOptions, asynchronous: bool) -> object:
    """A client of the master of ``parsed.service``; each new connection asks the Sentinels where it is."""
    kwargs = _common_kwargs(parsed, options)
    sentinel_kwargs: dict[str, object] = {
        "socket_timeout": kwargs["socket_timeout"],
        "socket_connect_timeout": kwargs["socket_connect_timeout"],
        "username": parsed.query.get("sentinel_username"),
        "password": parsed.query.get("sentinel_password"),
        "retry": _no_retry(asynchronous),
    }
    sentinel_module: Any = redis.asyncio.sentinel if asynchronous else redis.sentinel
    if parsed.tls:
        sentinel_kwargs.update(ssl=True, **options.tls_options())
    kwargs["connection_class"] = connection_class(
        sentinel_module.SentinelManagedSSLConnection if parsed.tls else sentinel_module.SentinelManagedConnection,
        parsed.tls,
    )
    # No per-command retry on the data connections: redis-py 8.1's keeps reaching a just-demoted master. The send
    # path resends the whole call on a fresh connection (failover_delays below; docs/operations.md, "Failover").
    sentinel = sentinel_module.Sentinel(
        list(parsed.hosts), sentinel_kwargs=sentinel_kwargs, retry=_no_retry(asynchronous), **kwargs
    )
    for client in sentinel.sentinels:  # asking the Sentinels where the master is counts against the deadline too
        client.connection_pool.connection_class = connection_class(client.connection_pool.connection_class, parsed.tls)
    return sentinel.master_for(
        parsed.service,
        connection_pool_class=_AsyncSentinelPool if asynchronous else _SentinelPool,
        max_connections=options.max_connections,
        timeout=options.deadline,
    )


def _no_retry(asynchronous: bool) -> Union[Retry, redis.asyncio.retry.Retry]:
    return (redis.asyncio.retry.Retry if asynchronous else Retry)(NoBackoff(), 0)


class _SentinelPool(WaitingPool, redis.sentinel.SentinelConnectionPool):
    """redis-py's SentinelConnectionPool that queues for a free connection (:class:`~kvstatus.deadline.WaitingPool`)."""


class _AsyncSentinelPool(AsyncWaitingPool, redis.asyncio.sentinel.SentinelConnectionPool):
    """:class:`_SentinelPool` for redis.asyncio."""


_BUILDERS: dict[str, Callable[[ParsedURL, ConnectionOptions, bool], object]] = {  # scheme -> a redis-py client
    scheme: _cluster if scheme in CLUSTER_SCHEMES else _sentinel if scheme in SENTINEL_SCHEMES else _standalone
    for scheme in SCHEMES
}


def connect(url: Union[str, ParsedURL], options: Optional[ConnectionOptions] = None, **overrides: Any) -> Any:
    """A redis-py client for ``url``; ``overrides`` replace fields of ``options``. Connects lazily."""
    parsed = parse_url(url)
    return _BUILDERS[parsed.scheme](parsed, _options(parsed, options, overrides), False)


def connect_async(url: Union[str, ParsedURL], options: Optional[ConnectionOptions] = None, **overrides: Any) -> Any:
    """Like :func:`connect`, for ``redis.asyncio``."""
    parsed = parse_url(url)
    return _BUILDERS[parsed.scheme](parsed, _options(parsed, options, overrides), True)


def is_cluster_client(client: object) -> bool:
    """True for redis-py cluster clients (sync or async), whose batches are split by slot."""
    return isinstance(client, (RedisCluster, AsyncRedisCluster))


def is_sentinel_client(client: object) -> bool:
    """True for a redis-py client made by ``Sentinel.master_for`` (sync or async)."""
    pools = (redis.sentinel.SentinelConnectionPool, redis.asyncio.sentinel.SentinelConnectionPool)
    return isinstance(getattr(client, "connection_pool", None), pools)


def failover_delays(client: object, options: Optional[ConnectionOptions]) -> tuple[float, ...]:
    """Seconds to wait before each resend of a whole store call that met an unavailable backend: cluster and
    Sentinel clients only (a standalone client retries each command itself)."""
    if not (is_cluster_client(client) or is_sentinel_client(client)):
        return ()
    return (options or ConnectionOptions()).retry_delays()


class SlotMoved(Exception):
    """A cluster node answered MOVED/ASK, or left the cluster; the cache was emptied."""


SlotFingerprint = tuple[tuple[int, int, str, int], ...]
"""(start, end, primary host, primary port) of each slot range of a ``CLUSTER SLOTS`` reply, sorted."""


def slot_fingerprint(reply: Any) -> SlotFingerprint:
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
        self.asynchronous = isinstance(client, ASYNC_CLIENTS)
        self.sentinel = is_sentinel_client(client)

    def probe_command(self) -> Optional[tuple[str, ...]]:
        """What the periodic topology check sends on a data connection: the slot map of a cluster, the role
        of a Sentinel-managed master, nothing on a plain server (a restart closes the connections)."""
        if self.cluster:
            return ("CLUSTER", "SLOTS")
        return ("ROLE",) if self.sentinel else None

    def probe_changed(
        self, reply: object, previous: Optional[SlotFingerprint]
    ) -> tuple[Optional[str], Optional[SlotFingerprint]]:
        """(why the cache must be emptied or None, the fingerprint to remember) for a probe reply."""
        if self.cluster:
            fingerprint = slot_fingerprint(reply)
            changed = previous is not None and fingerprint != previous
            return ("cluster slot map changed" if changed else None), fingerprint
        if not isinstance(reply, (list, tuple)) or not reply:
            raise SlotMoved(f"unexpected ROLE reply {reply!r}")
        role = reply[0].decode() if isinstance(reply[0], bytes) else str(reply[0])  # master, slave or sentinel
        return (None if role == "master" else f"the server became a {role} (failover)"), None

    def group(self, keys: Sequence[str]) -> dict[str, list[int]]:
        """Indices of ``keys`` by the name of the node that serves them ("" on a single server)."""
        if not self.cluster:
            return {"": list(range(len(keys)))}
        groups: dict[str, list[int]] = {}
        for i, key in enumerate(keys):
            groups.setdefault(self.node_name(key), []).append(i)
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
            source = self.client.connection_pool
        else:
            source = self.client.get_node(node_name=name)
            if source is None:
                raise SlotMoved(f"node {name} left the cluster")
            if not self.asynchronous:  # a sync node's settings are its pool's
                source = source.redis_connection.connection_pool
        return source.connection_class(**source.connection_kwargs)
