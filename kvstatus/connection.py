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

Every field of :class:`ConnectionOptions` is also a query option of every
form (``?socket_timeout=1&retries=0``), parsed and checked by the same code;
an option in the URL wins over the same keyword argument. The ``ssl_*``
options need a TLS scheme: on ``redis://`` they would be ignored, so they are
refused. A URL holds no fragment: a ``#`` means an unencoded ``#`` in a
password. Topologies are chosen by scheme in :data:`_BUILDERS`.

A ``rediss://`` URL pointing at a plain-text server fails within
``socket_connect_timeout`` with "TLS handshake failed: is the server TLS?",
and is not retried: the handshake runs under the connect timeout, and a
server that answers a plain ``PING`` is known not to speak TLS.
"""

from __future__ import annotations

import asyncio
import functools
import math
import socket
import ssl
import types
import typing
from dataclasses import dataclass, fields, replace
from typing import Any, Callable, Optional, Union
from urllib.parse import parse_qs, unquote, urlsplit

import redis
import redis.asyncio
import redis.asyncio.retry
import redis.asyncio.sentinel
import redis.sentinel
from redis.backoff import ExponentialBackoff
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

from kvstatus.errors import InvalidArgumentError, InvalidURLError
from kvstatus.redact import mask_url
from kvstatus.translate import NOT_SENT, REDIS_ERRORS, connection_refused, translate_error

DEFAULT_URL = "redis://localhost:6379/0"
TLS_SCHEMES = frozenset({"rediss", "rediss+cluster", "rediss+sentinel"})
SENTINEL_SCHEMES = frozenset({"redis+sentinel", "rediss+sentinel"})
CLUSTER_SCHEMES = frozenset({"redis+cluster", "rediss+cluster"})
MAX_SECONDS = 86_400
"""Most seconds of a timeout, the deadline or the health check interval (one day)."""
MAX_BACKOFF_SECONDS = 3_600
MAX_RETRIES = 100
MAX_CONNECTIONS = 1_000_000
MAX_DB = 2**31 - 1
"""Redis' own limit on its ``databases`` setting (a C int)."""


