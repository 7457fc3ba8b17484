"""The store's operations, written once and free of I/O.

Each operation is a generator: it validates its arguments, yields the Redis
calls it needs as one batch (sent in one round trip), receives their replies in
the same order, and returns the decoded result. :class:`~kvstatus.StatusStore`
drives these generators with blocking calls and
:class:`~kvstatus.AsyncStatusStore` with awaits; nothing else differs.
"""

from __future__ import annotations

import math
from collections.abc import Generator, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Optional, TypeVar

from redis.cluster import key_slot

from kvstatus import scripts
from kvstatus.errors import CorruptedValueError, InvalidArgumentError
from kvstatus.keys import (
    DEFAULT_PARTICIPANT,
    DEFAULT_PREFIX,
    REASON_FIELD_PREFIX,
    KeySchema,
    reason_field,
    validate_name,
    validate_room,
    validate_rooms,
)
from kvstatus.rule import (
    KVPoll,
    Outcome,
    ParticipantEntry,
    Policy,
    RoomView,
    UpdateResult,
    to_policy,
    to_status,
)
from kvstatus.scripts import LuaScript

T = TypeVar("T")

DEFAULT_TTL_SECONDS = 600.0
MAX_TTL_SECONDS = 30 * 24 * 3600.0
MAX_REASON_BYTES = 2048
_TRUNCATED = " [truncated]"


@dataclass(frozen=True)
class Call:
    """One Redis command; ``script`` is set when ``args`` is an EVALSHA of that script."""

    args: tuple[Any, ...]
    script: Optional[LuaScript] = None


Op = Generator[list[Call], list[Any], T]

_STATUS_ARG = tuple(str(s.value) for s in KVPoll)
_STATUS_BY_VALUE: dict[Any, KVPoll] = {}
for _s in KVPoll:
    _STATUS_BY_VALUE[str(_s.value)] = _s
    _STATUS_BY_VALUE[str(_s.value).encode()] = _s
# The exact types whose statuses the batch hot path indexes _STATUS_ARG with directly (bool is not one).
_PLAIN_STATUS_TYPES = frozenset({KVPoll, int})
_RESULTS = {
    (o.value, s): UpdateResult(o, None if s < 0 else KVPoll(s)) for o in Outcome for s in range(-1, len(KVPoll))
}


def ttl_to_ms(ttl: object) -> int:
    """Validate a TTL in seconds and return it in whole milliseconds (at least 1)."""
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not math.isfinite(ttl):
        raise InvalidArgumentError(f"invalid ttl {ttl!r}: expected a number of seconds")
    if not 0 < ttl <= MAX_TTL_SECONDS:
        raise InvalidArgumentError(f"invalid ttl {ttl!r}: expected seconds > 0 and at most "
                                   f"{MAX_TTL_SECONDS:.0f} ({MAX_TTL_SECONDS / 86400:g} days)")
    return max(1, round(ttl * 1000))


def script_call(script: LuaScript, keys: list[str], args: Iterable[Any]) -> Call:
    return Call(("EVALSHA", script.sha, len(keys), *keys, *args), script)


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def status_args(statuses: Iterable[Any]) -> list[str]:
    """The script argument ("0".."4") of each status; raises :class:`InvalidStatusError` for a bad one."""
    values = list(statuses)
    if values and set(map(type, values)) <= _PLAIN_STATUS_TYPES and 0 <= min(values) and max(values) <= 4:
        return [_STATUS_ARG[s] for s in values]
    return [_STATUS_ARG[to_status(s)] for s in values]


def decode_statuses(values: list[Any], keys: list[str], field: str) -> list[Optional[KVPoll]]:
    """:func:`decode_status` over a batch reply, with one dict lookup per value on the hot path."""
    decoded = [_STATUS_BY_VALUE.get(value) for value in values]
    for value, status, key in zip(values, decoded, keys):
        if status is None and value is not None:
            decode_status(value, key, field)  # raises, naming the key
    return decoded


def decode_status(value: Any, key: str, field: str) -> Optional[KVPoll]:
    """Decode a stored status (None stays None); raise :class:`CorruptedValueError` for anything else."""
    if value is None:
        return None
    status = _STATUS_BY_VALUE.get(value)
    if status is None:
        raise CorruptedValueError(
            f"key {key} field {field} holds {_text(value)[:40]!r}, not a status 0..4; left as it is"
        )
    return status


def truncate_reason(reason: object) -> str:
    """Return ``reason`` cut to :data:`MAX_REASON_BYTES` of UTF-8, marked when cut."""
    if not isinstance(reason, str):
        raise InvalidArgumentError(f"invalid reason {reason!r}: expected a string")
    data = reason.encode("utf-8")
    if len(data) <= MAX_REASON_BYTES:
        return reason
    keep = MAX_REASON_BYTES - len(_TRUNCATED)
    return data[:keep].decode("utf-8", "ignore") + _TRUNCATED


