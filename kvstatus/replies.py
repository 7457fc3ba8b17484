"""How the scripts' replies become results: statuses, update outcomes, rooms and tombstones (no I/O).

Every decoder checks what Redis answered and raises :class:`~kvstatus.errors.CorruptedValueError` (a
stored value kvstatus does not write) or :class:`~kvstatus.errors.BackendError` (a reply of the wrong
shape), naming the key. :mod:`kvstatus.operations` pairs each request with its decoder.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Optional, Union

from kvstatus import stored
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
    Step,
    Tombstone,
    UpdateResult,
)

Reply = Union[None, bytes, str, int, float, list["Reply"], tuple["Reply", ...], dict["Reply", "Reply"]]
"""A RESP reply as redis-py hands it over (bytes, or str with ``decode_responses``; a script's table as a list; a
hash as a dict), and :data:`ReplyOrError` one of a round trip's replies: a call whose error does not fail its
request (:attr:`~kvstatus.requests.Request.strict`) leaves the exception in its place."""
ReplyOrError = Union[Reply, Exception]

_STATUS_BY_VALUE: dict[object, KVPoll] = {}
for _s in KVPoll:
    _STATUS_BY_VALUE[str(_s.value)] = _s
    _STATUS_BY_VALUE[str(_s.value).encode()] = _s


# Every (outcome, status) pair lua/update.lua may return; status -1 means "no entry".
_RESULTS: dict[tuple[object, object], UpdateResult] = {
    (o.value, s): UpdateResult(o, None if s < 0 else KVPoll(s)) for o in Outcome for s in range(-1, len(KVPoll))
}


# lua/record_failure.lua's codes -> record_failure's result (True: the reason was stored).
_RECORDED: dict[object, bool] = {
    ReasonOutcome.RECORDED.value: True,
    ReasonOutcome.KEPT_EARLIER.value: False,
    ReasonOutcome.IGNORED_MISSING.value: False,
}


_text = stored.text

NOT_A_TOMBSTONE = -3
"""The tombstone PTTL lua/room.lua answers when the tombstone's name holds a key that is not a hash."""


def parse_fate(value: object, key: str) -> Optional[FailureRecord]:
    """Decode the :data:`~kvstatus.keys.FATE_FIELD` value read from ``key`` (None stays None); raise
    :class:`~kvstatus.errors.CorruptedValueError` naming the key for anything kvstatus does not write
    (:func:`kvstatus.stored.parse_failure`: its time is one a reader can show, up to the year 9999)."""
    return None if value is None else stored.parse_failure(value, key, FATE_FIELD)


def decode_statuses(values: Sequence[object], keys: list[str], field: str) -> list[Optional[KVPoll]]:
    """:func:`decode_status` over a batch reply, with one dict lookup per value on the hot path."""
    decoded = list(map(_STATUS_BY_VALUE.get, values))
    if None in decoded and decoded.count(None) != values.count(None):  # a stored value that is not a status
        for value, key in zip(values, keys):
            decode_status(value, key, field)  # raises, naming the key
    return decoded


def decode_status(value: object, key: str, field: str) -> Optional[KVPoll]:
    """Decode a stored status (None stays None); raise :class:`CorruptedValueError` for anything else."""
    if value is None:
        return None
    status = _STATUS_BY_VALUE.get(value)
    if status is None:
        raise CorruptedValueError(
            f"key {key} field {field} holds {_text(value)[:40]!r}, not a status 0..4; left as it is"
        )
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


def _decode_update(replies: list[Any]) -> UpdateResult:
    outcome, status = replies[0]
    result = _RESULTS.get((outcome, status))
    return update_result(outcome, status) if result is None else result


