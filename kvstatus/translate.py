"""redis-py errors -> kvstatus errors: one place decides what a Redis failure means to a caller (docs/guide.md,
"Errors"); and the connection mixins that name the server in a wrong URL's errors (:data:`SERVER_ATTR`)."""

from __future__ import annotations

import re
import socket
from typing import TYPE_CHECKING, Optional

from redis import exceptions as rx
from redis.sentinel import MasterNotFoundError

from kvstatus.errors import (
    EARLIER,
    AuthenticationError,
    BackendBusyError,
    BackendError,
    BackendRefusedError,
    BackendUnavailableError,
    ClientPoolExhausted,
    CorruptedValueError,
    InvalidArgumentError,
    KVStatusError,
    PermissionDeniedError,
    PoolExhaustedError,
    mask_url,
)
from kvstatus.scripts import LIBRARY_NAME

if TYPE_CHECKING:  # annotations only: the requests and the replies stay a layer above the translation
    from kvstatus.replies import ReplyOrError
    from kvstatus.requests import Call

# Error prefixes the scripts in lua/ return (redis.error_reply); NOPERM arrives as redis-py's NoPermissionError.
_BADARG = "KVSTATUS_BADARG "
_CORRUPT = "KVSTATUS_CORRUPT "
# The server's text when a script's redis.call is denied by ACL (it names the script line, not the command): Redis 7.0
# "The user executing the script can't run this command ..." or "... can't access at least one of the keys ...";
# Redis 7.2+ and Valkey "ACL failure in script: ...".
_SCRIPT_NOPERM = re.compile(r"The user executing the script can't (?:run this command|access)|ACL failure in script: ")
# The ACL's refusal of a key: Redis 6.2-7.0 "no permissions to access one of the keys used as arguments", Redis 7.2+
# and Valkey "No permissions to access a key" (or "... the 'k' key"), a script's line on Redis 7.0 (above).
_KEY_DENIAL = re.compile(
    r"no permissions to access (?:one of the keys|a key|the '.*' key)|can't access at least one of the keys", re.I
)
_EVAL_COMMANDS = ("EVALSHA", "EVAL", "EVALSHA_RO", "EVAL_RO")


REDIS_ERRORS = (rx.RedisError, rx.RedisClusterException)
"""What redis-py raises; RedisClusterException (no reachable node, no slot map) is no RedisError."""


NOT_SENT = "kvstatus_not_sent"
"""Attribute set on a refused connection's error: True if no attempt of the call reached Redis before it."""

_DNS_NAMES = ("EAI_NONAME", "EAI_NODATA", "EAI_FAIL", "EAI_SERVICE")  # the permanent answers
_PERMANENT_DNS = {getattr(socket, name) for name in _DNS_NAMES if hasattr(socket, name)}
_CONNECTING_TO = re.compile(r"connecting to (\S+?)\.?(?:\s|$)")
_READ_COMMANDS = frozenset(
    {"HGET", "HMGET", "HGETALL", "HLEN", "PTTL", "TTL", "EXISTS", "GET", "MGET", "SCAN", "TIME", "PING", "TYPE"}
)


def unresolved_host(error: BaseException) -> Optional[str]:
    """The DNS error text if ``error`` (a redis-py ConnectionError) comes from a host name that does not resolve
    (a permanent answer: no such name; a temporary one, EAI_AGAIN, is retried), else None."""
    seen: set[int] = set()
    cause: Optional[BaseException] = error
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, socket.gaierror):
            return cause.strerror or str(cause) if cause.errno in _PERMANENT_DNS else None
        cause = cause.__cause__ or cause.__context__
    return None


def denies_a_key(error: BaseException) -> bool:
    """True if ``error`` is the ACL refusing a key (not a command), in Redis' or Valkey's wording: the user's key
    patterns do not cover the namespace."""
    return _KEY_DENIAL.search(str(error)) is not None


def connection_refused(error: BaseException) -> bool:
    """True if ``error`` (a redis-py ConnectionError) comes from a refused connect: no server listens there
    (asyncio joins the errors of a name's several addresses in one OSError without an errno)."""
    if not isinstance(error, rx.ConnectionError):
        return False
    cause = error.__cause__ or error.__context__
    if isinstance(cause, rx.ConnectionError):
        return connection_refused(cause)
    if isinstance(cause, ConnectionRefusedError):
        return True
    if isinstance(cause, FileNotFoundError):  # a unix socket path with no server behind it
        return True
    text = str(cause or "")
    return text.startswith("Multiple exceptions: ") and text.count("[Errno 111]") == text.count("[Errno ")


