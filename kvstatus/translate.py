"""redis-py errors -> kvstatus errors: one place decides what a Redis failure means to a caller."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Optional

from redis import exceptions as rx
from redis.sentinel import MasterNotFoundError

from kvstatus.errors import (
    AuthenticationError,
    BackendError,
    BackendUnavailableError,
    CorruptedValueError,
    KVStatusError,
    PermissionDeniedError,
)
from kvstatus.operations import Call
from kvstatus.redact import mask_url
from kvstatus.scripts import LuaScript

_CORRUPT = "KVSTATUS_CORRUPT "
# Redis 7 names the script line, not the command, when a script's redis.call is denied by ACL.
_SCRIPT_NOPERM = "The user executing the script can't run this command"
_SCRIPT_LINE = re.compile(r"@user_script:(\d+)")
_LUA_CALL = re.compile(r"redis\.p?call\(\s*[\"'](\w+)[\"']")


def scripts_to_reload(calls: Sequence[Call], replies: Sequence[Any]) -> list[int]:
    """Indices of pipelined script calls that failed with NOSCRIPT and must be sent again."""
    return [i for i, reply in enumerate(replies) if isinstance(reply, rx.NoScriptError) and calls[i].script]


def unique_scripts(calls: Sequence[Call], indices: Sequence[int]) -> list[LuaScript]:
    return list({calls[i].script.sha: calls[i].script for i in indices if calls[i].script}.values())


def raise_first_error(calls: Sequence[Call], replies: Sequence[Any]) -> None:
    for call, reply in zip(calls, replies):
        if isinstance(reply, Exception):
            raise translate_error(reply, call) from reply


REDIS_ERRORS = (rx.RedisError, rx.RedisClusterException)
"""What redis-py raises; RedisClusterException (no reachable node, no slot map) is no RedisError."""


def translate_error(exc: BaseException, call: Optional[Call] = None) -> BaseException:
    """The kvstatus error for a redis-py exception; other exceptions pass through unchanged."""
    if isinstance(exc, KVStatusError) or not isinstance(exc, REDIS_ERRORS):
        return exc
    text = mask_url(str(exc))
    if isinstance(exc, MasterNotFoundError):
        # redis-py appends a repr of every Sentinel client; keep the sentence, name the cause.
        head = text.partition(" : ")[0]
        if "auth:AuthenticationError" in text:
            return AuthenticationError(f"the Sentinels refused the credentials (sentinel_username/"
                                       f"sentinel_password): {head}")
        return BackendUnavailableError(f"Redis unavailable (after the configured retries): {head} "
                                       "(no Sentinel reachable, or none knows that service)")
    if isinstance(exc, rx.RedisClusterException):
        if isinstance(exc.__cause__, rx.AuthenticationError):
            return AuthenticationError(f"Redis refused the credentials: {text}")
        return BackendUnavailableError(f"Redis unavailable (after the configured retries): {text}")
    if isinstance(exc, rx.AuthenticationError):
        return AuthenticationError(f"Redis refused the credentials: {text}")
    if isinstance(exc, (rx.ConnectionError, rx.TimeoutError, rx.BusyLoadingError, rx.ClusterDownError,
                        rx.ReadOnlyError, rx.TryAgainError, rx.MasterDownError)):
        return BackendUnavailableError(f"Redis unavailable (after the configured retries): {text}")
    if isinstance(exc, rx.NoPermissionError):
        return PermissionDeniedError(f"Redis ACL denied the request: {text}")
    if _SCRIPT_NOPERM in text:
        command = script_command_at(call, text)
        return PermissionDeniedError(
            f"Redis ACL denied the request: this user has no permissions to run the '{command}' command "
            f"(called inside the kvstatus script {call.script.name if call and call.script else '?'})"
        )
    if text.startswith(_CORRUPT):
        return CorruptedValueError(text[len(_CORRUPT) :].split(" script:")[0])
    if text.startswith("WRONGTYPE"):
        where = f"key {_first_key(call)}" if call and _first_key(call) else "a room key"
        return CorruptedValueError(f"{where} holds a value that is not a kvstatus room hash; left as it is")
    return BackendError(f"Redis error: {text}")


def _first_key(call: Call) -> Optional[str]:
    args = call.args
    if args[0] == "EVALSHA":
        return str(args[3]) if args[2] == 1 else None
    return str(args[1]) if len(args) > 1 else None


def script_command_at(call: Optional[Call], text: str) -> str:
    """The Redis command called on the script line named in ``text`` (lower case), or "unknown"."""
    line = _SCRIPT_LINE.search(text)
    if call is None or call.script is None or line is None:
        return "unknown"
    lines = call.script.source.splitlines()
    number = int(line.group(1))
    found = _LUA_CALL.search(lines[number - 1]) if 0 < number <= len(lines) else None
    return found.group(1).lower() if found else "unknown"
