"""Redis URL -> redis-py client, with explicit timeouts and a retry policy.

Supported URLs (passwords are masked in every message kvstatus prints):

- ``redis://[[user]:password@]host[:port][/db]``
- ``rediss://...``  the same over TLS; query options ``ssl_ca_certs``,
  ``ssl_certfile``, ``ssl_keyfile``, ``ssl_check_hostname`` (true/false),
  ``ssl_cert_reqs`` (required/optional/none)
- ``unix://[[user]:password@]/path/to/redis.sock[?db=N]``
- ``redis+cluster://[[user]:password@]host:port[,host:port...]`` a Redis
  Cluster (db 0 only) on ``RedisCluster``; ``rediss+cluster://`` over TLS
- ``redis+sentinel://[[user]:password@]host:port[,host:port...]/service_name[/db]``
  the master of ``service_name`` as reported by the listed Sentinels;
  ``rediss+sentinel://`` over TLS (to the Sentinels and the data nodes). The
  user and password are the data nodes'; the Sentinels' own credentials, if
  any, are the query options ``sentinel_username`` and ``sentinel_password``.

Every form also takes ``socket_timeout`` and ``socket_connect_timeout``
(seconds) as query options. Topologies are chosen by scheme in
:data:`_BUILDERS`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Optional
from urllib.parse import parse_qs, unquote, urlsplit

import redis
import redis.asyncio
import redis.asyncio.retry
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from kvstatus.errors import InvalidURLError
from kvstatus.redact import mask_url
from kvstatus.translate import REDIS_ERRORS, translate_error

DEFAULT_URL = "redis://localhost:6379/0"
TLS_SCHEMES = frozenset({"rediss", "rediss+cluster", "rediss+sentinel"})
SENTINEL_SCHEMES = frozenset({"redis+sentinel", "rediss+sentinel"})
CLUSTER_SCHEMES = frozenset({"redis+cluster", "rediss+cluster"})


@dataclass(frozen=True)
class ConnectionOptions:
    """Timeouts (seconds) and the retry policy of every connection.

    A command that fails with a connection error or a timeout is sent again up
    to ``retries`` times, after ``min(backoff_cap, backoff_base * 2**n)``
    seconds. The defaults ride out about 3-4 s of outage (a restart, a
    failover), then raise :class:`~kvstatus.errors.BackendUnavailableError`.
    On cluster and Sentinel clients the store resends the whole call with
    these waits (redis-py surfaces those failovers at once); size the budget
    above ``cluster-node-timeout`` or Sentinel's ``down-after-milliseconds``.
    A resend cannot corrupt a room: the rule is idempotent, so the same
    update applied twice leaves the same state. It can land after another
    writer's update to the same entry, like any late write (under ``seed`` a
    resent status can move an entry out of a Failed written in between;
    under ``strict`` the resend answers REFUSED_TERMINAL for an update that
    was applied first). ``retries=0`` makes every update at most once.
    """

    socket_timeout: float = 5.0
    socket_connect_timeout: float = 2.0
    retries: int = 5
    backoff_base: float = 0.05
    backoff_cap: float = 2.0
    health_check_interval: int = 30
    client_name: Optional[str] = "kvstatus"
    ssl_ca_certs: Optional[str] = None
    ssl_certfile: Optional[str] = None
    ssl_keyfile: Optional[str] = None
    ssl_check_hostname: Optional[bool] = None
    ssl_cert_reqs: Optional[str] = None

    def retry_delays(self) -> tuple[float, ...]:
        """The wait in seconds before each resend: ``min(backoff_cap, backoff_base * 2**n)``, n = 1..retries."""
        return tuple(min(self.backoff_cap, self.backoff_base * 2**n) for n in range(1, self.retries + 1))

    def retry_budget(self) -> float:
        """Total backoff in seconds before a command gives up (not counting the timeouts themselves)."""
        return sum(self.retry_delays())


@dataclass(frozen=True)
class ParsedURL:
    """A validated Redis URL. ``hosts`` holds (host, port) pairs; ``path`` is the unix socket path."""

    scheme: str
    hosts: tuple[tuple[str, int], ...]
    username: Optional[str]
    password: Optional[str]
    db: int
    path: Optional[str]
    query: dict[str, str]
    service: Optional[str] = None

    def __repr__(self) -> str:
        return f"ParsedURL({self.masked!r})"

    @property
    def tls(self) -> bool:
        return self.scheme in TLS_SCHEMES

    @property
    def masked(self) -> str:
        """The URL's shape without its password."""
        auth = ""
        if self.username or self.password:
            auth = f"{self.username or ''}{':***' if self.password else ''}@"
        where = self.path or ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in self.hosts)
        if self.scheme in CLUSTER_SCHEMES:
            return f"{self.scheme}://{auth}{where}"
        service = f"/{self.service}" if self.service else ""
        return f"{self.scheme}://{auth}{where}{service}/{self.db}"