def _clear_reply(reply: ReplyOrError) -> tuple[int, int, str | bytes]:
    """(fields removed, -1: refused as superseded; status before: 0..4, -1 none, -2 not a status; the timeline
    removed, as stored, "" for none) of lua/clear.lua's reply."""
    if isinstance(reply, list) and len(reply) == 3:
        removed, status, timeline = reply
        if (
            isinstance(removed, int)
            and isinstance(status, int)
            and isinstance(timeline, (str, bytes))
            and removed >= -1
            and -2 <= status <= 4
        ):
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
    """``PUBSUB NUMSUB`` / ``SHARDNUMSUB`` as ``{channel: subscribers}``, in every shape redis-py hands it over:
    a server's flat reply (channel, count, ...), (channel, count) pairs, or a cluster's ``{node: reply}``
    (summed over the nodes)."""
    counts: dict[str, int] = {}
    if isinstance(reply, Mapping):
        for node_reply in reply.values():
            for channel, count in subscriber_counts(node_reply).items():
                counts[channel] = counts.get(channel, 0) + count
        return counts
    items = list(reply or ())
    pairs = items if all(isinstance(item, (list, tuple)) for item in items) else list(zip(items[::2], items[1::2]))
    for channel, count in pairs:
        name = stored.text(channel)
        counts[name] = counts.get(name, 0) + int(count)
    return counts


def decode_tombstone(fields: object, pttl: int) -> Optional[Tombstone]:
    """A :class:`Tombstone` from its hash fields (None when there are none, or ``fields`` is not a hash's
    reply); notes kvstatus does not write (:func:`kvstatus.stored.parse_time`) are skipped: it only informs."""
    if not fields or not isinstance(fields, Mapping):
        return None
    cleared: dict[str, tuple[float, Optional[KVPoll]]] = {}
    late: dict[str, float] = {}
    for raw_field, raw_value in fields.items():
        field, value = _text(raw_field), _text(raw_value)
        try:
            if field.startswith(LATE_FIELD_PREFIX):
                late[field[len(LATE_FIELD_PREFIX) :]] = stored.parse_time(value, "", field) / 1000
            else:
                at, _, status = value.partition(" ")
                cleared[field] = (stored.parse_time(at, "", field) / 1000, _STATUS_BY_VALUE.get(status))
        except CorruptedValueError:
            continue  # not a note kvstatus writes: the tombstone only informs, so it is not fatal
    entries = {name: ClearedEntry(at, status, late.get(name)) for name, (at, status) in sorted(cleared.items())}
    return Tombstone(entries, pttl if pttl >= 0 else None) if entries else None


def decode_room_reply(room: int, key: str, reply: list[Any]) -> RoomView:
    """The :class:`RoomView` of lua/room.lua's reply ``{fields, pttl, tombstone fields, tombstone pttl}`` for ``key``."""
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
    """Build a :class:`RoomView` from a room hash's fields and its PTTL reply (and its tombstone, if read).
    ``timelines`` False skips the timeline fields (neither parsed nor checked: the near cache's polls need none).

    A status or a first failure kvstatus does not write raises :class:`CorruptedValueError` naming the key (the
    room cannot be judged without them); a timeline it does not write is left out and named in
    ``RoomView.ignored`` (it only informs)."""
    statuses: dict[str, Optional[KVPoll]] = {}
    reasons: dict[str, str] = {}
    steps: dict[str, tuple[Step, ...]] = {}
    ignored: list[str] = []
    stamps: dict[str, int] = {}
    failure = None
    for raw_field, value in fields.items():
        field = _text(raw_field)
        if field == FATE_FIELD:
            failure = parse_fate(value, key)
        elif field.startswith(REASON_FIELD_PREFIX):
            reasons[field[len(REASON_FIELD_PREFIX) :]] = _text(value)
        elif field.startswith(INCARNATION_FIELD_PREFIX):
            stamp = stored.stored_int(value)  # the fence of the entry's writer (lua/update.lua); junk is none
            if stamp is not None:
                stamps[field[len(INCARNATION_FIELD_PREFIX) :]] = stamp
        elif field.startswith(TIMELINE_FIELD_PREFIX):
            if timelines:
                try:
                    steps[field[len(TIMELINE_FIELD_PREFIX) :]] = stored.parse_timeline(value, key, field)
                except CorruptedValueError as exc:
                    ignored.append(str(exc))
        elif ":" in field:
            raise CorruptedValueError(f"key {key} has a field {field[:60]!r} that kvstatus does not write")
        else:
            statuses[field] = decode_status(value, key, field)
    participants = {
        name: ParticipantEntry(statuses.get(name), reasons.get(name))
        for name in sorted(statuses.keys() | reasons.keys())
    }
    kept = {name: steps[name] for name in participants if name in steps}
    kept_stamps = {name: stamps[name] for name in participants if name in stamps}
    return RoomView(
        room, participants, pttl if pttl >= 0 else None, tombstone, failure, kept, tuple(ignored), kept_stamps
    )