@dataclass(frozen=True)
class ConnectionOptions:
    """Timeouts (seconds), the retry policy, the per-call deadline and the pool size of every client.

    ``deadline`` bounds every store call as a whole: the wait for a free
    connection, every send and reply, and every resend with its backoff. No
    socket wait outlasts the time left, and no resend starts whose backoff
    would end past the deadline, so a call returns (or raises) within
    ``deadline`` seconds plus ``deadline.TOLERANCE`` (0.1 s) and Python's own
    overhead, even against a hung server. A batch of more than ``operations.CHUNK_ROOMS`` rooms gets
    ``operations.CHUNK_SECONDS`` more per further chunk.

    Within the deadline, a command that fails with a connection error or a
    timeout is sent again up to ``retries`` times, after
    ``min(backoff_cap, backoff_base * 2**n)`` seconds. The defaults ride out
    about 3-4 s of outage (a restart, a failover), then raise
    :class:`~kvstatus.errors.BackendUnavailableError`, which means "unknown
    whether applied": the last attempt may have been executed by Redis. A
    refused connection to a standalone server (nothing listens: Redis is down or
    the address is wrong) is not retried: the call fails at once with
    :class:`~kvstatus.errors.BackendRefusedError`, which says whether nothing
    was sent. On
    cluster and Sentinel clients the store resends the whole call with these
    waits (redis-py surfaces those failovers at once); size ``deadline`` and
    the budget above ``cluster-node-timeout`` or Sentinel's
    ``down-after-milliseconds``. A resend cannot corrupt a room: the rule is
    idempotent, so the same update applied twice leaves the same state. It
    can land after another writer's update to the same entry, like any late
    write (under ``seed`` a resent status can move an entry out of a Failed
    written in between; under ``strict`` the resend answers REFUSED_TERMINAL
    for an update that was applied first). ``retries=0`` makes every update
    at most once.

    ``max_connections`` caps the connections of one client (per node on a
    cluster). A call that finds them all busy queues for one until its
    deadline, then raises :class:`~kvstatus.errors.PoolExhaustedError`
    ("client connection pool exhausted (max_connections=N)"; nothing was sent).
    """

    socket_timeout: float = 5.0
    socket_connect_timeout: float = 2.0
    deadline: float = 5.0
    max_connections: int = 100
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

    def __post_init__(self) -> None:
        # Upper bounds too: past them the socket layer or the backoff arithmetic raises OverflowError.
        for name in ("socket_timeout", "socket_connect_timeout", "deadline"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or not 0 < value <= MAX_SECONDS:
                raise InvalidArgumentError(f"invalid {name} {value!r}: expected seconds > 0 and <= {MAX_SECONDS}")
        for name in ("backoff_base", "backoff_cap"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or not 0 <= value <= MAX_BACKOFF_SECONDS:
                raise InvalidArgumentError(f"invalid {name} {value!r}: expected seconds >= 0 and <= "
                                           f"{MAX_BACKOFF_SECONDS}")
        for name, most in (("retries", MAX_RETRIES), ("health_check_interval", MAX_SECONDS)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= most:
                raise InvalidArgumentError(f"invalid {name} {value!r}: expected an int >= 0 and <= {most}")
        if self.client_name is not None and (not isinstance(self.client_name, str)
                                             or not all("!" <= c <= "~" for c in self.client_name)):
            # Redis' own rule for CLIENT SETNAME; refused here, before a connection sends it.
            raise InvalidArgumentError(f"invalid client_name {self.client_name!r}: use printable ASCII without "
                                       "spaces")
        if isinstance(self.max_connections, bool) or not isinstance(self.max_connections, int) \
                or not 1 <= self.max_connections <= MAX_CONNECTIONS:
            raise InvalidArgumentError(f"invalid max_connections {self.max_connections!r}: expected an int >= 1 "
                                       f"and <= {MAX_CONNECTIONS}")
        if self.ssl_cert_reqs is not None and self.ssl_cert_reqs not in _CERT_REQS:
            raise InvalidArgumentError(f"invalid ssl_cert_reqs {self.ssl_cert_reqs!r}: expected one of "
                                       + ", ".join(_CERT_REQS))

    def tls_options(self) -> dict[str, Any]:
        """The ``ssl_*`` fields that are set (they need a TLS scheme)."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name.startswith("ssl_") and getattr(self, f.name) is not None}

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
    def options(self) -> dict[str, Any]:
        """The :class:`ConnectionOptions` fields this URL sets, parsed."""
        return {name: _QUERY_OPTIONS[name](value) for name, value in self.query.items() if name in _OPTION_FIELDS}

    @property
    def masked(self) -> str:
        """The URL's shape without its password (user info without a password may be one: masked whole)."""
        auth = ""
        if self.password is not None:
            auth = f"{self.username or ''}:***@"
        elif self.username:
            auth = "***@"
        where = self.path or ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in self.hosts)
        if self.scheme in CLUSTER_SCHEMES:
            return f"{self.scheme}://{auth}{where}"
        service = f"/{self.service}" if self.service else ""
        return f"{self.scheme}://{auth}{where}{service}/{self.db}"


def _hint(shown: str) -> str:
    """Where credentials are present, the likely cause of a malformed URL."""
    return " (percent-encode any @ / ? # in the user name or password)" if "@" in shown else ""


_BOOL = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}
_CERT_REQS = ("required", "optional", "none")


def _field_parser(annotation: Any) -> Callable[[str], Any]:
    """How a query value becomes a ConnectionOptions field of type ``annotation`` (Optional[X] -> X)."""
    if typing.get_origin(annotation) in (Union, types.UnionType):
        annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
    return {bool: lambda v: _BOOL[v.lower()], int: int, float: float, str: str}[annotation]


_OPTION_FIELDS: dict[str, Callable[[str], Any]] = {
    name: _field_parser(annotation) for name, annotation in typing.get_type_hints(ConnectionOptions).items()
}
_OPTION_FIELDS["ssl_cert_reqs"] = lambda v: _CERT_REQS[_CERT_REQS.index(v.lower())]


def _positive_int(value: str) -> int:
    number = int(value)
    if number <= 0:
        raise ValueError(value)
    return number


STORE_OPTIONS: dict[str, Callable[[str], Any]] = {"near_cache": lambda v: _BOOL[v.lower()],
                                                  "near_cache_size": _positive_int}
"""Query options of the store rather than the client, read by ``from_url`` (:func:`kvstatus.nearcache.near_cache_setting`)."""
_QUERY_OPTIONS: dict[str, Callable[[str], Any]] = {
    **_OPTION_FIELDS,
    "db": int,
    "sentinel_username": str,
    "sentinel_password": str,
    "scripts": lambda v: ("eval", "functions")[("eval", "functions").index(v)],
    **STORE_OPTIONS,
}
"""Every query option a URL may carry: each ConnectionOptions field, the database, Sentinel credentials,
``scripts`` (eval or functions: how the store runs its Lua; see :func:`url_script_mode`), and the store's
near-cache options."""
_SENTINEL_ONLY = ("sentinel_username", "sentinel_password")
_TLS_ONLY = tuple(name for name in _OPTION_FIELDS if name.startswith("ssl_"))


def url_script_mode(url: str) -> str:
    """The URL's ``?scripts=`` option (eval or functions: how a store on it runs its Lua), "eval" if absent."""
    return parse_url(url).query.get("scripts", "eval")


def parse_url(url: object) -> ParsedURL:
    """Validate a Redis URL; raise :class:`InvalidURLError` naming what is wrong (password masked)."""
    if not isinstance(url, str) or not url:
        raise InvalidURLError(f"invalid Redis URL {url!r}: expected a string such as {DEFAULT_URL}")
    # Undecodable bytes from argv or the environment arrive as lone surrogates, which cannot be sent to Redis.
    shown = mask_url(url).encode("utf-8", "backslashreplace").decode("utf-8")
    try:
        url.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidURLError(f"invalid Redis URL {shown}: not valid UTF-8 text (bytes that are not UTF-8, "
                              "e.g. in the password; percent-encode them)") from None
    try:
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in _BUILDERS:
            raise InvalidURLError(
                f"invalid Redis URL {shown}: unsupported scheme {parts.scheme!r}; use one of "
                + ", ".join(f"{s}://" for s in _BUILDERS)
            )
        if "#" in url:
            raise InvalidURLError(f"invalid Redis URL {shown}: a Redis URL has no '#' part "
                                  "(percent-encode # in a password as %23)")
        query: dict[str, str] = {}
        for name, values in parse_qs(parts.query, keep_blank_values=True, strict_parsing=False,
                                     errors="strict").items():
            if name not in _QUERY_OPTIONS:
                # An unencoded & ? in a password splits it into "options": name one only if the masked URL shows it.
                shows = any(f"{sep}{name}" in shown for sep in "?&;")
                named = f" {name!r}" if name.isidentifier() and shows else ""
                raise InvalidURLError(f"invalid Redis URL {shown}: unknown option{named} (options: "
                                      f"{', '.join(_QUERY_OPTIONS)}; percent-encode & in a password as %26)")
            query[name] = values[-1]
        for name, value in query.items():
            try:
                _QUERY_OPTIONS[name](value)
            except (KeyError, ValueError):
                raise InvalidURLError(f"invalid Redis URL {shown}: bad value for option {name!r}") from None
        try:
            replace(ConnectionOptions(), **{n: _OPTION_FIELDS[n](v) for n, v in query.items() if n in _OPTION_FIELDS})
        except InvalidArgumentError as exc:
            raise InvalidURLError(f"invalid Redis URL {shown}: {exc}") from None
        if scheme not in TLS_SCHEMES and any(name in query for name in _TLS_ONLY):
            raise InvalidURLError(f"invalid Redis URL {shown}: ssl_* options need a TLS scheme (rediss://, "
                                  "rediss+cluster://, rediss+sentinel://); on {scheme}:// they would be ignored "
                                  "and the connection would be plain text".replace("{scheme}", scheme))
        try:
            username = unquote(parts.username, errors="strict") if parts.username else None
            password = unquote(parts.password, errors="strict") if parts.password is not None else None
        except UnicodeDecodeError:
            raise InvalidURLError(f"invalid Redis URL {shown}: the user name or password is percent-encoded "
                                  "bytes that are not UTF-8, which redis-py cannot send") from None
        if "@" in parts.path:
            # An unencoded "/" in the user info ends the authority early: the rest of the password would
            # land in the socket path or the database, and be shown. Refuse instead of guessing.
            raise InvalidURLError(f"invalid Redis URL {shown}: an '@' after the host{_hint(shown)}")
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
    service = unquote(service, errors="strict")
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
    if int(text) > MAX_DB:
        raise InvalidURLError(f"invalid Redis URL {shown}: database {text} out of range (0..{MAX_DB})")
    return int(text)


def _common_kwargs(parsed: ParsedURL, options: ConnectionOptions) -> dict[str, Any]:
    """redis-py keyword arguments; ``options`` already hold the URL's query options."""
    kwargs: dict[str, Any] = {
        "username": parsed.username,
        "password": parsed.password,
        "db": parsed.db,
        "socket_timeout": options.socket_timeout,
        "socket_connect_timeout": options.socket_connect_timeout,
        "health_check_interval": options.health_check_interval,
        "client_name": options.client_name,
    }
    if parsed.tls:
        kwargs.update(_ssl_kwargs(parsed.query, options))
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
    client = client_class(retry=_retry(options, asynchronous, refused_is_final=True), **kwargs)
    # The same connections on a pool that queues for a free one (redis-py's default pool fails at once).
    made = client.connection_pool
    pool_class = AsyncWaitingConnectionPool if asynchronous else WaitingConnectionPool
    client.connection_pool = pool_class(
        connection_class=_connection_class(made.connection_class, parsed.tls),
        max_connections=options.max_connections,
        timeout=options.deadline,
        **made.connection_kwargs,
    )
    return client


TLS_HANDSHAKE_FAILED = "TLS handshake failed: is the server TLS?"


class TLSHandshakeError(redis.exceptions.ConnectionError):
    """A TLS connection met a server that does not speak TLS, or a certificate that failed; never resent."""


def _speaks_plain_redis(host: str, port: int, timeout: float) -> bool:
    """True if ``host:port`` answers a plain-text ``PING`` like Redis does (``+PONG`` or an ``-ERR``)."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as probe:
            probe.sendall(b"PING\r\n")
            return probe.recv(16)[:1] in (b"+", b"-")
    except OSError:
        return False


def _handshake_error(exc: BaseException, host: str, port: int, timeout: float) -> Optional[TLSHandshakeError]:
    """The error to raise for a failed TLS handshake, or None to let ``exc`` through (a hung server is retried)."""
    where = f"{host}:{port}"
    if isinstance(exc, ssl.SSLCertVerificationError):
        return TLSHandshakeError(f"TLS certificate verification failed for {where}: {exc.verify_message} "
                                 "(check ssl_ca_certs and ssl_check_hostname)")
    if _speaks_plain_redis(host, port, timeout):
        return TLSHandshakeError(f"{TLS_HANDSHAKE_FAILED} {where} answers in plain text; "
                                 "use redis:// for it, or enable TLS on the server")
    if isinstance(exc, ssl.SSLError):
        return TLSHandshakeError(f"{TLS_HANDSHAKE_FAILED} {where} did not complete a TLS handshake ({exc})")
    return None


class _TLSHandshake:
    """Mixin for redis-py's sync TLS connections: the handshake runs under ``socket_connect_timeout``."""

    def _wrap_socket_with_ssl(self, sock: socket.socket) -> Any:
        sock.settimeout(self.socket_connect_timeout)  # type: ignore[attr-defined]
        try:
            tls = super()._wrap_socket_with_ssl(sock)  # type: ignore[misc]
        except (ssl.SSLError, socket.timeout) as exc:
            error = _handshake_error(exc, self.host, self.port, self.socket_connect_timeout)  # type: ignore[attr-defined]
            if error is None:
                raise
            raise error from None
        tls.settimeout(self.socket_timeout)  # type: ignore[attr-defined]
        return tls


class _AsyncTLSHandshake:
    """Mixin for redis.asyncio's TLS connections (the handshake already runs under the connect timeout)."""

    async def _connect(self) -> None:
        try:
            await super()._connect()  # type: ignore[misc]
        except (ssl.SSLError, asyncio.TimeoutError) as exc:
            error = await asyncio.get_running_loop().run_in_executor(
                None, _handshake_error, exc, self.host, self.port, self.socket_connect_timeout)  # type: ignore[attr-defined]
            if error is None:
                raise
            raise error from None


@functools.lru_cache(maxsize=None)
def _connection_class(base: type, tls: bool) -> type:
    """``base`` (a redis-py connection class) with the deadline of store calls, and the TLS handshake checks."""
    asynchronous = base.__module__.startswith("redis.asyncio")
    mixins: tuple[type, ...] = (AsyncDeadlineConnection if asynchronous else DeadlineConnection,)
    if tls:
        mixins += (_AsyncTLSHandshake if asynchronous else _TLSHandshake,)
    return type(f"KVStatus{base.__name__}", (*mixins, base), {})


def _is_final(error: Exception, failures: int = 0) -> bool:
    """Errors never resent: refused credentials (a ConnectionError in redis-py), a TLS handshake with a
    plain-text server. redis.asyncio wraps connect errors: look at the cause too."""
    final = (redis.exceptions.AuthenticationError, TLSHandshakeError)
    return isinstance(error, final) or isinstance(error.__cause__, final)


def _is_final_standalone(error: Exception, failures: int) -> bool:
    """:func:`_is_final`, and a refused connection: on one server nobody else could answer, so the call fails
    at once. The error records whether an earlier attempt may have reached Redis (``failures`` at any level
    of redis-py's nested retries: the command's and its connect's)."""
    if connection_refused(error):
        setattr(error, NOT_SENT, getattr(error, NOT_SENT, True) and failures == 0)
        return True
    return _is_final(error)


def _retry(options: ConnectionOptions, asynchronous: bool, refused_is_final: bool = False) -> Any:
    """The per-command retry policy; ``refused_is_final`` for a standalone server (a cluster or a failover may
    move the node that refused, so those clients retry it within their budget)."""
    backoff = ExponentialBackoff(cap=options.backoff_cap, base=options.backoff_base)
    retry_class = AsyncDeadlineRetry if asynchronous else DeadlineRetry
    return retry_class(backoff, options.retries, _is_final_standalone if refused_is_final else _is_final)


def _cluster(parsed: ParsedURL, options: ConnectionOptions, asynchronous: bool) -> Any:
    """A RedisCluster; its retry object also drives topology refreshes after MOVED or a dead node.

    redis-py's cluster clients have no blocking pool: the store queues its calls instead
    (:func:`kvstatus.storebase.gate_for`), at most ``max_connections`` at a time, each holding at most one
    connection per node, so no node's pool runs out.
    """
    kwargs = _common_kwargs(parsed, options)
    del kwargs["db"]
    kwargs["max_connections"] = options.max_connections
    if asynchronous:
        from redis.asyncio.cluster import ClusterNode as AsyncNode
        from redis.asyncio.cluster import RedisCluster as AsyncCluster

        nodes = [AsyncNode(host, port) for host, port in parsed.hosts]
        cluster = AsyncCluster(startup_nodes=nodes, retry=_retry(options, True), **kwargs)
        # Nodes are built from these kwargs when the client first connects.
        manager = cluster.nodes_manager
        default = redis.asyncio.SSLConnection if parsed.tls else redis.asyncio.Connection
        connection_class = _connection_class(manager.connection_kwargs.get("connection_class", default), parsed.tls)
        manager.connection_kwargs["connection_class"] = connection_class
        for node in manager.startup_nodes.values():
            node.connection_class = connection_class
        return cluster
    from redis.cluster import ClusterNode, RedisCluster

    try:  # the sync client reads the slot map right away
        cluster = RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in parsed.hosts],
                               retry=_retry(options, False), **kwargs)
    except REDIS_ERRORS as exc:
        raise translate_error(exc) from exc
    _deadline_nodes(cluster, parsed.tls)
    return cluster


