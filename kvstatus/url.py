"""The Redis URL grammar (docs/guide.md, "Topologies and URLs", "Configuration"), parsed once and checked, no I/O:
every field of :class:`ConnectionOptions` is also a query option, which wins over the keyword argument. Passwords
are masked in every message. :mod:`kvstatus.connection` turns a :class:`ParsedURL` into a client."""

from __future__ import annotations

import math
import types
import typing
from dataclasses import dataclass, fields, replace
from typing import Any, Callable, Optional, Union
from urllib.parse import parse_qs, unquote, urlsplit

from kvstatus.errors import InvalidArgumentError, InvalidURLError, mask_url

DEFAULT_URL = "redis://localhost:6379/0"
TLS_SCHEMES = frozenset({"rediss", "rediss+cluster", "rediss+sentinel"})
SENTINEL_SCHEMES = frozenset({"redis+sentinel", "rediss+sentinel"})
CLUSTER_SCHEMES = frozenset({"redis+cluster", "rediss+cluster"})
MAX_SECONDS = 86_400
"""Most seconds of a timeout or the deadline (one day)."""
BACKOFF_BASE_SECONDS = 0.05
BACKOFF_CAP_SECONDS = 2.0
"""The wait before resend n is ``min(BACKOFF_CAP_SECONDS, BACKOFF_BASE_SECONDS * 2**n)`` seconds: 0.1, 0.2, 0.4,
0.8, 1.6, then 2 s each. ``retries`` sets how many; the deadline bounds them all."""
HEALTH_CHECK_SECONDS = 30
"""A pooled connection idle this long is checked with PING before its next command."""
CLIENT_NAME = "kvstatus"
"""Every connection's name (CLIENT SETNAME), what ``CLIENT LIST`` shows."""
MAX_RETRIES = 100
MAX_CONNECTIONS = 1_000_000
MAX_DB = 2**31 - 1
"""Redis' own limit on its ``databases`` setting (a C int)."""
SCHEMES = ("redis", "rediss", "unix", "redis+cluster", "rediss+cluster", "redis+sentinel", "rediss+sentinel")
"""Every URL scheme, in the order error messages list them (:mod:`kvstatus.connection` builds a client for each)."""


@dataclass(frozen=True)
class ConnectionOptions:
    """Timeouts and the per-call ``deadline`` (seconds), ``retries`` (resends after a connection error or timeout,
    waiting :meth:`retry_delays`; 0: every update at most once) and ``max_connections`` (per client; per node on a
    cluster; calls beyond it queue) of every client (docs/guide.md, "Configuration", "Connections").

    ``deadline`` bounds a whole store call, resends and the wait for a connection included (docs/guide.md,
    "Deadline"); past it: :class:`~kvstatus.errors.BackendUnavailableError` ("unknown whether applied"), or
    :class:`~kvstatus.errors.PoolExhaustedError` if no connection came free (nothing was sent). A standalone server
    that refuses the connection raises :class:`~kvstatus.errors.BackendRefusedError` at once."""

    socket_timeout: float = 5.0
    socket_connect_timeout: float = 2.0
    deadline: float = 5.0
    max_connections: int = 100
    retries: int = 5
    ssl_ca_certs: Optional[str] = None
    ssl_certfile: Optional[str] = None
    ssl_keyfile: Optional[str] = None
    ssl_check_hostname: Optional[bool] = None

    def __post_init__(self) -> None:
        # Upper bounds too: past them the socket layer or the backoff arithmetic raises OverflowError.
        for name in ("socket_timeout", "socket_connect_timeout", "deadline"):
            value = getattr(self, name)
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not number or not math.isfinite(value) or not 0 < value <= MAX_SECONDS:
                raise InvalidArgumentError(f"invalid {name} {value!r}: expected seconds > 0 and <= {MAX_SECONDS}")
        for name, low, high in (("retries", 0, MAX_RETRIES), ("max_connections", 1, MAX_CONNECTIONS)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise InvalidArgumentError(f"invalid {name} {value!r}: expected an int >= {low} and <= {high}")

    def tls_options(self) -> dict[str, Union[str, bool]]:
        """The ``ssl_*`` fields that are set (they need a TLS scheme)."""
        return {name: getattr(self, name) for name in _TLS_ONLY if getattr(self, name) is not None}

    def retry_delays(self) -> tuple[float, ...]:
        """The wait in seconds before each resend (:data:`BACKOFF_CAP_SECONDS`)."""
        return tuple(min(BACKOFF_CAP_SECONDS, BACKOFF_BASE_SECONDS * 2**n) for n in range(1, self.retries + 1))

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
    def options(self) -> dict[str, Any]:  # field-typed values, for dataclasses.replace()
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


def _invalid(shown: str, why: str) -> InvalidURLError:
    return InvalidURLError(f"invalid Redis URL {shown}: {why}")


def _hint(shown: str) -> str:
    """Where credentials are present, the likely cause of a malformed URL."""
    return " (percent-encode any @ / ? # [ ] in the user name or password)" if "@" in shown else ""


_Parser = Callable[[str], object]
_BOOL = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}
_PARSERS: dict[object, _Parser] = {bool: lambda text: _BOOL[text.lower()], int: int, float: float, str: str}