def _hint(shown: str) -> str:
    """Where credentials are present, the likely cause of a malformed URL."""
    return " (percent-encode any @ / ? # in the user name or password)" if "@" in shown else ""


_BOOL = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}
_QUERY_OPTIONS: dict[str, Callable[[str], Any]] = {
    "socket_timeout": float,
    "socket_connect_timeout": float,
    "ssl_ca_certs": str,
    "ssl_certfile": str,
    "ssl_keyfile": str,
    "ssl_check_hostname": lambda v: _BOOL[v.lower()],
    "ssl_cert_reqs": lambda v: {"required": "required", "optional": "optional", "none": "none"}[v.lower()],
    "db": int,
    "sentinel_username": str,
    "sentinel_password": str,
    # Read by the stores' from_url (kvstatus.nearcache.near_cache_setting), not by the client.
    "near_cache": lambda v: _BOOL[v.lower()],
    "near_cache_size": lambda v: int(v) if v.isdigit() and int(v) > 0 else int("bad"),
}
_SENTINEL_ONLY = ("sentinel_username", "sentinel_password")


def parse_url(url: object) -> ParsedURL:
    """Validate a Redis URL; raise :class:`InvalidURLError` naming what is wrong (password masked)."""
    if not isinstance(url, str) or not url:
        raise InvalidURLError(f"invalid Redis URL {url!r}: expected a string such as {DEFAULT_URL}")
    shown = mask_url(url)
    try:
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in _BUILDERS:
            raise InvalidURLError(
                f"invalid Redis URL {shown}: unsupported scheme {parts.scheme!r}; use one of "
                + ", ".join(f"{s}://" for s in _BUILDERS)
            )
        query: dict[str, str] = {}
        for name, values in parse_qs(parts.query, keep_blank_values=True, strict_parsing=False).items():
            if name not in _QUERY_OPTIONS:
                named = f" {name!r}" if name.isidentifier() else ""  # a split password is no option name
                raise InvalidURLError(f"invalid Redis URL {shown}: unknown option{named}{_hint(shown)}")
            query[name] = values[-1]
        for name, value in query.items():
            try:
                _QUERY_OPTIONS[name](value)
            except (KeyError, ValueError):
                raise InvalidURLError(f"invalid Redis URL {shown}: bad value for option {name!r}") from None
        username = unquote(parts.username) if parts.username else None
        password = unquote(parts.password) if parts.password is not None else None
        if scheme == "unix":
            path = unquote(parts.path)
            if not path:
                raise InvalidURLError(f"invalid Redis URL {shown}: a unix:// URL needs a socket path")
            return ParsedURL(scheme, (), username, password, int(query.pop("db", 0)), path, query)
        hosts = _parse_hosts(parts.netloc.rpartition("@")[2], shown)
        if scheme not in SENTINEL_SCHEMES and any(name in query for name in _SENTINEL_ONLY):
            raise InvalidURLError(f"invalid Redis URL {shown}: sentinel_* options need redis+sentinel://")
        if scheme in SENTINEL_SCHEMES:
            service, db_path = _parse_service(parts.path, shown)
            db = _parse_db(db_path, query.pop("db", None), shown)
            return ParsedURL(scheme, hosts, username, password, db, None, query, service)
        db = _parse_db(parts.path, query.pop("db", None), shown)
        if scheme in CLUSTER_SCHEMES and db != 0:
            raise InvalidURLError(f"invalid Redis URL {shown}: Redis Cluster has only database 0")
        return ParsedURL(scheme, hosts, username, password, db, None, query)
    except InvalidURLError:
        raise
    except ValueError as exc:
        raise InvalidURLError(f"invalid Redis URL {shown}: {mask_url(str(exc))}") from None