def translate_error(exc: BaseException, call: Optional[Call] = None) -> BaseException:
    """The kvstatus error for a redis-py exception; other exceptions pass through unchanged."""
    if isinstance(exc, KVStatusError) or not isinstance(exc, REDIS_ERRORS):
        return exc
    text = mask_url(str(exc))
    if isinstance(exc, MasterNotFoundError):
        # redis-py appends a repr of every Sentinel client; keep the sentence, name the cause.
        head = text.partition(" : ")[0]
        if "auth:AuthenticationError" in text:
            return AuthenticationError(
                f"the Sentinels refused the credentials (sentinel_username/sentinel_password): {head}"
            )
        return BackendUnavailableError(
            f"Redis unavailable (after the configured retries): {head} "
            "(no Sentinel reachable, or none knows that service)"
        )
    cluster = isinstance(exc, rx.RedisClusterException)  # its cause may be refused credentials
    if isinstance(exc, rx.AuthenticationError) or (cluster and isinstance(exc.__cause__, rx.AuthenticationError)):
        return AuthenticationError(f"Redis refused the credentials: {text}")
    if cluster:
        return BackendUnavailableError(f"Redis unavailable (after the configured retries): {text}")
    if isinstance(exc, ClientPoolExhausted):
        return PoolExhaustedError(text)
    if isinstance(exc, rx.MaxConnectionsError):  # a non-blocking pool, e.g. of a client the caller built
        return PoolExhaustedError(
            f"client connection pool exhausted (max_connections reached: {text}); "
            "nothing was sent. Give the client a larger pool or a BlockingConnectionPool"
        )
    dns = unresolved_host(exc) if isinstance(exc, rx.ConnectionError) else None
    if dns is not None:
        found = _CONNECTING_TO.search(text)
        host, _, port = found.group(1).rpartition(":") if found else ("", "", "")
        name = f"{host} (port {port})" if host else "in the URL"
        not_sent = bool(getattr(exc, NOT_SENT, True))  # False: an earlier attempt reached Redis before
        sent = "so nothing was sent" if not_sent else f"after an earlier attempt was sent ({_applied(call)})"
        return BackendRefusedError(
            f"Redis unavailable: the host name {name} does not resolve ({dns}), {sent}: check the host in the URL "
            "(--url / KVSTATUS_URL)",
            not_sent=not_sent,
        )
    if isinstance(exc, rx.InvalidResponse) or text.startswith("Protocol error"):
        where = getattr(exc, SERVER_ATTR, None) or "the URL's address"
        return BackendError(
            f"the server at {where} did not answer as Redis (got an HTTP or other reply: {text}): check the "
            "URL's host and port"
        )
    if OUT_OF_RANGE in text:
        return BackendError(_out_of_range(exc, text))
    if hasattr(exc, NOT_SENT):  # set only by a standalone client's retry policy, which does not resend these
        if getattr(exc, NOT_SENT):
            return BackendRefusedError(
                f"Redis unavailable: it refused the connection, so nothing was sent and the "
                f"call was not applied (is Redis running at that address?): {text}",
                not_sent=True,
            )
        return BackendRefusedError(
            f"Redis unavailable: it refused the connection after an earlier attempt was sent ({_applied(call)}): {text}"
        )
    # BusyLoadingError is a ConnectionError, MasterDownError a ClusterDownError.
    if isinstance(exc, (rx.ConnectionError, rx.TimeoutError, rx.ClusterDownError, rx.ReadOnlyError, rx.TryAgainError)):
        earlier = getattr(exc, EARLIER, None)
        why = f" (an earlier attempt: {earlier})" if earlier else ""
        return BackendUnavailableError(f"Redis unavailable (retries or deadline spent; {_applied(call)}): {text}{why}")
    if isinstance(exc, rx.NoPermissionError):
        hint = ""
        if call is not None and call.args[0] in _EVAL_COMMANDS and "'eval" in text:
            hint = (
                " (a user of the tenant ACL recipe runs kvstatus' Lua as functions: give the store "
                'scripts="functions", the CLI --scripts functions)'
            )
        if denies_a_key(exc):
            hint = _uncovered(call)
        return PermissionDeniedError(f"Redis ACL denied the request: {text}{hint}")
    if "Function not found" in text and call is not None and call.args[0] in ("FCALL", "FCALL_RO"):
        return BackendError(
            f"the kvstatus function library {LIBRARY_NAME} (this kvstatus version's Lua) is not "
            "loaded on this Redis: an admin runs `kvstatus --url ADMIN_URL functions load` once "
            "(FUNCTION LOAD on every primary; replicas, restarts with persistence and failovers "
            'keep it), or the store uses scripts="eval"'
        )
    if _SCRIPT_NOPERM.search(text):
        # The scripts check their writes in advance and name a refused one themselves (NOPERM above);
        # this is a read the ACL refused on a key after the first, which Redis reports by line number only.
        return PermissionDeniedError(
            f"Redis ACL denied the request: a command called inside the kvstatus script "
            f"{call.script.name if call and call.script else '?'} ({text.rsplit(' script:', 1)[0]})"
        )
    if text.startswith(_BADARG):
        return InvalidArgumentError(f"the kvstatus script refused its arguments: {text[len(_BADARG) :]}")
    if text.startswith(_CORRUPT):
        return CorruptedValueError(text[len(_CORRUPT) :].split(" script:")[0])
    if text.startswith("BUSY "):
        return BackendBusyError(
            f"Redis is busy running a script (BUSY): this call was not run and is not resent; "
            f"it succeeds once the script ends or an admin runs SCRIPT KILL ({text})"
        )
    if text.startswith("WRONGTYPE"):
        return CorruptedValueError(f"{_where(call)} holds a value that is not a kvstatus room hash; left as it is")
    return BackendError(f"Redis error: {text}")


