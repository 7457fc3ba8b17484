"""Every decision of the send loop, as plain functions (no I/O); :mod:`kvstatus._async.sender` performs them."""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any, Optional, TypeVar

from redis.exceptions import NoScriptError, ResponseError

from kvstatus.connection import is_cluster_client, is_sentinel_client
from kvstatus.deadline import may_wait
from kvstatus.errors import ClientPoolExhausted
from kvstatus.model import StoreObserver
from kvstatus.replies import ReplyOrError, subscriber_counts
from kvstatus.requests import Call, Request
from kvstatus.scripts import LuaScript
from kvstatus.translate import translate_error
from kvstatus.url import ConnectionOptions

T = TypeVar("T")


def failover_delays(client: object, options: Optional[ConnectionOptions]) -> tuple[float, ...]:
    """Seconds to wait before each resend of a whole store call that met an unavailable backend: cluster and
    Sentinel clients only (redis-py reports a dead node or a demoted master before the topology has moved); a
    standalone client retries each command itself, so it gets no second layer."""
    if not (is_cluster_client(client) or is_sentinel_client(client)):
        return ()
    return (options or ConnectionOptions()).retry_delays()


SHARD_NUMSUB = "PUBSUB SHARDNUMSUB"


def _shard_subscribers(command: str, res: dict[str, object], **options: object) -> list[tuple[str, int]]:
    """A cluster client's merge of its nodes' ``PUBSUB SHARDNUMSUB`` replies: (channel, subscribers) pairs."""
    return list(subscriber_counts(res).items())


def merge_shard_counts(client: object) -> None:
    """Make a cluster ``client`` merge ``PUBSUB SHARDNUMSUB`` replies that the presence counts can read:
    redis-py 8.2's own merge expects (channel, count) pairs where a node answers a flat list, so it always raises
    ValueError: replacing it costs a caller's client nothing. Older redis-py passes the reply through."""
    callbacks = getattr(client, "result_callbacks", None)
    if isinstance(callbacks, MutableMapping):
        callbacks[SHARD_NUMSUB] = _shard_subscribers


def pool_exhausted(limit: int, waited: float) -> BaseException:
    """The error of a call that waited at the gate until its deadline (nothing was sent)."""
    return translate_error(ClientPoolExhausted(limit, waited))


def observe_result(metrics: StoreObserver, operation: str, result: Any) -> None:
    """Tell ``metrics`` what a call returned: the rule's outcomes of ``update_status`` and ``update_many``, and
    the timeline of an entry a ``clear`` or ``pop`` removed (to an observer with the optional ``on_cleared``)."""
    if operation == "update_status":
        metrics.on_update(result)
    elif operation == "update_many":
        metrics.on_updates(result.values())
    elif operation in ("clear", "pop") and result.timeline:
        on_cleared = getattr(metrics, "on_cleared", None)
        if on_cleared is not None:
            on_cleared(result.timeline)


def observe_error(metrics: StoreObserver, exc: BaseException) -> None:
    """Tell ``metrics`` of an error raised to the caller; ``check_status``'s KeyError is an answer, not an error."""
    if not isinstance(exc, KeyError):
        metrics.on_error(exc)


def may_resend(delay: float) -> bool:
    """True if a resend after ``delay`` seconds still starts before the running call's deadline."""
    return may_wait(delay)


def noscript_resend(calls: list[Call], replies: list[ReplyOrError], as_eval: bool) -> tuple[list[int], list[Call]]:
    """The script calls whose reply is NOSCRIPT: their indices, and the calls to send again in their place.
    ``as_eval`` False: the same EVALSHA (after SCRIPT LOAD of :func:`scripts_of` them), but an ``EVALSHA_RO`` at
    once as ``EVAL_RO`` (CLIENT PAUSE WRITE would hold a plain EVALSHA of an unknown script for the whole pause);
    True: ``EVAL`` with the script's source, which no SCRIPT FLUSH can make fail."""
    indices = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError) and calls[i].script]
    return indices, [calls[i].as_eval() if as_eval or calls[i].args[0] == "EVALSHA_RO" else calls[i] for i in indices]


def scripts_of(calls: list[Call]) -> list[LuaScript]:
    """The distinct scripts of the ``EVALSHA`` calls among ``calls``, each to SCRIPT LOAD once."""
    return list(
        {
            call.script.sha: call.script for call in calls if call.script is not None and call.args[0] == "EVALSHA"
        }.values()
    )


def as_evalsha(request: Request[T]) -> Request[T]:
    """``request`` with every ``EVALSHA_RO`` sent as ``EVALSHA`` (a sender whose server refused ``EVALSHA_RO``)."""
    request.calls = [call.without_ro() for call in request.calls]
    return request


_RO_COMMANDS = ("EVALSHA_RO", "EVAL_RO")


def evalsha_fallback(calls: list[Call], replies: list[ReplyOrError]) -> tuple[list[int], list[Call]]:
    """The read-only script calls the server refused as a command (unknown: Redis < 7, fakeredis; or not granted
    by the ACL), and ``calls`` with those as EVALSHA / EVAL; ([], calls) when there is none. The sender resends
    ``calls[i]`` for each index and sends ``EVALSHA`` from then on."""
    indices = [
        i
        for i, reply in enumerate(replies)
        if isinstance(reply, ResponseError) and calls[i].args[0] in _RO_COMMANDS and _refuses(reply)
    ]
    if not indices:
        return indices, calls
    changed = list(calls)
    for i in indices:
        changed[i] = changed[i].without_ro()
    return indices, changed


def _refuses(reply: ResponseError) -> bool:
    """Whether ``reply`` refuses the command itself (unknown, or not granted by the ACL), not the script."""
    text = str(reply).lower()
    return (
        text.startswith("unknown command")
        or "no permissions to run the 'evalsha_ro' command" in text
        or "no permissions to run the 'eval_ro' command" in text
    )


def merge(replies: list[ReplyOrError], indices: list[int], resent: list[ReplyOrError]) -> None:
    """Put the replies of resent calls in their places."""
    for i, reply in zip(indices, resent):
        replies[i] = reply


def checked(calls: list[Call], replies: list[ReplyOrError]) -> list[ReplyOrError]:
    """``replies`` if none is an error; else raise the first error as its kvstatus error."""
    for call, reply in zip(calls, replies):
        if isinstance(reply, Exception):
            error = translate_error(reply, call)
            if error is reply:
                raise reply
            raise error from reply
    return replies