def _parse_hosts(netloc: str, shown: str) -> tuple[tuple[str, int], ...]:
    hosts = []
    for item in netloc.split(",") if netloc else ["localhost"]:
        if item.startswith("["):
            host, _, rest = item[1:].partition("]")
            port_text = rest[1:] if rest.startswith(":") else ""
        else:
            host, _, port_text = item.partition(":")
        if not host:
            raise InvalidURLError(f"invalid Redis URL {shown}: missing host{_hint(shown)}")
        if port_text and (not port_text.isdigit() or not 0 < int(port_text) < 65536):
            raise InvalidURLError(f"invalid Redis URL {shown}: bad port (1..65535){_hint(shown)}")
        hosts.append((host, int(port_text) if port_text else 6379))
    return tuple(hosts)


def _parse_service(path: str, shown: str) -> tuple[str, str]:
    """Split ``/service_name[/db]`` of a Sentinel URL."""
    service, _, db = path.strip("/").partition("/")
    service = unquote(service)
    if not service:
        raise InvalidURLError(f"invalid Redis URL {shown}: a Sentinel URL needs /service_name after the hosts")
    if any(char.isspace() or char == "/" for char in service):
        raise InvalidURLError(f"invalid Redis URL {shown}: bad service name")
    return service, db


def _parse_db(path: str, from_query: Optional[str], shown: str) -> int:
    text = from_query if from_query is not None else path.strip("/")
    if not text:
        return 0
    if not text.isdigit():
        raise InvalidURLError(f"invalid Redis URL {shown}: the database is not a number{_hint(shown)}")
    return int(text)


def _common_kwargs(parsed: ParsedURL, options: ConnectionOptions) -> dict[str, Any]:
    query = parsed.query
    kwargs: dict[str, Any] = {
        "username": parsed.username,
        "password": parsed.password,
        "db": parsed.db,
        "socket_timeout": float(query.get("socket_timeout", options.socket_timeout)),
        "socket_connect_timeout": float(query.get("socket_connect_timeout", options.socket_connect_timeout)),
        "health_check_interval": options.health_check_interval,
        "client_name": options.client_name,
    }
    if parsed.tls:
        kwargs.update(_ssl_kwargs(query, options))
    return kwargs


def _ssl_kwargs(query: dict[str, str], options: ConnectionOptions) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"ssl": True}
    for name in ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_check_hostname", "ssl_cert_reqs"):
        value = _QUERY_OPTIONS[name](query[name]) if name in query else getattr(options, name)
        if value is not None:
            kwargs[name] = value
    return kwargs


def _standalone(parsed: ParsedURL, options: ConnectionOptions, asynchronous: bool) -> Any:
    kwargs = _common_kwargs(parsed, options)
    if parsed.path:
        kwargs["unix_socket_path"] = parsed.path
    else:
        kwargs["host"], kwargs["port"] = parsed.hosts[0]
        if len(parsed.hosts) > 1:
            raise InvalidURLError(f"invalid Redis URL {parsed.masked}: {parsed.scheme}:// takes one host")
    client_class = redis.asyncio.Redis if asynchronous else redis.Redis
    return client_class(retry=_retry(options, asynchronous), **kwargs)


def _retryable(error: Exception, is_retryable: Optional[Callable[[Exception], bool]]) -> bool:
    # redis-py's AuthenticationError is a ConnectionError; resending the same password cannot help.
    return not isinstance(error, redis.exceptions.AuthenticationError) and (is_retryable is None or is_retryable(error))


class _Retry(Retry):
    """redis-py's Retry, except that refused credentials fail at once."""

    def call_with_retry(self, do: Any, fail: Any, is_retryable: Any = None, with_failure_count: bool = False) -> Any:
        return super().call_with_retry(do, fail, lambda e: _retryable(e, is_retryable), with_failure_count)