def checked(calls: list[Call], replies: list[ReplyOrError]) -> list[ReplyOrError]:
    """``replies`` if none is an error; else raise the first error as its kvstatus error."""
    for call, reply in zip(calls, replies):
        if isinstance(reply, Exception):
            error = translate_error(reply, call)
            if error is reply:
                raise reply
            raise error from reply
    return replies


def _where(call: Optional[Call]) -> str:
    """The key a WRONGTYPE reply of ``call`` is about: "key K", or for a script of several keys the first few."""
    args = () if call is None else call.args
    if args and args[0] in _EVAL_COMMANDS:
        if str(args[2]).isdigit() and int(args[2]) > 1:
            keys = [str(key) for key in args[3 : 3 + int(args[2])]]
            return f"one of the keys {', '.join(keys[:3])}{', ...' if len(keys) > 3 else ''}"
        first = str(args[3]) if args[2] == 1 else None
    else:
        first = str(args[1]) if len(args) > 1 else None
    return f"key {first}" if first else "a room key"


def _uncovered(call: Optional[Call]) -> str:
    """What a key denial of ``call`` is about: " (the user's ACL key patterns do not cover key K, namespace N)";
    keys are ``<prefix>:<namespace>:...`` and neither part holds a colon."""
    args = () if call is None else call.args
    scripted = len(args) >= 2 and str(args[0]).upper() in (*_EVAL_COMMANDS, "FCALL", "FCALL_RO")
    if len(args) < 2 or (scripted and not (len(args) > 3 and str(args[2]).isdigit() and int(args[2]) > 0)):
        return " (the user's ACL key patterns do not cover the namespace's keys)"
    key = str(args[3] if scripted else args[1])
    parts = key.split(":")
    namespace = f", namespace {parts[1]}" if len(parts) >= 3 else ""
    return f" (the user's ACL key patterns do not cover key {key}{namespace})"


def _applied(call: Optional[Call]) -> str:
    """What an interrupted call may have done: a write (script, or a command that is no read) may have run; a read,
    or an unknown call (the admin tools' reads), changed nothing."""
    if call is not None and call.script is not None:
        write = not call.script.read_only
    else:
        write = call is not None and str(call.args[0]).upper() not in _READ_COMMANDS
    return "the call may or may not have been applied" if write else "a read: nothing was changed"


def _out_of_range(exc: BaseException, text: str) -> str:
    where = getattr(exc, SERVER_ATTR, None)
    server = f"the server at {where}" if where else "the server"
    db = getattr(exc, DB_ATTR, None)
    which = f"database {db}" if db is not None else "the URL's database"
    if hasattr(exc, DATABASES_ATTR):
        count = getattr(exc, DATABASES_ATTR)
        if isinstance(count, int) and count > 0:
            return (
                f"{server} has no {which}: it has {count} ({OUT_OF_RANGE}); use /0 to /{count - 1} at the end "
                "of the URL"
            )
        return (
            f"{server} has no {which} ({OUT_OF_RANGE}); its limit is unknown (CONFIG GET databases was refused; "
            "Redis' default is 16, /0 to /15): use a database the server has at the end of the URL"
        )
    return f"{server} has no {which} ({OUT_OF_RANGE}): use a database the server has at the end of the URL"


