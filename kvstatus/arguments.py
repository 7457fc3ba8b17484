"""A store's arguments, checked and turned into what the scripts take: TTLs, statuses, batches, reasons and the
script mode, with their defaults and limits (no I/O)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from kvstatus.errors import InvalidArgumentError
from kvstatus.keys import MAX_ROOM, validate_rooms
from kvstatus.model import KVPoll, to_status

DEFAULT_TTL_SECONDS = 600.0
TOMBSTONE_TTL_SECONDS = 60.0
"""How long ``clear()``'s tombstone says who cleared a room and how it ended (never longer than the store's
``ttl``): what ``get`` shows of a cleared room, and how far back ``kvstatus health`` sees successes."""
MAX_TTL_SECONDS = 30 * 24 * 3600.0
MAX_REASON_BYTES = 2048
_TRUNCATED = " [truncated]"


STATUS_ARG = tuple(str(s.value) for s in KVPoll)
"""The script argument of each status, by its value ("0".."4")."""
# The exact types whose statuses the batch hot path indexes STATUS_ARG with directly (bool is not one).
_PLAIN_STATUS_TYPES = frozenset({KVPoll, int})


def ttl_to_ms(ttl: object) -> int:
    """Validate a TTL in seconds and return it in whole milliseconds (at least 1)."""
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not math.isfinite(ttl):
        raise InvalidArgumentError(f"invalid ttl {ttl!r}: expected a number of seconds")
    if not 0 < ttl <= MAX_TTL_SECONDS:
        raise InvalidArgumentError(
            f"invalid ttl {ttl!r}: expected seconds > 0 and at most "
            f"{MAX_TTL_SECONDS:.0f} ({MAX_TTL_SECONDS / 86400:g} days)"
        )
    return max(1, round(ttl * 1000))


def status_args(statuses: Iterable[KVPoll | int]) -> list[str]:
    """The script argument ("0".."4") of each status; raises :class:`InvalidStatusError` for a bad one."""
    values = list(statuses)
    if values and set(map(type, values)) <= _PLAIN_STATUS_TYPES and 0 <= min(values) and max(values) <= 4:
        return [STATUS_ARG[s] for s in values]
    return [STATUS_ARG[to_status(s)] for s in values]


def batch_args(updates: object) -> tuple[list[int], list[str]]:
    """The validated rooms of an ``update_many`` batch and the script argument of each one's status, pair by pair.

    Raises :class:`InvalidArgumentError` for a room that comes twice (a Mapping whose iteration yields it twice, or
    equal int subclasses a dict holds as two keys): one script decides every room of a batch from one read, so a
    second status would be decided without the first. A plain ``dict`` of ``int`` rooms, the hot path, cannot hold a
    room twice and pays no check.
    """
    if type(updates) is dict:
        rooms = list(updates)
        if rooms and set(map(type, rooms)) == {int} and 0 <= min(rooms) and max(rooms) <= MAX_ROOM:
            return rooms, status_args(updates.values())
    elif not isinstance(updates, Mapping):
        raise InvalidArgumentError(f"update_many expects a mapping of room -> status, not {type(updates).__name__}")
    # Rooms and statuses from one walk over items(), so a Mapping whose __iter__ and values() disagree pairs right.
    pairs = list(updates.items())
    rooms = validate_rooms([room for room, _ in pairs])
    if len(set(rooms)) != len(rooms):
        first: dict[int, int] = {}
        for i, room in enumerate(rooms):
            if room in first:
                raise InvalidArgumentError(
                    f"update_many got room {room} twice (batch positions {first[room]} and {i}): a batch holds "
                    "each room once; send updates of one room in order, in separate calls"
                )
            first[room] = i
    return rooms, status_args([status for _, status in pairs])


def truncate_reason(reason: object) -> str:
    """Return ``reason`` cut to :data:`MAX_REASON_BYTES` of UTF-8, marked when cut; raise
    :class:`InvalidArgumentError` for a non-string, or a lone surrogate (undecodable bytes of ``sys.argv``)."""
    if not isinstance(reason, str):
        raise InvalidArgumentError(f"invalid reason {reason!r}: expected a string")
    try:
        data = reason.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidArgumentError(
            f"invalid reason {reason[:60]!r}: not valid UTF-8 text (character "
            f"{exc.start}, {reason[exc.start]!r}, is a lone surrogate, e.g. from bytes "
            "that were not UTF-8)"
        ) from None
    if len(data) <= MAX_REASON_BYTES:
        return reason
    keep = MAX_REASON_BYTES - len(_TRUNCATED)
    return data[:keep].decode("utf-8", "ignore") + _TRUNCATED


SCRIPT_MODES = ("eval", "functions")
"""How a store runs the Lua of ``lua/``: ``eval`` (EVALSHA, loaded by the client itself on NOSCRIPT) or
``functions`` (FCALL / FCALL_RO of the function library an admin loaded, see :data:`kvstatus.scripts.LIBRARY`)."""


def validate_script_mode(mode: object) -> str:
    """Return ``mode`` if it is one of :data:`SCRIPT_MODES`; raise :class:`InvalidArgumentError`."""
    if mode not in SCRIPT_MODES:
        raise InvalidArgumentError(f"invalid scripts {mode!r}: expected one of {', '.join(SCRIPT_MODES)}")
    return str(mode)


MIN_LEASE_TTL = 3.0
MAX_LEASE_TTL = 3600.0
"""A lease TTL's bounds (seconds)."""


def validate_lease_ttl(ttl: object) -> float:
    """Return ``ttl`` (seconds) if it is a lease TTL in [3, 3600]; raise :class:`InvalidArgumentError`."""
    if (
        isinstance(ttl, bool)
        or not isinstance(ttl, (int, float))
        or not math.isfinite(ttl)
        or not MIN_LEASE_TTL <= ttl <= MAX_LEASE_TTL
    ):
        raise InvalidArgumentError(
            f"invalid lease_ttl {ttl!r}: expected seconds in [{MIN_LEASE_TTL:g}, {MAX_LEASE_TTL:g}] (a renewal every "
            "ttl/3 s keeps the renewals at most one per second; see the README on choosing it)"
        )
    return float(ttl)