class _AsyncRetry(redis.asyncio.retry.Retry):
    """redis.asyncio's Retry, except that refused credentials fail at once."""

    async def call_with_retry(
        self, do: Any, fail: Any, is_retryable: Any = None, with_failure_count: bool = False
    ) -> Any:
        return await super().call_with_retry(do, fail, lambda e: _retryable(e, is_retryable), with_failure_count)


def _retry(options: ConnectionOptions, asynchronous: bool) -> Any:
    backoff = ExponentialBackoff(cap=options.backoff_cap, base=options.backoff_base)
    retry_class = _AsyncRetry if asynchronous else _Retry
    return retry_class(backoff, options.retries)


def _cluster(parsed: ParsedURL, options: ConnectionOptions, asynchronous: bool) -> Any:
    """A RedisCluster; its retry object also drives topology refreshes after MOVED or a dead node."""
    kwargs = _common_kwargs(parsed, options)
    del kwargs["db"]
    if asynchronous:
        from redis.asyncio.cluster import ClusterNode as AsyncNode
        from redis.asyncio.cluster import RedisCluster as AsyncCluster

        nodes = [AsyncNode(host, port) for host, port in parsed.hosts]
        return AsyncCluster(startup_nodes=nodes, retry=_retry(options, True), **kwargs)
    from redis.cluster import ClusterNode, RedisCluster


    try:  # the sync client reads the slot map right away
        return RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in parsed.hosts],
                            retry=_retry(options, False), **kwargs)
    except REDIS_ERRORS as exc:
        raise translate_error(exc) from exc


def _sentinel(parsed: ParsedURL, options: ConnectionOptions, asynchronous: bool) -> Any:
    """A client of the master of ``parsed.service``; each new connection asks the Sentinels where it is."""
    kwargs = _common_kwargs(parsed, options)
    query = parsed.query
    sentinel_kwargs: dict[str, Any] = {
        "socket_timeout": kwargs["socket_timeout"],
        "socket_connect_timeout": kwargs["socket_connect_timeout"],
        "username": query.get("sentinel_username"),
        "password": query.get("sentinel_password"),
        "retry": _no_retry(asynchronous),
    }
    if parsed.tls:
        sentinel_kwargs.update(_ssl_kwargs(query, options))
    if asynchronous:
        from redis.asyncio.sentinel import Sentinel as SentinelClass
    else:
        from redis.sentinel import Sentinel as SentinelClass
    # No per-command retry on the data connections: redis-py 8.1 resends on the same connection
    # object, which keeps reaching a just-demoted master ("The previous master is now a slave")
    # until its budget is spent. The store resends the whole call instead, through a fresh
    # connection that asks the Sentinels where the master is (see StoreBase / failover_delays).
    sentinel = SentinelClass(
        list(parsed.hosts), sentinel_kwargs=sentinel_kwargs, retry=_no_retry(asynchronous), **kwargs
    )
    return sentinel.master_for(parsed.service)


def _no_retry(asynchronous: bool) -> Any:
    from redis.backoff import NoBackoff

    return (redis.asyncio.retry.Retry if asynchronous else Retry)(NoBackoff(), 0)


_BUILDERS: dict[str, Callable[[ParsedURL, ConnectionOptions, bool], Any]] = {
    "redis": _standalone,
    "rediss": _standalone,
    "unix": _standalone,
    "redis+cluster": _cluster,
    "rediss+cluster": _cluster,
    "redis+sentinel": _sentinel,
    "rediss+sentinel": _sentinel,
}


def connect(url: str, options: Optional[ConnectionOptions] = None, **overrides: Any) -> Any:
    """A redis-py client for ``url``; ``overrides`` replace fields of ``options``. Connects lazily."""
    parsed = parse_url(url)
    opts = replace(options or ConnectionOptions(), **overrides)
    return _BUILDERS[parsed.scheme](parsed, opts, False)


def connect_async(url: str, options: Optional[ConnectionOptions] = None, **overrides: Any) -> Any:
    """Like :func:`connect`, for ``redis.asyncio``."""
    parsed = parse_url(url)
    opts = replace(options or ConnectionOptions(), **overrides)
    return _BUILDERS[parsed.scheme](parsed, opts, True)