# ---- the connection mixins that name the server in a misconfigured URL's errors

SERVER_ATTR = "kvstatus_server"
"""Attribute the connection mixins below set on a non-Redis reply's or a SELECT's error: ``host:port`` (or path)."""
DB_ATTR = "kvstatus_db"
"""Attribute set on a SELECT's "out of range" error: the database the URL asked for."""
DATABASES_ATTR = "kvstatus_databases"
"""Attribute set on a SELECT's "out of range" error: the server's ``databases`` (None: CONFIG GET refused)."""
OUT_OF_RANGE = "DB index is out of range"
"""Redis' (and Valkey's) reply to SELECT of a database the server does not have."""


def _server(connection: object) -> str:
    path = getattr(connection, "path", None)
    return str(path) if path else f"{getattr(connection, 'host', '?')}:{getattr(connection, 'port', '?')}"


def _named(exc: rx.RedisError, connection: object) -> bool:
    """Name the server on a non-Redis reply's error, or on the connect's SELECT out of range, which also gets
    :data:`DB_ATTR`; True for the latter (the connection is still on db 0, with nothing pending)."""
    if isinstance(exc, rx.InvalidResponse):
        setattr(exc, SERVER_ATTR, _server(connection))
        return False
    if not getattr(connection, "_kvstatus_connecting", False) or OUT_OF_RANGE not in str(exc):
        return False
    setattr(exc, SERVER_ATTR, _server(connection))
    setattr(exc, DB_ATTR, getattr(connection, "db", None))
    return True


def _databases(reply: object) -> Optional[int]:
    """``databases`` from a ``CONFIG GET databases`` reply (a flat list in RESP2, a map in RESP3)."""
    if isinstance(reply, dict):
        values = list(reply.values())
    elif isinstance(reply, (list, tuple)) and len(reply) == 2:
        values = [reply[1]]
    else:
        return None
    try:
        return int(values[0])
    except (IndexError, TypeError, ValueError):
        return None


class NamedServerConnection:
    """Mixin for redis-py's sync connections: sets :data:`SERVER_ATTR` (and for a database out of range
    :data:`DB_ATTR`, :data:`DATABASES_ATTR`) on the error, its type and text unchanged."""

    _kvstatus_connecting = False

    def on_connect_check_health(self, *args: object, **kwargs: object) -> object:
        self._kvstatus_connecting = True  # only the connect's SELECT is followed by a CONFIG GET
        try:
            return super().on_connect_check_health(*args, **kwargs)  # type: ignore[misc]
        finally:
            self._kvstatus_connecting = False

    def read_response(self, *args: object, **kwargs: object) -> object:
        try:
            return super().read_response(*args, **kwargs)  # type: ignore[misc]
        except (rx.InvalidResponse, rx.ResponseError) as exc:
            if _named(exc, self):
                try:
                    self.send_command("CONFIG", "GET", "databases")  # type: ignore[attr-defined]
                    setattr(exc, DATABASES_ATTR, _databases(super().read_response()))  # type: ignore[misc]
                except rx.RedisError:
                    setattr(exc, DATABASES_ATTR, None)  # refused (ACL), or the connection went: unknown
            raise


class AsyncNamedServerConnection:
    """:class:`NamedServerConnection` for redis.asyncio."""

    _kvstatus_connecting = False

    async def on_connect_check_health(self, *args: object, **kwargs: object) -> object:
        self._kvstatus_connecting = True
        try:
            return await super().on_connect_check_health(*args, **kwargs)  # type: ignore[misc]
        finally:
            self._kvstatus_connecting = False

    async def read_response(self, *args: object, **kwargs: object) -> object:
        try:
            return await super().read_response(*args, **kwargs)  # type: ignore[misc]
        except (rx.InvalidResponse, rx.ResponseError) as exc:
            if _named(exc, self):
                try:
                    await self.send_command("CONFIG", "GET", "databases")  # type: ignore[attr-defined]
                    setattr(exc, DATABASES_ATTR, _databases(await super().read_response()))  # type: ignore[misc]
                except rx.RedisError:
                    setattr(exc, DATABASES_ATTR, None)
            raise