def _field_parser(annotation: object) -> _Parser:
    """How a query value becomes a ConnectionOptions field of type ``annotation`` (Optional[X] -> X)."""
    if typing.get_origin(annotation) in (Union, types.UnionType):
        annotation = next(arg for arg in typing.get_args(annotation) if arg is not type(None))
    return _PARSERS[annotation]


_OPTION_FIELDS: dict[str, Callable[[str], Any]] = {  # each its field's type (dataclasses.replace() checks them)
    name: _field_parser(annotation) for name, annotation in typing.get_type_hints(ConnectionOptions).items()
}


_QUERY_OPTIONS: dict[str, _Parser] = {
    **_OPTION_FIELDS,
    "db": int,
    "sentinel_username": str,
    "sentinel_password": str,
}
"""Every query option a URL may carry: connection settings only (a store setting is the store's argument)."""
STORE_ARGUMENTS = {
    "scripts": ('scripts="functions"', "; the SGLang plugin: KVSTATUS_SGLANG_SCRIPTS; the CLI: --scripts functions"),
    "near_cache": ("near_cache=True", "; the SGLang plugin: KVSTATUS_SGLANG_NEAR_CACHE, on by default"),
    "near_cache_size": ("near_cache=NearCacheOptions(max_rooms=N)", ""),
    "lease_ttl": ("lease_ttl=SECONDS", "; the SGLang plugin: KVSTATUS_SGLANG_LEASE_TTL"),
    "shared_fate": ("shared_fate=False", "; the SGLang plugin: KVSTATUS_SGLANG_SHARED_FATE=0"),
    "timeline": (
        "timeline=True",
        "; the SGLang plugin: KVSTATUS_SGLANG_TIMELINE, on by default; the CLI: set --timeline",
    ),
}
"""Store settings a URL may not carry: each with the argument to pass instead, and the SGLang variable and CLI
option where there are some. A URL naming one is refused with them in the message."""
_FIXED_BACKOFF = (
    f"the resends' backoff is fixed ({BACKOFF_BASE_SECONDS:g} s doubling, at most {BACKOFF_CAP_SECONDS:g} s); "
    "retries and deadline size the resends"
)
RETIRED_OPTIONS = {
    "backoff_base": _FIXED_BACKOFF,
    "backoff_cap": _FIXED_BACKOFF,
    "health_check_interval": f"an idle connection is checked after {HEALTH_CHECK_SECONDS} s",
    "client_name": f"every connection is named {CLIENT_NAME!r} (CLIENT SETNAME); CLIENT LIST tells them apart by "
    "addr and user",
    "ssl_cert_reqs": "the server's certificate is always verified: trust a private CA with ssl_ca_certs, and set "
    "ssl_check_hostname=false for nodes that announce IP addresses their certificate does not name",
}
"""Connection options that are fixed, each with what holds instead (a URL naming one is refused)."""
_SENTINEL_ONLY = ("sentinel_username", "sentinel_password")
_TLS_ONLY = tuple(name for name in _OPTION_FIELDS if name.startswith("ssl_"))


