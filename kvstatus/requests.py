"""A store operation as plain data (no I/O, built by :mod:`kvstatus.operations`): the calls of one round trip and how
to decode their replies; and the send path's rules: which command carries a script call, which to send again."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Generic, NamedTuple, Optional, TypeVar, Union

from redis.exceptions import NoScriptError, ResponseError

from kvstatus.scripts import LuaScript, function_name

if TYPE_CHECKING:
    from kvstatus.replies import ReplyOrError

T = TypeVar("T")
_RO_COMMANDS = ("EVALSHA_RO", "EVAL_RO")

Arg = Union[str, bytes, int, float]
"""One argument of a Redis command, as redis-py encodes it (the command's name, a key, a script's argument)."""


class Call(NamedTuple):
    """One Redis command; ``script`` is set when ``args`` runs that script (EVALSHA, EVALSHA_RO for a read-only
    script, or FCALL / FCALL_RO of its function). ``route``: on a cluster, the key or shard channel whose node
    gets a command that names none (``PUBSUB SHARDNUMSUB``)."""

    args: tuple[Any, ...]  # Arg values, but the send paths pass args[3] (a script call's first key) on as a str
    script: Optional[LuaScript] = None
    route: Optional[str] = None

    def as_eval(self) -> Call:
        """The same script call sent with its source (``EVAL``; ``EVAL_RO`` for an ``EVALSHA_RO``)."""
        assert self.script is not None
        command = "EVAL_RO" if self.args[0] == "EVALSHA_RO" else "EVAL"
        return Call((command, self.script.source, *self.args[2:]), self.script)

    def without_ro(self) -> Call:
        """``EVALSHA_RO`` / ``EVAL_RO`` as plain ``EVALSHA`` / ``EVAL`` (Redis < 7, fakeredis); others as they are."""
        command = self.args[0]
        return Call((command[:-3], *self.args[1:]), self.script) if command in _RO_COMMANDS else self


@dataclass(slots=True, eq=False)
class Request(Generic[T]):
    """What one store method sends: ``calls`` in one round trip, and ``decode`` of their replies (same order).
    ``extra_seconds`` is added to the call's deadline. ``strict``: how many leading calls fail the request with their
    error (None: all); the errors of the calls after them reach ``decode`` in place."""

    calls: list[Call]
    decode: Callable[[list[Any]], T]
    extra_seconds: float = 0.0
    strict: Optional[int] = None


def script_call(script: LuaScript, keys: list[str], args: Iterable[Arg]) -> Call:
    """``EVALSHA`` of ``script``, ``EVALSHA_RO`` for a read-only one (never held by CLIENT PAUSE WRITE)."""
    return Call(("EVALSHA_RO" if script.read_only else "EVALSHA", script.sha, len(keys), *keys, *args), script)


def as_fcall(call: Call) -> Call:
    """The FCALL (FCALL_RO for a read-only script) of the function that holds ``call``'s script; others as they are."""
    script = call.script
    if script is None or call.args[0] not in ("EVALSHA", "EVALSHA_RO"):
        return call
    command = "FCALL_RO" if script.read_only else "FCALL"
    return Call((command, function_name(script), *call.args[2:]), script)


def as_functions(request: Request[T]) -> Request[T]:
    """``request`` with every EVALSHA of a kvstatus script as the FCALL of its function (``scripts="functions"``)."""
    request.calls = [as_fcall(call) for call in request.calls]
    return request


def noscript_resend(calls: list[Call], replies: list[ReplyOrError], as_eval: bool) -> tuple[list[int], list[Call]]:
    """The script calls whose reply is NOSCRIPT: their indices, and the calls to send again in their place.
    ``as_eval`` False: the same EVALSHA (after SCRIPT LOAD of :func:`scripts_of` them), but an ``EVALSHA_RO`` at
    once as ``EVAL_RO`` (CLIENT PAUSE WRITE would hold a plain EVALSHA of an unknown script for the whole pause);
    True: ``EVAL`` with the script's source, which no SCRIPT FLUSH can make fail."""
    indices = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError) and calls[i].script]
    return indices, [calls[i].as_eval() if as_eval or calls[i].args[0] == "EVALSHA_RO" else calls[i] for i in indices]


def scripts_of(calls: list[Call]) -> list[LuaScript]:
    """The distinct scripts of the ``EVALSHA`` calls among ``calls``, each to SCRIPT LOAD once."""
    found = {call.script.sha: call.script for call in calls if call.script is not None and call.args[0] == "EVALSHA"}
    return list(found.values())


def as_evalsha(request: Request[T]) -> Request[T]:
    """``request`` with every ``EVALSHA_RO`` as ``EVALSHA`` (a cluster client's, or after the server refused it)."""
    request.calls = [call.without_ro() for call in request.calls]
    return request


def evalsha_fallback(calls: list[Call], replies: list[ReplyOrError]) -> tuple[list[int], list[Call]]:
    """The indices of the read-only script calls the server refused as a command (unknown: Redis < 7, fakeredis; or
    not granted by the ACL), and ``calls`` with those as EVALSHA / EVAL; ([], calls) when there is none."""
    indices = [i for i, reply in enumerate(replies) if isinstance(reply, ResponseError) and _refuses(calls[i], reply)]
    if not indices:
        return indices, calls
    return indices, [call.without_ro() if i in indices else call for i, call in enumerate(calls)]


def _refuses(call: Call, reply: ResponseError) -> bool:
    """Whether ``reply`` refuses the read-only script ``call``'s command (unknown, or not granted by the ACL)."""
    text = str(reply).lower()
    denied = [f"no permissions to run the '{command.lower()}' command" for command in _RO_COMMANDS]
    refused = text.startswith("unknown command") or any(message in text for message in denied)
    return refused and call.args[0] in _RO_COMMANDS


def merge(replies: list[ReplyOrError], indices: list[int], resent: list[ReplyOrError]) -> None:
    """Put the replies of resent calls in their places."""
    for i, reply in zip(indices, resent):
        replies[i] = reply
