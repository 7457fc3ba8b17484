"""Key schema (docs/design.md ("Data model")), the checks of names and a store's other arguments (no I/O), and
what a participant's name says. Room fields beyond that section's: ``inc:<participant>`` (:func:`incarnation_field`)
and ``t:<participant>`` (:func:`timeline_field`). No key but a room's ends with ``}``, so the room SCAN pattern never
matches one."""

from __future__ import annotations

import functools
import math
import re
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Iterable, NamedTuple, Optional, TypeGuard

from kvstatus.errors import InvalidArgumentError, InvalidNameError, InvalidRoomError, mask_url

MAX_ROOM = 2**63 - 1
MAX_NAME_LENGTH = 128
DEFAULT_PREFIX = "kvstatus"
DEFAULT_PARTICIPANT = "default"
PROBE_PARTICIPANT = "kvstatus-doctor-probe"
"""The participant of ``kvstatus doctor``'s and the SGLang start-up check's entries; operator views leave it out."""
REASON_FIELD_PREFIX = "reason:"
LATE_FIELD_PREFIX = "late:"
INCARNATION_FIELD_PREFIX = "inc:"
TIMELINE_FIELD_PREFIX = "t:"
TOMBSTONE_SUFFIX = ":t"
FATE_FIELD = "room:fate"
"""The room field of its first failure, ``<ms>:<stage>:<origin>:<reason>`` (no name holds a colon)."""
ADDRESS_FIELD = "addr"
"""The lease record's field of the holder's address (``host:port``; lua/lease.lua writes it at the acquire)."""
LEASE_PART = "lease:"

_NAME = re.compile(r"[A-Za-z0-9_.-]+")


def validate_name(value: object, what: str) -> str:
    """Return ``value`` if it is a valid prefix, namespace or participant; raise :class:`InvalidNameError`."""
    if not isinstance(value, str):
        raise InvalidNameError(f"invalid {what} {value!r}: expected a string")
    if not _NAME.fullmatch(value) or len(value) > MAX_NAME_LENGTH:
        shown = repr(mask_url(value))  # a URL pasted into the wrong option must not print its password
        raise InvalidNameError(
            f"invalid {what} {shown}: use 1..{MAX_NAME_LENGTH} characters from A-Z a-z 0-9 _ . - "
            "(no braces, glob characters, colons or whitespace)"
        )
    return value


_ADDRESS = re.compile(r"[A-Za-z0-9_.\-\[\]:]{1,253}:[0-9]{1,5}")


def validate_address(value: object) -> str:
    """``value`` if it is ``host:port`` (a host name, IPv4 or bracketed IPv6); raises :class:`InvalidArgumentError`."""
    if not isinstance(value, str) or not _ADDRESS.fullmatch(value) or not 0 < int(value.rsplit(":", 1)[1]) < 65536:
        raise InvalidArgumentError(f"invalid address {value!r}: expected host:port, e.g. 10.0.0.7:8998")
    return value


def validate_room(room: object) -> int:
    """Return ``room`` if it is an int in [0, 2**63 - 1]; raise :class:`InvalidRoomError`."""
    if isinstance(room, bool) or not isinstance(room, int):
        raise InvalidRoomError(f"invalid room {room!r} ({type(room).__name__}): expected an int in [0, 2**63 - 1]")
    if not 0 <= room <= MAX_ROOM:
        raise InvalidRoomError(f"invalid room {room}: expected an int in [0, 2**63 - 1]")
    return int(room)


def validate_rooms(rooms: Iterable[object]) -> list[int]:
    """:func:`validate_room` over a batch; plain ints in range are checked inline (the hot path)."""
    checked = list(rooms)
    if checked and set(map(type, checked)) == {int}:
        ints = typing.cast("list[int]", checked)
        if 0 <= min(ints) and max(ints) <= MAX_ROOM:
            return ints
    return [validate_room(room) for room in checked]


def room_batch(rooms: object, operation: str) -> list[int]:
    """:func:`validate_rooms` of ``operation``'s batch; raises InvalidArgumentError for a str, bytes or mapping."""
    if isinstance(rooms, (str, bytes, bytearray, Mapping)) or not isinstance(rooms, Iterable):
        raise InvalidArgumentError(f"{operation} expects an iterable of room ids, not {type(rooms).__name__}")
    return validate_rooms(rooms)


