"""The one validating parser of Redis replies (no I/O); it accepts what ``lua/lib/stored.lua`` does: docs/security.md
("Junk values: what each reader does"). Decoders raise only :class:`~kvstatus.errors.CorruptedValueError` (a stored
value kvstatus does not write) or :class:`~kvstatus.errors.BackendError` (a malformed reply), naming the key."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, MutableMapping, Sequence
from typing import Any, Optional, Union

from kvstatus.errors import BackendError, CorruptedValueError
from kvstatus.keys import (
    FATE_FIELD,
    INCARNATION_FIELD_PREFIX,
    LATE_FIELD_PREFIX,
    REASON_FIELD_PREFIX,
    TIMELINE_FIELD_PREFIX,
    TOMBSTONE_SUFFIX,
)
from kvstatus.model import (
    ClearedEntry,
    FailureRecord,
    KVPoll,
    Outcome,
    ParticipantEntry,
    ReasonOutcome,
    RoomView,
    Stage,
    Step,
    Tombstone,
    UpdateResult,
)

Reply = Union[None, bytes, str, int, float, list["Reply"], tuple["Reply", ...], dict["Reply", "Reply"]]
"""A RESP reply as redis-py hands it over (in :data:`ReplyOrError`, a non-strict call's error stands in its place)."""
ReplyOrError = Union[Reply, Exception]

MAX_INT = 999_999_999_999_999
"""The largest epoch, stamp or lease deadline (15 digits: what ``lua/update.lua`` takes as an epoch)."""
MAX_TIME_MS = 253_402_300_799_999
"""The latest time a failure record may hold: 9999-12-31T23:59:59.999Z in Unix ms, the last a reader can show."""
MAX_TEXT_BYTES = 2048
"""The longest reason in UTF-8 bytes (:data:`kvstatus.keys.MAX_REASON_BYTES`; the scripts refuse longer)."""
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
    """``value`` as an int if it is 1..15 decimal digits without a leading zero, else None (lua/lib/stored.lua)."""
    data = raw(value)  # None reads b"None": not an int
    return int(data) if _INT.fullmatch(data) else None


def stored_name(value: object) -> bool:
    """Whether ``value`` is a participant or origin name: 1..128 of ``A-Z a-z 0-9 _ . -`` (``stored_name``)."""
    return _NAME.fullmatch(raw(value)) is not None


def stored_text(value: object) -> bool:
    """Whether ``value`` is a reason kvstatus stores: UTF-8 text of at most :data:`MAX_TEXT_BYTES` bytes."""
    data = raw(value)
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return len(data) <= MAX_TEXT_BYTES


def parse_epoch(value: object, key: str, field: str) -> int:
    """An epoch, stamp or lease deadline (:func:`stored_int`); raises :class:`CorruptedValueError` for anything else."""
    found = stored_int(value)
    if found is None:
        raise _corrupt(key, field, value, "a positive integer of 1..15 digits")
    return found


def next_epoch(stored: object, now_ms: int) -> int:
    """The epoch an acquire takes (lua/lease.lua) at Redis' ``now_ms``: above a valid ``stored`` one, else now_ms."""
    previous = stored_int(stored)
    return now_ms if previous is None or previous >= MAX_INT else max(now_ms, previous + 1)


def parse_failure(value: object, key: str, field: str) -> FailureRecord:
    """A room's first failure ``<ms>:<stage>:<origin>:<reason>`` (``stored_fate`` of lua/lib/stored_text.lua): ms up
    to :data:`MAX_TIME_MS`, origin 1..:data:`MAX_NAME_BYTES` bytes, reason up to :data:`MAX_TEXT_BYTES`."""
    parts = raw(value).split(b":", 3)
    if (
        len(parts) == 4
        and len(parts[3]) <= MAX_TEXT_BYTES
        and 0 < len(parts[2]) <= MAX_NAME_BYTES
        and parts[1] in _STAGES
    ):
        ms = stored_int(parts[0])
        if ms is not None and ms <= MAX_TIME_MS:
            return FailureRecord(ms, _STAGES[parts[1]], text(parts[2]), text(parts[3]))
    raise _corrupt(key, field, value, "a failure record")


def parse_timeline(value: object, key: str, field: str) -> tuple[Step, ...]:
    """A stored timeline's steps, in order (``stored_timeline`` of lua/lib/stored.lua; :mod:`kvstatus.timeline`)."""
    data = raw(value)
    parts = data.split(b" ")
    first = _FIRST.fullmatch(parts[0])
    later = [_LATER.fullmatch(part) for part in parts[1:]]
    if len(data) > TIMELINE_MAX_BYTES or first is None or None in later:
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


_STATUS_BY_VALUE: dict[object, KVPoll] = {form: s for s in KVPoll for form in (str(s.value), str(s.value).encode())}

# Every (outcome, status) pair lua/update.lua may return; status -1 means "no entry".
_RESULTS: dict[tuple[object, object], UpdateResult] = {
    (o.value, s): UpdateResult(o, None if s < 0 else KVPoll(s)) for o in Outcome for s in range(-1, len(KVPoll))
}

# lua/record_failure.lua's codes -> record_failure's result (True: the reason was stored).
_RECORDED: dict[object, bool] = {o.value: o is ReasonOutcome.RECORDED for o in ReasonOutcome}

NOT_A_TOMBSTONE = -3
"""The tombstone PTTL lua/room.lua answers when the tombstone's name holds a key that is not a hash."""


def parse_fate(value: object, key: str) -> Optional[FailureRecord]:
    """:func:`parse_failure` of ``key``'s :data:`~kvstatus.keys.FATE_FIELD` value (None stays None)."""
    return None if value is None else parse_failure(value, key, FATE_FIELD)


def decode_statuses(values: Sequence[object], keys: list[str], field: str) -> list[Optional[KVPoll]]:
    """:func:`decode_status` over a batch reply, with one dict lookup per value on the hot path."""
    decoded = list(map(_STATUS_BY_VALUE.get, values))
    if None in decoded and decoded.count(None) != values.count(None):  # a stored value that is not a status
        for value, key in zip(values, keys):
            decode_status(value, key, field)  # raises, naming the key
    return decoded


def decode_status(value: object, key: str, field: str) -> Optional[KVPoll]:
    """Decode a stored status (None stays None); raise :class:`CorruptedValueError` for anything else."""
    status = _STATUS_BY_VALUE.get(value)
    if status is None and value is not None:
        raise CorruptedValueError(f"key {key} field {field} holds {shown(value)}, not a status 0..4; left as it is")
    return status


def update_result(outcome: object, status: object) -> UpdateResult:
    """Decode one (outcome, status) pair of lua/update.lua; raise :class:`BackendError` for an unknown pair."""
    result = _RESULTS.get((outcome, status))
    if result is None:
        raise BackendError(
            f"the update script replied outcome {outcome!r} status {status!r}, which this kvstatus "
            "does not know (expected outcome 1..7 or 15, status -1..4): is another kvstatus version's "
            "script loaded under the same SHA?"
        )
    return result


def _clear_reply(reply: ReplyOrError) -> tuple[int, int, str | bytes]:
    """(fields removed, -1: refused as superseded; status before: 0..4, -1 none, -2 not a status; the timeline
    removed, as stored, "" for none) of lua/clear.lua's reply."""
    if isinstance(reply, list) and len(reply) == 3:
        removed, status, timeline = reply
        if isinstance(removed, int) and isinstance(status, int) and isinstance(timeline, (str, bytes)):
            if removed >= -1 and -2 <= status <= 4:
                return removed, status, timeline
    raise BackendError(f"the clear script replied {reply!r}, expected [removed -1.., status -2..4, timeline]")


def _decode_record(replies: list[ReplyOrError]) -> bool:
    recorded = _RECORDED.get(replies[0])
    if recorded is None:
        codes = ", ".join(f"{o.value} {o.name}" for o in ReasonOutcome)
        raise BackendError(f"the record_failure script replied {replies[0]!r}, expected one of {codes}")
    return recorded


def _pairs(flat: Iterable[Reply]) -> dict[Reply, Reply]:
    """A flat HGETALL reply from a script ({name, value, ...}) as a dict."""
    it = iter(flat)
    return dict(zip(it, it))


def subscriber_counts(reply: Any) -> dict[str, int]:
    """``PUBSUB NUMSUB`` / ``SHARDNUMSUB`` as ``{channel: subscribers}`` from a flat reply, (channel, count) pairs,
    or a cluster's ``{node: reply}`` (summed over the nodes)."""
    counts: Counter[str] = Counter()
    if isinstance(reply, Mapping):
        for node_reply in reply.values():
            counts.update(subscriber_counts(node_reply))
        return dict(counts)
    items = list(reply or ())
    pairs = items if all(isinstance(item, (list, tuple)) for item in items) else list(zip(items[::2], items[1::2]))
    for channel, count in pairs:
        counts[text(channel)] += int(count)
    return dict(counts)


SHARD_NUMSUB = "PUBSUB SHARDNUMSUB"


def _shard_subscribers(command: str, res: dict[str, object], **options: object) -> list[tuple[str, int]]:
    """A cluster client's merge of its nodes' ``PUBSUB SHARDNUMSUB`` replies: (channel, subscribers) pairs."""
    return list(subscriber_counts(res).items())


def merge_shard_counts(client: object) -> None:
    """Make a cluster ``client`` merge ``PUBSUB SHARDNUMSUB`` replies readably: redis-py 8.2's own merge always
    raises ValueError on a node's flat list (older redis-py passes the reply through)."""
    callbacks = getattr(client, "result_callbacks", None)
    if isinstance(callbacks, MutableMapping):
        callbacks[SHARD_NUMSUB] = _shard_subscribers


def decode_tombstone(fields: object, pttl: int) -> Optional[Tombstone]:
    """A :class:`Tombstone` from its hash fields (None if none, or not a hash's reply); junk notes are skipped."""
    if not fields or not isinstance(fields, Mapping):
        return None
    cleared: dict[str, tuple[float, Optional[KVPoll]]] = {}
    late: dict[str, float] = {}
    for raw_field, raw_value in fields.items():
        field, value = text(raw_field), text(raw_value)
        try:
            if field.startswith(LATE_FIELD_PREFIX):
                late[field[len(LATE_FIELD_PREFIX) :]] = parse_time(value, "", field) / 1000
            else:
                at, _, status = value.partition(" ")
                cleared[field] = (parse_time(at, "", field) / 1000, _STATUS_BY_VALUE.get(status))
        except CorruptedValueError:
            continue  # not a note kvstatus writes: the tombstone only informs, so it is not fatal
    entries = {name: ClearedEntry(at, status, late.get(name)) for name, (at, status) in sorted(cleared.items())}
    return Tombstone(entries, pttl if pttl >= 0 else None) if entries else None


def decode_room_reply(room: int, key: str, reply: list[Any]) -> RoomView:
    """The :class:`RoomView` of ``key`` from lua/room.lua's ``{fields, pttl, tombstone fields, tombstone pttl}``."""
    fields, pttl, tomb_fields, tomb_pttl = reply
    view = decode_room(room, key, _pairs(fields), pttl, decode_tombstone(_pairs(tomb_fields), tomb_pttl))
    if tomb_pttl != NOT_A_TOMBSTONE:
        return view
    return view._replace(ignored=(*view.ignored, f"key {key}{TOMBSTONE_SUFFIX} is not a tombstone hash; ignored"))


def decode_room(
    room: int,
    key: str,
    fields: Mapping[Reply, Reply],
    pttl: int,
    tombstone: Optional[Tombstone] = None,
    timelines: bool = True,
) -> RoomView:
    """A :class:`RoomView` from a room hash's fields and PTTL (ms); ``timelines`` False skips timelines unchecked.
    A junk status or first failure raises :class:`CorruptedValueError`; a junk timeline is named in ``ignored``."""
    statuses: dict[str, Optional[KVPoll]] = {}
    reasons: dict[str, str] = {}
    steps: dict[str, tuple[Step, ...]] = {}
    ignored: list[str] = []
    stamps: dict[str, int] = {}
    failure = None
    for raw_field, value in fields.items():
        field = text(raw_field)
        if field == FATE_FIELD:
            failure = parse_fate(value, key)
        elif field.startswith(REASON_FIELD_PREFIX):
            reasons[field[len(REASON_FIELD_PREFIX) :]] = text(value)
        elif field.startswith(INCARNATION_FIELD_PREFIX):
            stamp = stored_int(value)  # the fence of the entry's writer (lua/update.lua); junk is none
            if stamp is not None:
                stamps[field[len(INCARNATION_FIELD_PREFIX) :]] = stamp
        elif field.startswith(TIMELINE_FIELD_PREFIX):
            if timelines:
                try:
                    steps[field[len(TIMELINE_FIELD_PREFIX) :]] = parse_timeline(value, key, field)
                except CorruptedValueError as exc:
                    ignored.append(str(exc))
        elif ":" in field:
            raise CorruptedValueError(f"key {key} has a field {field[:60]!r} that kvstatus does not write")
        else:
            statuses[field] = decode_status(value, key, field)
    names = sorted(statuses.keys() | reasons.keys())
    participants = {name: ParticipantEntry(statuses.get(name), reasons.get(name)) for name in names}
    kept = {name: steps[name] for name in participants if name in steps}
    kept_stamps = {name: stamps[name] for name in participants if name in stamps}
    return RoomView(
        room, participants, pttl if pttl >= 0 else None, tombstone, failure, kept, tuple(ignored), kept_stamps
    )