def parse_url(url: object) -> ParsedURL:
    """Validate a Redis URL; raise :class:`InvalidURLError` naming what is wrong (password masked).
    A :class:`ParsedURL` is returned as it is: callers parse a URL once and pass the result on."""
    if isinstance(url, ParsedURL):
        return url
    if not isinstance(url, str) or not url:
        raise InvalidURLError(f"invalid Redis URL {url!r}: expected a string such as {DEFAULT_URL}")
    # Undecodable bytes from argv or the environment arrive as lone surrogates, which cannot be sent to Redis.
    shown = mask_url(url).encode("utf-8", "backslashreplace").decode("utf-8")
    try:
        url.encode("utf-8")
    except UnicodeEncodeError:
        raise _invalid(
            shown, "not valid UTF-8 text (bytes that are not UTF-8, e.g. in the password; percent-encode them)"
        ) from None
    try:
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in SCHEMES:
            schemes = ", ".join(f"{known}://" for known in SCHEMES)
            raise _invalid(shown, f"unsupported scheme {parts.scheme!r}; use one of {schemes}")
        if "#" in url:
            raise _invalid(shown, "a Redis URL has no '#' part (percent-encode # in a password as %23)")
        query: dict[str, str] = {}
        for name, values in parse_qs(parts.query, keep_blank_values=True, errors="strict").items():
            if name in STORE_ARGUMENTS:
                instead, where = STORE_ARGUMENTS[name]
                setting = f"{name!r} is a store setting, not a connection option"
                raise _invalid(shown, f"{setting}; pass {instead} to the store instead{where}")
            if name in RETIRED_OPTIONS:
                raise _invalid(shown, f"option {name!r} was removed: {RETIRED_OPTIONS[name]}")
            if name not in _QUERY_OPTIONS:
                # An unencoded & ? in a password splits it into "options": name one only if the masked URL shows it.
                shows = any(f"{sep}{name}" in shown for sep in "?&;")
                named = f" {name!r}" if name.isidentifier() and shows else ""
                options = ", ".join(_QUERY_OPTIONS)
                raise _invalid(
                    shown, f"unknown option{named} (options: {options}; percent-encode & in a password as %26)"
                )
            query[name] = values[-1]
        for name, value in query.items():
            try:
                _QUERY_OPTIONS[name](value)
            except (KeyError, ValueError):
                raise _invalid(shown, f"bad value for option {name!r}") from None
        try:
            replace(ConnectionOptions(), **{n: _OPTION_FIELDS[n](v) for n, v in query.items() if n in _OPTION_FIELDS})
        except InvalidArgumentError as exc:
            raise _invalid(shown, str(exc)) from None
        if scheme not in TLS_SCHEMES and any(name in query for name in _TLS_ONLY):
            raise _invalid(
                shown,
                "ssl_* options need a TLS scheme (rediss://, rediss+cluster://, rediss+sentinel://); "
                f"on {scheme}:// they would be ignored and the connection would be plain text",
            )
        try:
            username = unquote(parts.username, errors="strict") if parts.username else None
            password = unquote(parts.password, errors="strict") if parts.password is not None else None
        except UnicodeDecodeError:
            raise _invalid(
                shown,
                "the user name or password is percent-encoded bytes that are not UTF-8, which redis-py cannot send",
            ) from None
        if "@" in parts.path:
            # An unencoded "/" in the user info ends the authority early: the rest of the password would
            # land in the socket path or the database, and be shown. Refuse instead of guessing.
            raise _invalid(shown, f"an '@' after the host{_hint(shown)}")
        if scheme not in SENTINEL_SCHEMES and any(name in query for name in _SENTINEL_ONLY):
            raise _invalid(shown, "sentinel_* options need redis+sentinel://")
        if scheme == "unix":
            path = unquote(parts.path)
            if not path:
                raise _invalid(shown, "a unix:// URL needs a socket path")
            return ParsedURL(scheme, (), username, password, _parse_db("", query.pop("db", None), shown), path, query)
        hosts = _parse_hosts(parts.netloc.rpartition("@")[2], shown)
        if scheme in SENTINEL_SCHEMES:
            service, db_path = _parse_service(parts.path, shown)
            db = _parse_db(db_path, query.pop("db", None), shown)
            return ParsedURL(scheme, hosts, username, password, db, None, query, service)
        db = _parse_db(parts.path, query.pop("db", None), shown)
        if scheme in CLUSTER_SCHEMES and db != 0:
            raise _invalid(shown, "Redis Cluster has only database 0")
        return ParsedURL(scheme, hosts, username, password, db, None, query)
    except InvalidURLError:
        raise
    except ValueError as exc:
        if "@" in shown:  # urllib's messages quote pieces of the URL: a bracketed piece of a password among them
            raise _invalid(shown, f"it cannot be split into its parts{_hint(shown)}") from None
        raise _invalid(shown, mask_url(str(exc))) from None


