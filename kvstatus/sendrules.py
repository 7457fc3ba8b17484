"""Every decision of the send loop, as plain functions (no I/O): which delays a failover gets, which
calls to resend after NOSCRIPT, how replies and errors are reported. :mod:`kvstatus._async.sender`
(and its generated sync twin) performs them.
"""

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


SHARD_NUMSUB = "PUBSUB SHARDNUMSUB"


def _shard_subscribers(command: str, res: dict[str, object], **options: object) -> list[tuple[str, int]]:
    """A cluster client's merge of its nodes' ``PUBSUB SHARDNUMSUB`` replies: (channel, subscribers) pairs."""
    return list(subscriber_counts(res).items())


def merge_shard_counts(client: object) -> None:
    """Make a cluster ``client`` merge ``PUBSUB SHARDNUMSUB`` replies that the presence counts can read.

    redis-py 8.2 keys its cluster result callbacks by the two-word command and merges SHARDNUMSUB as if each
    node answered (channel, count) pairs; a node answers a flat list, so every count raised ValueError and no
    peer's presence was ever seen on a cluster. The merge replaced here is never right, so a client passed in
    by the caller loses nothing it had. Older redis-py returns the node's reply as it is: both decode the same.
    """
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

    ``as_eval`` False: the same EVALSHA (after SCRIPT LOAD of :func:`scripts_of` them), but an
    ``EVALSHA_RO`` at once as ``EVAL_RO`` with its source: one round trip, and CLIENT PAUSE WRITE holds
    neither (it holds a plain EVALSHA of a script the server does not know for the whole pause);
    True: ``EVAL`` with the script's source, which no SCRIPT FLUSH can make fail.
    """
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
    """The read-only script calls the server refused as a command, and ``calls`` with those as EVALSHA / EVAL.

    Refused: an unknown command (Redis < 7, fakeredis) or one the ACL does not grant (a recipe from before
    ``EVALSHA_RO``). Returns ([], calls) when there is none; otherwise the sender resends ``calls[i]`` for
    each index and sends ``EVALSHA`` from then on.
    """
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
