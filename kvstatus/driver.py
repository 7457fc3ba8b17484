"""What the sync and async stores share around their I/O: attributes, error
translation and the bookkeeping of NOSCRIPT healing."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Callable, ClassVar, Optional, TypeVar

from redis import exceptions as rx
from redis.cluster import RedisCluster

from kvstatus.connection import DEFAULT_URL, ConnectionOptions, mask_url
from kvstatus.errors import (
    AuthenticationError,
    BackendError,
    BackendUnavailableError,
    CorruptedValueError,
    KVStatusError,
    PermissionDeniedError,
)
from kvstatus.keys import DEFAULT_PREFIX, KeySchema
from kvstatus.operations import DEFAULT_TTL_SECONDS, Call, StoreCore
from kvstatus.scripts import LuaScript
from kvstatus.status import Policy

_CORRUPT = "KVSTATUS_CORRUPT "
# Redis 7 names the script line, not the command, when a script's redis.call is denied by ACL.
_SCRIPT_NOPERM = "The user executing the script can't run this command"
_SCRIPT_LINE = re.compile(r"@user_script:(\d+)")
_LUA_CALL = re.compile(r"redis\.p?call\(\s*[\"'](\w+)[\"']")
S = TypeVar("S", bound="StoreBase")


def is_cluster_client(client: Any) -> bool:
    """True for redis-py cluster clients (sync or async), whose batches are split by slot."""
    from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

    return isinstance(client, (RedisCluster, AsyncRedisCluster))


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
    ) -> None:
        self.client = client
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
        client = cls._connect(url, options, **option_overrides)
        return cls(client, namespace=namespace, participant=participant, prefix=prefix, ttl=ttl, policy=policy)

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
        return type(self)(self.client, **{**self._core.settings(), "participant": participant})

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(namespace={self.namespace!r}, participant={self.participant!r}, "
            f"prefix={self.prefix!r}, ttl={self.ttl:g}, policy={self.policy.value!r})"
        )


def scripts_to_reload(calls: Sequence[Call], replies: Sequence[Any]) -> list[int]:
    """Indices of pipelined script calls that failed with NOSCRIPT and must be sent again."""
    return [i for i, reply in enumerate(replies) if isinstance(reply, rx.NoScriptError) and calls[i].script]


def unique_scripts(calls: Sequence[Call], indices: Sequence[int]) -> list[LuaScript]:
    return list({calls[i].script.sha: calls[i].script for i in indices if calls[i].script}.values())


def raise_first_error(calls: Sequence[Call], replies: Sequence[Any]) -> None:
    for call, reply in zip(calls, replies):
        if isinstance(reply, Exception):
            raise translate_error(reply, call) from reply


def translate_error(exc: BaseException, call: Optional[Call] = None) -> BaseException:
    """The kvstatus error for a redis-py exception; other exceptions pass through unchanged."""
    if isinstance(exc, KVStatusError) or not isinstance(exc, rx.RedisError):
        return exc
    text = mask_url(str(exc))
    if isinstance(exc, rx.AuthenticationError):
        return AuthenticationError(f"Redis refused the credentials: {text}")
    if isinstance(exc, (rx.ConnectionError, rx.TimeoutError, rx.BusyLoadingError, rx.ClusterDownError)):
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
