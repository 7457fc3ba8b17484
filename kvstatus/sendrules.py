"""Every decision of the send loop, as plain functions (no I/O); :mod:`kvstatus._async.sender` performs them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

from redis.exceptions import NoScriptError, ResponseError

from kvstatus.deadline import may_wait
from kvstatus.errors import ClientPoolExhausted
from kvstatus.translate import translate_error

if TYPE_CHECKING:  # annotations only: the rules stay a layer below the replies and the connections
    from kvstatus.model import StoreObserver
    from kvstatus.replies import ReplyOrError
    from kvstatus.requests import Call, Request
    from kvstatus.scripts import LuaScript

T = TypeVar("T")


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