def _deadline_nodes(cluster: Any, tls: bool) -> None:
    """Give every node client of a sync RedisCluster, present and future, kvstatus connections.

    redis-py's sync ``Redis`` takes no connection class (with ``ssl=True`` it imposes SSLConnection), so the
    class is set on each node's pool as the node is made; the nodes of the first slot map are redone here.
    """
    manager = cluster.nodes_manager
    make_node = manager.create_redis_node

    def create_redis_node(*args: Any, **kwargs: Any) -> Any:
        node = make_node(*args, **kwargs)
        pool = node.connection_pool
        pool.connection_class = _connection_class(pool.connection_class, tls)
        return node

    manager.create_redis_node = create_redis_node
    for node in manager.nodes_cache.values():
        if node.redis_connection is not None:
            pool = node.redis_connection.connection_pool
            pool.disconnect()
            pool.connection_class = _connection_class(pool.connection_class, tls)
            pool.reset()


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
    if asynchronous:
        from redis.asyncio.sentinel import Sentinel as SentinelClass
        from redis.asyncio.sentinel import SentinelManagedConnection, SentinelManagedSSLConnection
    else:
        from redis.sentinel import Sentinel as SentinelClass
        from redis.sentinel import SentinelManagedConnection, SentinelManagedSSLConnection
    if parsed.tls:
        sentinel_kwargs.update(_ssl_kwargs(query, options))
    kwargs["connection_class"] = _connection_class(
        SentinelManagedSSLConnection if parsed.tls else SentinelManagedConnection, parsed.tls)
    # No per-command retry on the data connections: redis-py 8.1 resends on the same connection
    # object, which keeps reaching a just-demoted master ("The previous master is now a slave")
    # until its budget is spent. The store resends the whole call instead, through a fresh
    # connection that asks the Sentinels where the master is (see StoreBase / failover_delays).
    sentinel = SentinelClass(
        list(parsed.hosts), sentinel_kwargs=sentinel_kwargs, retry=_no_retry(asynchronous), **kwargs
    )
    for client in sentinel.sentinels:  # asking the Sentinels where the master is counts against the deadline too
        client.connection_pool.connection_class = _connection_class(client.connection_pool.connection_class,
                                                                    parsed.tls)
    pool_class = _AsyncSentinelPool if asynchronous else _SentinelPool
    return sentinel.master_for(parsed.service, connection_pool_class=pool_class,
                               max_connections=options.max_connections, timeout=options.deadline)


