"""The one validating parser of values read back from Redis (no I/O).

A tenant with write access to its namespace (or a buggy writer) can put anything into the keys kvstatus
reads: a 16-digit epoch, ``inf`` as a stamp, a 20-digit failure time, a 1 MiB timeline, a string where a hash
belongs. Every reader parses what it reads with the functions here, and the scripts with ``lua/lib/stored.lua``,
which applies the same accept/reject rule to the same value (``tests/core/test_stored_values.py`` runs each
junk value through both). A value either rule refuses is one kvstatus never writes.

The ``parse_*`` functions raise :class:`~kvstatus.errors.CorruptedValueError` naming the key and field, and
nothing else, whatever the value (bytes or str, any length). What each reader then does (fail the call, read
it as absent, skip and count it) is in docs/security.md.
"""

from __future__ import annotations

import re
from typing import Optional

from kvstatus.errors import CorruptedValueError
from kvstatus.model import FailureRecord, KVPoll, Stage, Step

MAX_INT = 999_999_999_999_999
"""The largest epoch, stamp or lease deadline (15 digits: what ``lua/update.lua`` takes as an epoch)."""
MAX_TIME_MS = 253_402_300_799_999
"""The latest time a failure record may hold: 9999-12-31T23:59:59.999Z in Unix ms, the last a reader can show."""
MAX_TEXT_BYTES = 2048
"""The longest reason in UTF-8 bytes (:data:`kvstatus.arguments.MAX_REASON_BYTES`; the scripts refuse longer)."""
MAX_NAME_BYTES = 128
"""The longest participant or origin name (:data:`kvstatus.keys.MAX_NAME_LENGTH`)."""
TIMELINE_MAX_BYTES = 160
"""The longest stored timeline in bytes (lua/lib/timeline.lua's TIMELINE_MAX_BYTES): about 14 steps."""

_INT = re.compile(rb"[1-9][0-9]{0,14}")
_NAME = re.compile(rb"[A-Za-z0-9_.-]{1,128}")
_FIRST = re.compile(rb"([0-4])@([1-9][0-9]{0,14})")
_LATER = re.compile(rb"([0-4])\+(0|[1-9][0-9]{0,14})")
_STAGES = {stage.value.encode(): stage for stage in Stage}


def raw(value: object) -> bytes:
    """``value`` as Redis holds it (bytes; a str as UTF-8, anything else as its text)."""
    if isinstance(value, bytes):
        return value
    return (value if isinstance(value, str) else str(value)).encode("utf-8", "surrogateescape")


def shown(value: object, limit: int = 40) -> str:
    """The first ``limit`` characters of ``value``, quoted, for an error message."""
    return repr(raw(value)[: limit * 4].decode("utf-8", "replace")[:limit])


def text(value: object) -> str:
    """A stored string as text (bytes that are not UTF-8 replaced, never raised)."""
    return raw(value).decode("utf-8", "replace")


def _corrupt(key: str, field: str, value: object, what: str) -> CorruptedValueError:
    where = f"key {key} field {field}" if field else f"key {key}"
    return CorruptedValueError(f"{where} holds {shown(value)}, not {what}; left as it is")


def stored_int(value: object) -> Optional[int]:
    """``value`` as an int if it is a positive integer of 1..15 decimal digits (no sign, space, exponent, hex,
    leading zero, ``inf`` or ``nan``), else None: ``stored_int`` of lua/lib/stored.lua."""
    if value is None:
        return None
    data = raw(value)
    return int(data) if _INT.fullmatch(data) else None


def stored_name(value: object) -> bool:
    """Whether ``value`` is a participant or origin name: 1..128 of ``A-Z a-z 0-9 _ . -`` (``stored_name``)."""
    return _NAME.fullmatch(raw(value)) is not None


def stored_text(value: object) -> bool:
    """Whether ``value`` is a reason kvstatus stores: UTF-8 text of at most :data:`MAX_TEXT_BYTES` bytes."""
    data = raw(value)
    if len(data) > MAX_TEXT_BYTES:
        return False
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def parse_epoch(value: object, key: str, field: str) -> int:
    """An epoch, stamp or lease deadline (:func:`stored_int`); raises :class:`CorruptedValueError` for anything else."""
    found = stored_int(value)
    if found is None:
        raise _corrupt(key, field, value, "a positive integer of 1..15 digits")
    return found


def next_epoch(stored: object, now_ms: int) -> int:
    """The epoch an acquire takes (lua/lease.lua) from the record's ``stored`` epoch at Redis' ``now_ms``: above the
    stored one when that is valid and has a valid successor, else ``now_ms`` (a forged one is read as none)."""
    previous = stored_int(stored)
    if previous is None or previous >= MAX_INT:
        return now_ms
    return max(now_ms, previous + 1)


def parse_failure(value: object, key: str, field: str) -> FailureRecord:
    """A room's first failure ``<ms>:<stage>:<origin>:<reason>``: ms at most :data:`MAX_TIME_MS`, a known stage,
    origin 1..:data:`MAX_NAME_BYTES` bytes without a colon (kvstatus writes a name; readers escape what they show),
    reason at most :data:`MAX_TEXT_BYTES` bytes (``stored_fate`` of lua/lib/stored_text.lua)."""
    data = raw(value)
    parts = data.split(b":", 3)
    if (
        len(parts) == 4
        and len(parts[3]) <= MAX_TEXT_BYTES
        and 0 < len(parts[2]) <= MAX_NAME_BYTES
        and parts[1] in _STAGES
    ):
        ms = stored_int(parts[0])
        if ms is not None and ms <= MAX_TIME_MS:
            reason = parts[3].decode("utf-8", "replace")
            return FailureRecord(ms, _STAGES[parts[1]], parts[2].decode("utf-8", "replace"), reason)
    raise _corrupt(key, field, value, "a failure record")


def parse_timeline(value: object, key: str, field: str) -> tuple[Step, ...]:
    """The steps of a stored timeline (:mod:`kvstatus.timeline`), in order: at most :data:`TIMELINE_MAX_BYTES`,
    numbers of 1..15 digits, offsets that never go back (``stored_timeline`` of lua/lib/stored.lua)."""
    data = raw(value)
    if len(data) > TIMELINE_MAX_BYTES:
        raise _corrupt(key, field, value, "a timeline")
    parts = data.split(b" ")
    first = _FIRST.fullmatch(parts[0])
    later = [_LATER.fullmatch(part) for part in parts[1:]]
    if first is None or None in later:
        raise _corrupt(key, field, value, "a timeline")
    base = int(first.group(2))
    steps = [Step(KVPoll(int(first.group(1))), base)]
    for match in later:
        assert match is not None
        at = base + int(match.group(2))
        if at < steps[-1].at_ms:
            raise _corrupt(key, field, value, "a timeline (it goes back)")
        steps.append(Step(KVPoll(int(match.group(1))), at))
    return tuple(steps)


def parse_time(value: object, key: str, field: str) -> int:
    """A time note (a tombstone's): Unix ms, a :func:`stored_int` no later than :data:`MAX_TIME_MS`."""
    found = stored_int(value)
    if found is None or found > MAX_TIME_MS:
        raise _corrupt(key, field, value, "a time in Unix ms")
    return found