@dataclass(frozen=True)
class KeySchema:
    """Builds and parses the keys of one namespace."""

    namespace: str
    prefix: str = DEFAULT_PREFIX

    def __post_init__(self) -> None:
        validate_name(self.prefix, "prefix")
        validate_name(self.namespace, "namespace")

    @functools.cached_property
    def base(self) -> str:
        """``<prefix>:<namespace>:``, the start of every key of this namespace."""
        return f"{self.prefix}:{self.namespace}:"

    @property
    def scan_pattern(self) -> str:
        """SCAN MATCH pattern for every room key of this namespace (names hold no glob characters)."""
        return f"{self.base}{{*}}"

    def room_key(self, room: int) -> str:
        """Key of a validated room id."""
        return f"{self.base}{{{room}}}"

    def room_keys(self, rooms: Iterable[int]) -> list[str]:
        """Keys of validated room ids (the batch path, tuned: BENCHMARKS.md, "The batch paths' Python")."""
        head = self.base + "{"
        return [f"{head}{room}}}" for room in rooms]

    def tombstone_key(self, room: int) -> str:
        """Key of a validated room's tombstone: the room key plus ``:t``, in the room's slot."""
        return self.room_key(room) + TOMBSTONE_SUFFIX

    @staticmethod
    def tombstone_of(room_key: str) -> str:
        """The tombstone key of a room key built by :meth:`room_key`."""
        return room_key + TOMBSTONE_SUFFIX

    @property
    def database_marker_key(self) -> str:
        """The near cache's database marker (``<prefix>:<namespace>:db``): a random id by which it notices SWAPDB."""
        return f"{self.base}db"

    def lease_key(self, participant: str) -> str:
        """Key of a validated participant's lease record."""
        return f"{self.base}{LEASE_PART}{participant}"

    @property
    def lease_index_key(self) -> str:
        """Key of the namespace's lease index (:mod:`kvstatus.peerwatch`): participant -> its lease mark."""
        return f"{self.base}leases"

    def presence_channel(self, participant: str) -> str:
        """Channel a lease holder of ``participant`` stays subscribed to; the namespace is its hash tag (one shard)."""
        return f"{self.base}presence:{{{self.namespace}}}:{participant}"

    @property
    def presence_pattern(self) -> str:
        """ACL channel pattern of the namespace's presence channels."""
        return f"{self.base}presence:*"

    @property
    def lease_pattern(self) -> str:
        """SCAN MATCH pattern for every lease record of this namespace."""
        return f"{self.base}{LEASE_PART}*"

    def participant_of_lease(self, key: str | bytes) -> Optional[str]:
        """Participant of a lease key of this namespace, or None for any other key."""
        text = key.decode(errors="replace") if isinstance(key, bytes) else key
        head = self.base + LEASE_PART
        if not text.startswith(head) or not _NAME.fullmatch(text[len(head) :]):
            return None
        return text[len(head) :]

    def room_of(self, key: str | bytes) -> Optional[int]:
        """Room id of a key of this namespace, or None for any other key."""
        text = key.decode(errors="replace") if isinstance(key, bytes) else key
        digits = text[len(self.base) + 1 : -1]
        if not (text.startswith(self.base + "{") and text.endswith("}") and digits.isdigit() and digits.isascii()):
            return None
        room = int(digits)
        return room if room <= MAX_ROOM else None


def reason_field(participant: str) -> str:
    return REASON_FIELD_PREFIX + participant


def incarnation_field(participant: str) -> str:
    """Room field holding the lease epoch of the incarnation of ``participant`` that last wrote its entry."""
    return INCARNATION_FIELD_PREFIX + participant


def timeline_field(participant: str) -> str:
    """Room field holding the timeline of ``participant``'s entry (:mod:`kvstatus.timeline`)."""
    return TIMELINE_FIELD_PREFIX + participant


def late_field(participant: str) -> str:
    """Tombstone field noting a late Failed of ``participant`` after its clear."""
    return LATE_FIELD_PREFIX + participant


# ---- what a participant's name says: its role and its instance

ROLES: tuple[str, ...] = ("prefill", "decode")
OTHER = "other"
_RANK = re.compile(r"(dp|adp|cp|tp|pp)[0-9]+")


class Naming(NamedTuple):
    """``role`` (prefill, decode or other) and ``instance`` of a :func:`kvstatus.sglang.manager.participant_name`
    name: the name without its rank parts (``prefill-a`` for ``prefill-a-tp3-pp0``), what fleet views group by. Any
    other name has role ``other`` and is its own instance."""

    role: str
    instance: str


def naming(participant: str) -> Naming:
    """The role and instance of ``participant`` (see :class:`Naming`)."""
    parts = participant.split("-")
    if parts[0] not in ROLES:
        return Naming(OTHER, participant)
    while len(parts) > 1 and _RANK.fullmatch(parts[-1]):
        parts.pop()
    return Naming(parts[0], "-".join(parts))


def role_of(participant: str) -> str:
    """``prefill``, ``decode`` or ``other``."""
    return naming(participant).role


def is_decode(participant: str) -> bool:
    """True when ``participant`` is a decode by the naming (a room's other fields, ``reason:...``, never are)."""
    return naming(participant).role == "decode"


# ---- a store's other arguments

DEFAULT_TTL_SECONDS = 600.0
TOMBSTONE_TTL_SECONDS = 60.0
"""How long ``clear()``'s tombstone lives (seconds, never longer than the store's ``ttl``)."""
MAX_TTL_SECONDS = 30 * 24 * 3600.0
MAX_REASON_BYTES = 2048
_TRUNCATED = " [truncated]"


def _is_seconds(value: object) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def ttl_to_ms(ttl: object) -> int:
    """Validate a TTL in seconds and return it in whole milliseconds (at least 1)."""
    if not _is_seconds(ttl):
        raise InvalidArgumentError(f"invalid ttl {ttl!r}: expected a number of seconds")
    if not 0 < ttl <= MAX_TTL_SECONDS:
        raise InvalidArgumentError(
            f"invalid ttl {ttl!r}: expected seconds > 0 and at most "
            f"{MAX_TTL_SECONDS:.0f} ({MAX_TTL_SECONDS / 86400:g} days)"
        )
    return max(1, round(ttl * 1000))


def truncate_reason(reason: object) -> str:
    """``reason`` cut to :data:`MAX_REASON_BYTES` of UTF-8, marked when cut; raises :class:`InvalidArgumentError`
    for a non-string or a lone surrogate."""
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
"""How a store runs ``lua/``: ``eval`` (EVALSHA, loaded on NOSCRIPT) or ``functions`` (FCALL of
:data:`kvstatus.scripts.LIBRARY`, loaded by an admin)."""


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
    if not _is_seconds(ttl) or not MIN_LEASE_TTL <= ttl <= MAX_LEASE_TTL:
        raise InvalidArgumentError(
            f"invalid lease_ttl {ttl!r}: expected seconds in [{MIN_LEASE_TTL:g}, {MAX_LEASE_TTL:g}] (a renewal every "
            "ttl/3 s keeps the renewals at most one per second; see the README on choosing it)"
        )
    return float(ttl)