def _no_retry(asynchronous: bool) -> Any:
    from redis.backoff import NoBackoff

    return (redis.asyncio.retry.Retry if asynchronous else Retry)(NoBackoff(), 0)


class _SentinelPool(WaitingPool, redis.sentinel.SentinelConnectionPool):
    """redis-py's SentinelConnectionPool (the master's address from the Sentinels) that queues for a free
    connection (see :class:`~kvstatus.deadline.WaitingPool`)."""


class _AsyncSentinelPool(AsyncWaitingPool, redis.asyncio.sentinel.SentinelConnectionPool):
    """:class:`_SentinelPool` for redis.asyncio."""


_BUILDERS: dict[str, Callable[[ParsedURL, ConnectionOptions, bool], Any]] = {
    "redis": _standalone,
    "rediss": _standalone,
    "unix": _standalone,
    "redis+cluster": _cluster,
    "rediss+cluster": _cluster,
    "redis+sentinel": _sentinel,
    "rediss+sentinel": _sentinel,
}


CONNECTION_FIELDS: frozenset[str] = frozenset(field.name for field in fields(ConnectionOptions))
"""The keyword arguments of ``from_url`` that are connection options rather than store settings."""


def options_for(url: str, options: Optional[ConnectionOptions] = None, **overrides: Any) -> ConnectionOptions:
    """The options a client of ``url`` uses: ``options``, then ``overrides``, then the URL's query options.

    Raises :class:`InvalidURLError` for a bad URL, and for ``ssl_*`` options given with a non-TLS scheme.
    """
    return _options(parse_url(url), options, overrides)


def _options(parsed: ParsedURL, options: Optional[ConnectionOptions], overrides: dict[str, Any]) -> ConnectionOptions:
    opts = replace(replace(options or ConnectionOptions(), **overrides), **parsed.options)
    if not parsed.tls and opts.tls_options():
        raise InvalidURLError(f"invalid Redis URL {parsed.masked}: {', '.join(opts.tls_options())} given, but "
                              f"{parsed.scheme}:// is plain text; use a TLS scheme (rediss://...)")
    return opts


def connect(url: str, options: Optional[ConnectionOptions] = None, **overrides: Any) -> Any:
    """A redis-py client for ``url``; ``overrides`` replace fields of ``options``. Connects lazily."""
    parsed = parse_url(url)
    return _BUILDERS[parsed.scheme](parsed, _options(parsed, options, overrides), False)


def connect_async(url: str, options: Optional[ConnectionOptions] = None, **overrides: Any) -> Any:
    """Like :func:`connect`, for ``redis.asyncio``."""
    parsed = parse_url(url)
    return _BUILDERS[parsed.scheme](parsed, _options(parsed, options, overrides), True)