def _parse_hosts(netloc: str, shown: str) -> tuple[tuple[str, int], ...]:
    hosts = []
    for item in netloc.split(",") if netloc else ["localhost"]:
        if item.startswith("["):
            host, _, rest = item[1:].partition("]")
            port_text = rest[1:] if rest.startswith(":") else ""
        else:
            host, _, port_text = item.partition(":")
        if not host:
            raise _invalid(shown, f"missing host{_hint(shown)}")
        if port_text and (not port_text.isdigit() or not 0 < int(port_text) < 65536):
            raise _invalid(shown, f"bad port (1..65535){_hint(shown)}")
        hosts.append((host, int(port_text) if port_text else 6379))
    return tuple(hosts)


def _parse_service(path: str, shown: str) -> tuple[str, str]:
    """Split ``/service_name[/db]`` of a Sentinel URL."""
    service, _, db = path.strip("/").partition("/")
    service = unquote(service, errors="strict")
    if not service:
        raise _invalid(shown, "a Sentinel URL needs /service_name after the hosts")
    if any(char.isspace() or char == "/" for char in service):
        raise _invalid(shown, "bad service name")
    return service, db


def _parse_db(path: str, from_query: Optional[str], shown: str) -> int:
    text = from_query if from_query is not None else path.strip("/")
    if not text:
        return 0
    if not text.isdigit():
        raise _invalid(shown, f"the database is not a number{_hint(shown)}")
    if int(text) > MAX_DB:
        raise _invalid(shown, f"database {text} out of range (0..{MAX_DB})")
    return int(text)


CONNECTION_FIELDS: frozenset[str] = frozenset(field.name for field in fields(ConnectionOptions))
"""The keyword arguments of ``from_url`` that are connection options rather than store settings."""


def options_for(
    url: Union[str, ParsedURL], options: Optional[ConnectionOptions] = None, **overrides: Any
) -> ConnectionOptions:
    """The options a client of ``url`` uses: ``options``, then ``overrides``, then the URL's query options; raises
    :class:`InvalidURLError` for a bad URL, and for ``ssl_*`` options given with a non-TLS scheme."""
    return _options(parse_url(url), options, overrides)


def _options(parsed: ParsedURL, options: Optional[ConnectionOptions], overrides: dict[str, Any]) -> ConnectionOptions:
    opts = replace(replace(options or ConnectionOptions(), **overrides), **parsed.options)
    if not parsed.tls and opts.tls_options():
        raise InvalidURLError(
            f"invalid Redis URL {parsed.masked}: {', '.join(opts.tls_options())} given, but "
            f"{parsed.scheme}:// is plain text; use a TLS scheme (rediss://...)"
        )
    return opts