class StoreCore:
    """Configuration and operations of a store, shared by the sync and async stores."""

    def __init__(
        self,
        *,
        namespace: str,
        participant: Optional[str] = None,
        prefix: str = DEFAULT_PREFIX,
        ttl: float = DEFAULT_TTL_SECONDS,
        policy: str | Policy = Policy.SEED,
        cluster: bool = False,
    ) -> None:
        self.schema = KeySchema(namespace, prefix)
        self.participant = validate_name(DEFAULT_PARTICIPANT if participant is None else participant, "participant")
        self.ttl_ms = ttl_to_ms(ttl)
        self.policy = to_policy(policy)
        self.cluster = cluster
        self._reason_field = reason_field(self.participant)
        self._update_head = (self.policy.value, str(self.ttl_ms), self.participant, self._reason_field)

    def settings(self) -> dict[str, Any]:
        """Keyword arguments that rebuild this core (for ``for_participant``)."""
        return {
            "namespace": self.schema.namespace,
            "participant": self.participant,
            "prefix": self.schema.prefix,
            "ttl": self.ttl_ms / 1000,
            "policy": self.policy,
        }

    @staticmethod
    def _slot_groups(keys: list[str]) -> list[list[int]]:
        """Indices of ``keys`` grouped by cluster slot: the keys one script call may share on a cluster."""
        by_slot: dict[int, list[int]] = {}
        for i, key in enumerate(keys):
            by_slot.setdefault(key_slot(key.encode()), []).append(i)
        return list(by_slot.values())

    def update_status(self, room: int, status: KVPoll | int) -> Op[UpdateResult]:
        room = validate_room(room)
        arg = _STATUS_ARG[to_status(status)]
        replies = yield [script_call(scripts.UPDATE, [self.schema.room_key(room)], (*self._update_head, arg))]
        outcome, after = replies[0]
        return _RESULTS[outcome, after]

    def update_many(self, updates: Mapping[int, KVPoll | int]) -> Op[dict[int, UpdateResult]]:
        if not isinstance(updates, Mapping):
            raise InvalidArgumentError(f"update_many expects a mapping of room -> status, not {type(updates).__name__}")
        rooms = validate_rooms(updates)
        args = status_args(updates.values())
        if not rooms:
            return {}
        keys = self.schema.room_keys(rooms)
        if not self.cluster:
            (reply,) = yield [script_call(scripts.UPDATE, keys, (*self._update_head, *args))]
            pairs = iter(reply)
            return dict(zip(rooms, [_RESULTS[pair] for pair in zip(pairs, pairs)]))
        groups = self._slot_groups(keys)
        calls = [
            script_call(scripts.UPDATE, [keys[i] for i in group], (*self._update_head, *(args[i] for i in group)))
            for group in groups
        ]
        replies = yield calls
        results: dict[int, UpdateResult] = {}
        for group, reply in zip(groups, replies):
            for n, i in enumerate(group):
                results[rooms[i]] = _RESULTS[reply[2 * n], reply[2 * n + 1]]
        return results

    def get(self, room: int) -> Op[Optional[KVPoll]]:
        key = self.schema.room_key(validate_room(room))
        replies = yield [Call(("HGET", key, self.participant))]
        return decode_status(replies[0], key, self.participant)

    def check_status(self, room: int) -> Op[KVPoll]:
        status = yield from self.get(room)
        if status is None:
            raise KeyError(room)
        return status

    def get_many(self, rooms: Iterable[int]) -> Op[dict[int, Optional[KVPoll]]]:
        if isinstance(rooms, (str, bytes, bytearray, Mapping)) or not isinstance(rooms, Iterable):
            raise InvalidArgumentError(f"get_many expects an iterable of room ids, not {type(rooms).__name__}")
        unique = list(dict.fromkeys(validate_rooms(rooms)))
        if not unique:
            return {}
        keys = self.schema.room_keys(unique)
        if not self.cluster:
            (reply,) = yield [script_call(scripts.GET_MANY, keys, (self.participant,))]
            return dict(zip(unique, decode_statuses(reply, keys, self.participant)))
        groups = self._slot_groups(keys)
        calls = [
            Call(("HGET", keys[group[0]], self.participant))
            if len(group) == 1
            else script_call(scripts.GET_MANY, [keys[i] for i in group], (self.participant,))
            for group in groups
        ]
        replies = yield calls
        result: dict[int, Optional[KVPoll]] = {}
        for group, call, reply in zip(groups, calls, replies):
            values = reply if call.script else [reply]
            for i, value in zip(group, values):
                result[unique[i]] = decode_status(value, keys[i], self.participant)
        return {room: result[room] for room in unique}

    def clear(self, room: int) -> Op[bool]:
        key = self.schema.room_key(validate_room(room))
        replies = yield [Call(("HDEL", key, self.participant, self._reason_field))]
        return bool(replies[0])

    def record_failure(self, room: int, reason: str) -> Op[bool]:
        key = self.schema.room_key(validate_room(room))
        text = truncate_reason(reason)
        call = script_call(
            scripts.RECORD_FAILURE, [key], (self.participant, self._reason_field, text, str(self.ttl_ms))
        )
        replies = yield [call]
        return replies[0] == 1

    def room(self, room: int) -> Op[RoomView]:
        room = validate_room(room)
        key = self.schema.room_key(room)
        fields, pttl = yield [Call(("HGETALL", key)), Call(("PTTL", key))]
        return decode_room(room, key, fields, pttl)


def decode_room(room: int, key: str, fields: Mapping[Any, Any], pttl: int) -> RoomView:
    """Build a :class:`RoomView` from a room hash's fields and its PTTL reply."""
    statuses: dict[str, Optional[KVPoll]] = {}
    reasons: dict[str, str] = {}
    for raw_field, value in fields.items():
        field = _text(raw_field)
        if field.startswith(REASON_FIELD_PREFIX):
            reasons[field[len(REASON_FIELD_PREFIX) :]] = _text(value)
        elif ":" in field:
            raise CorruptedValueError(f"key {key} has a field {field[:60]!r} that kvstatus does not write")
        else:
            statuses[field] = decode_status(value, key, field)
    participants = {
        name: ParticipantEntry(statuses.get(name), reasons.get(name))
        for name in sorted(statuses.keys() | reasons.keys())
    }
    return RoomView(room, participants, pttl if pttl >= 0 else None)
