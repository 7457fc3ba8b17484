"""The store's operations, written once and free of I/O: each validates its arguments and returns a
:class:`Request`, which :class:`~kvstatus.StatusStore` and :class:`~kvstatus.AsyncStatusStore` send alike."""

from __future__ import annotations

import math
import typing
from collections.abc import Iterable, Mapping
from typing import Any, Optional, TypedDict, TypeVar

from redis.cluster import key_slot  # type: ignore[attr-defined]

from kvstatus import scripts
from kvstatus.errors import CorruptedValueError, InvalidArgumentError, SupersededError
from kvstatus.keys import (
    DEFAULT_PARTICIPANT,
    DEFAULT_PREFIX,
    DEFAULT_TTL_SECONDS,
    FATE_FIELD,
    MAX_ROOM,
    PROBE_PARTICIPANT,
    TOMBSTONE_TTL_SECONDS,
    KeySchema,
    incarnation_field,
    late_field,
    reason_field,
    room_batch,
    timeline_field,
    truncate_reason,
    ttl_to_ms,
    validate_name,
    validate_room,
    validate_rooms,
)
from kvstatus.model import (
    OPEN,
    CancelOutcome,
    CancelResult,
    Cleared,
    FailureRecord,
    KVPoll,
    Outcome,
    Policy,
    RoomView,
    UpdateResult,
    to_policy,
    to_status,
)
from kvstatus.replies import (
    _RESULTS,
    _STATUS_BY_VALUE,
    ReplyOrError,
    _clear_reply,
    _decode_record,
    decode_room_reply,
    decode_status,
    decode_statuses,
    parse_fate,
    parse_timeline,
    update_result,
)
from kvstatus.requests import Call, Request, script_call  # noqa: F401  (also re-exported)
from kvstatus.rule import shared_status

T = TypeVar("T")
tomb = KeySchema.tombstone_of

STATUS_ARG = tuple(str(s.value) for s in KVPoll)
"""The script argument of each status, by its value ("0".."4")."""
# The exact types whose statuses the batch hot path indexes STATUS_ARG with directly (bool is not one).
_PLAIN_STATUS_TYPES = frozenset({KVPoll, int})


def status_args(statuses: Iterable[KVPoll | int]) -> list[str]:
    """The script argument ("0".."4") of each status; raises :class:`InvalidStatusError` for a bad one."""
    values = list(statuses)
    if values and set(map(type, values)) <= _PLAIN_STATUS_TYPES and 0 <= min(values) and max(values) <= 4:
        return [STATUS_ARG[s] for s in values]
    return [STATUS_ARG[to_status(s)] for s in values]


def batch_args(updates: object) -> tuple[list[int], list[str]]:
    """The validated rooms of an ``update_many`` batch and each one's script argument, pair by pair; raises
    :class:`InvalidArgumentError` for a room that comes twice (one script decides a batch from one read): a Mapping
    may yield it twice, a dict may hold equal int subclasses; a plain ``dict`` of ``int`` (the hot path) cannot."""
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
            if first.setdefault(room, i) != i:
                raise InvalidArgumentError(
                    f"update_many got room {room} twice (batch positions {first[room]} and {i}): a batch holds "
                    "each room once; send updates of one room in order, in separate calls"
                )
    return rooms, status_args([status for _, status in pairs])


CHUNK_ROOMS = 1000
"""Rooms per script call of a batch, the batch's atomicity unit: docs/guide.md ("Batches and atomicity")."""
CHUNK_SECONDS = 0.02
"""Seconds added to a call's deadline for each further chunk of a batch (a wide margin for 1000 rooms)."""


def _extra_seconds(rooms: int) -> float:
    """Deadline seconds a batch of ``rooms`` gets beyond one call's: :data:`CHUNK_SECONDS` per further chunk."""
    return max(0, math.ceil(rooms / CHUNK_ROOMS) - 1) * CHUNK_SECONDS


def _no_calls(result: T) -> Request[T]:
    return Request([], lambda replies: result)


class CoreSettings(TypedDict):
    """The keyword arguments that rebuild a :class:`StoreCore` (:meth:`StoreCore.settings`)."""

    namespace: str
    participant: str
    prefix: str
    ttl: float
    policy: Policy
    shared_fate: bool
    timeline: bool


class StoreCore:
    """Configuration and operations of a store, shared by the sync and async stores."""

    _update_command: tuple[str, str] = ("EVALSHA", scripts.UPDATE.sha)  # how the update of one key is sent

    def __init__(
        self,
        *,
        namespace: str,
        participant: Optional[str] = None,
        prefix: str = DEFAULT_PREFIX,
        ttl: float = DEFAULT_TTL_SECONDS,
        policy: str | Policy = Policy.SEED,
        cluster: bool = False,
        shared_fate: bool = True,
        timeline: bool = False,
    ) -> None:
        self.schema = KeySchema(namespace, prefix)
        for name, value in (("shared_fate", shared_fate), ("timeline", timeline)):
            if not isinstance(value, bool):
                raise InvalidArgumentError(f"{name} must be True or False, not {value!r}")
        self.shared_fate = shared_fate
        self.timeline = timeline
        self.participant = validate_name(DEFAULT_PARTICIPANT if participant is None else participant, "participant")
        self.ttl_ms = ttl_to_ms(ttl)
        self.policy = to_policy(policy)
        self.cluster = cluster
        self._reason_field = reason_field(self.participant)
        self._incarnation_field = incarnation_field(self.participant)
        self._timeline_field = timeline_field(self.participant)
        self._update_one = (*self._update_command, 1)
        # A tombstone never outlives the store's TTL: no key kvstatus writes stays longer than one TTL. The probe
        # (kvstatus doctor, the SGLang start-up check) leaves none: 0 tells lua/clear.lua to write no tombstone.
        probe = self.participant == PROBE_PARTICIPANT
        self.tombstone_ttl_ms = 0 if probe else min(ttl_to_ms(TOMBSTONE_TTL_SECONDS), self.ttl_ms)
        self.fence(None)

    def fence(self, epoch: Optional[int]) -> None:
        """Stamp this store's writes with its lease incarnation's ``epoch`` (None: no lease, no stamps); a write
        that finds the entry stamped by a later incarnation is refused (REFUSED_SUPERSEDED, see lua/update.lua)."""
        self.epoch = epoch
        stamp = "" if epoch is None else str(epoch)
        self._update_head = (
            self.policy.value,
            str(self.ttl_ms),
            self.participant,
            self._reason_field,
            self._incarnation_field,
            stamp,
            self._timeline_field if self.timeline else "",
        )
        self._clear_args = (
            self.participant,
            self._reason_field,
            late_field(self.participant),
            str(self.tombstone_ttl_ms),
            self._incarnation_field,
            stamp,
            self._timeline_field,
        )

    def settings(self) -> CoreSettings:
        """Keyword arguments that rebuild this core (for ``for_participant``)."""
        return {
            "namespace": self.schema.namespace,
            "participant": self.participant,
            "prefix": self.schema.prefix,
            "ttl": self.ttl_ms / 1000,
            "policy": self.policy,
            "shared_fate": self.shared_fate,
            "timeline": self.timeline,
        }

    def superseded(self, rooms: str, results: Optional[Mapping[int, UpdateResult]] = None) -> SupersededError:
        """The error of a write refused in ``rooms`` (text) because a later incarnation stamped the entry."""
        return SupersededError(
            f"participant {self.participant} (incarnation epoch {self.epoch}) was taken over by a newer incarnation "
            f"of the same name, which wrote {rooms} since: a restart under the same participant name. Nothing was "
            "written there, and this store refuses writes from now on; a process that still runs under a replaced "
            "name must stop, or take another participant name",
            participant=self.participant,
            results=results,
        )

    def refused(self, results: Mapping[int, UpdateResult]) -> Optional[SupersededError]:
        """The error of an update or a batch some of whose rooms were refused as superseded, or None."""
        refused = [room for room, result in results.items() if result.outcome is Outcome.REFUSED_SUPERSEDED]
        if not refused:
            return None
        shown = ", ".join(map(str, refused[:5])) + (f" and {len(refused) - 5} more" if len(refused) > 5 else "")
        return self.superseded(f"room{'s' if len(refused) > 1 else ''} {shown}", results)

    def _cleared(self, reply: ReplyOrError, room: int, popped: bool) -> Cleared:
        """lua/clear.lua's reply; raises :class:`SupersededError` if refused, and for a pop :class:`CorruptedValueError`
        when the entry held a non-status (removed all the same). A malformed timeline is dropped, never raised."""
        removed, status, timeline = _clear_reply(reply)
        if removed < 0:
            raise self.superseded(f"room {room}")
        key = self.schema.room_key(room)
        if status == -2 and popped:
            raise CorruptedValueError(
                f"key {key} field {self.participant} held a value that is not a status 0..4; the entry was removed"
            )
        try:
            steps = parse_timeline(timeline, key, self._timeline_field) if timeline else ()
        except CorruptedValueError:
            steps = ()
        return Cleared(removed > 0, None if status < 0 else KVPoll(status), steps)

    def chunks(self, keys: list[str]) -> list[list[int]]:
        """Indices of ``keys`` by script call: at most :data:`CHUNK_ROOMS` each, and on a cluster all of one slot."""
        groups = [list(range(len(keys)))]
        if self.cluster:
            by_slot: dict[int, list[int]] = {}
            for i, key in enumerate(keys):
                by_slot.setdefault(key_slot(key.encode()), []).append(i)
            groups = list(by_slot.values())
        return [group[start : start + CHUNK_ROOMS] for group in groups for start in range(0, len(group), CHUNK_ROOMS)]

    def _key(self, room: object) -> str:
        """The key of ``room``, validated (the hot path checks an int's range only)."""
        if type(room) is not int or not 0 <= room <= MAX_ROOM:
            room = validate_room(room)
        return self.schema.room_key(room)

    def update_status(self, room: int, status: KVPoll | int) -> Request[UpdateResult]:
        key = self._key(room)
        arg = STATUS_ARG[status if type(status) is KVPoll else to_status(status)]
        if arg == "0" and self.tombstone_ttl_ms:  # only a Failed can be a late abort: it names the tombstone too
            args: tuple[object, ...] = ("EVALSHA", scripts.UPDATE.sha, 2, key, tomb(key), *self._update_head, arg)
        else:
            args = (*self._update_one, key, *self._update_head, arg)
        return Request([Call(args, scripts.UPDATE)], lambda replies: update_result(*replies[0]))

    def update_many(self, updates: Mapping[int, KVPoll | int]) -> Request[dict[int, UpdateResult]]:
        rooms, args = batch_args(updates)
        if not rooms:
            return _no_calls({})
        keys = self.schema.room_keys(rooms)
        tombs = self.tombstone_ttl_ms > 0 and "0" in args  # a batch with a Failed names the tombstones too
        if not self.cluster and len(keys) <= CHUNK_ROOMS:

            def decode_one(replies: list[Any]) -> dict[int, UpdateResult]:
                pairs = iter(replies[0])
                found = list(map(_RESULTS.get, zip(pairs, pairs)))
                if None in found:
                    pairs = iter(replies[0])
                    return dict(zip(rooms, [update_result(*pair) for pair in zip(pairs, pairs)]))  # raises, naming it
                return dict(zip(rooms, typing.cast("list[UpdateResult]", found)))

            all_keys = keys + [tomb(key) for key in keys] if tombs else keys
            return Request([script_call(scripts.UPDATE, all_keys, (*self._update_head, *args))], decode_one)
        groups = self.chunks(keys)
        calls = [
            script_call(
                scripts.UPDATE,
                [keys[i] for i in group] + ([tomb(keys[i]) for i in group] if tombs else []),
                (*self._update_head, *(args[i] for i in group)),
            )
            for group in groups
        ]

        def decode_groups(replies: list[Any]) -> dict[int, UpdateResult]:
            results: dict[int, UpdateResult] = {}
            for group, reply in zip(groups, replies):
                for n, i in enumerate(group):
                    results[rooms[i]] = update_result(reply[2 * n], reply[2 * n + 1])
            return results

        return Request(calls, decode_groups, _extra_seconds(len(keys)))

    def get(self, room: int) -> Request[Optional[KVPoll]]:
        key = self._key(room)
        return Request([self._read_call(key)], lambda replies: self._read(replies[0], key))

    def _read_call(self, key: str) -> Call:
        """The read of this participant's entry at ``key``; under shared fate with the room's first failure too."""
        if self.shared_fate:
            return Call(("HMGET", key, self.participant, FATE_FIELD))
        return Call(("HGET", key, self.participant))

    def _read(self, reply: object, key: str) -> Optional[KVPoll]:
        """This participant's status from the reply of :meth:`_read_call` (judged by the room's fate if shared)."""
        value, fate = typing.cast("tuple[object, object]", reply) if self.shared_fate else (reply, None)
        status = _STATUS_BY_VALUE.get(value)
        if status is None:
            status = decode_status(value, key, self.participant)
        if fate is None or status not in OPEN:
            return status
        return shared_status(status, parse_fate(fate, key), self.participant)

    def check_status(self, room: int) -> Request[KVPoll]:
        request = self.get(room)
        decode_get = request.decode

        def decode(replies: list[ReplyOrError]) -> KVPoll:
            status = decode_get(replies)
            if status is None:
                raise KeyError(room)
            return status

        return Request(request.calls, decode)

    def get_many(self, rooms: Iterable[int]) -> Request[dict[int, Optional[KVPoll]]]:
        ids = room_batch(rooms, "get_many")  # a repeated room is read twice and kept once by the decoding dict
        if not ids:
            return _no_calls({})
        keys = self.schema.room_keys(ids)
        field = self.participant
        args = (field, FATE_FIELD) if self.shared_fate else (field,)  # get_many.lua judges the fate itself
        if not self.cluster and len(keys) <= CHUNK_ROOMS:
            return Request(
                [script_call(scripts.GET_MANY, keys, args)],
                lambda replies: dict(zip(ids, decode_statuses(replies[0], keys, field))),
            )
        groups = self.chunks(keys)
        # A room alone in its slot (most of them, on a cluster) is a plain read, as get() sends it.
        calls = [
            self._read_call(keys[group[0]])
            if len(group) == 1
            else script_call(scripts.GET_MANY, [keys[i] for i in group], args)
            for group in groups
        ]

        def decode(replies: list[Any]) -> dict[int, Optional[KVPoll]]:
            result: dict[int, Optional[KVPoll]] = {}
            for group, call, reply in zip(groups, calls, replies):
                if call.script:
                    for i, value in zip(group, reply):
                        result[ids[i]] = decode_status(value, keys[i], field)
                else:
                    result[ids[group[0]]] = self._read(reply, keys[group[0]])
            return {room: result[room] for room in ids}

        return Request(calls, decode, _extra_seconds(len(keys)))

    def clear(self, room: int) -> Request[Cleared]:
        """Remove the entry and leave the room's tombstone (none for the probe participant)."""
        key = self._key(room)
        return Request(
            [script_call(scripts.CLEAR, [key, tomb(key)], self._clear_args)],
            lambda replies: self._cleared(replies[0], room, popped=False),
        )

    def pop(self, room: int) -> Request[Cleared]:
        """Remove the entry (as :meth:`clear`) and answer what it held, in one script call."""
        return Request(self.clear(room).calls, lambda replies: self._cleared(replies[0], room, popped=True))

    def record_failure(self, room: int, reason: str) -> Request[bool]:
        key = self._key(room)
        args: tuple[str, ...] = (self.participant, self._reason_field, truncate_reason(reason), str(self.ttl_ms))
        if self.epoch is not None:
            args += (self._incarnation_field, str(self.epoch))

        def decode(replies: list[ReplyOrError]) -> bool:
            if replies[0] == Outcome.REFUSED_SUPERSEDED:
                raise self.superseded(f"room {room}")
            return _decode_record(replies)

        return Request([script_call(scripts.RECORD_FAILURE, [key], args)], decode)

    def failure(self, room: int) -> Request[Optional[FailureRecord]]:
        key = self._key(room)
        return Request([Call(("HGET", key, FATE_FIELD))], lambda replies: parse_fate(replies[0], key))

    def cancel(self, rooms: Iterable[int], reason: str, origin: str) -> Request[dict[int, CancelResult]]:
        ids = list(dict.fromkeys(room_batch(rooms, "cancel")))
        if not ids:
            return _no_calls({})
        args = (str(self.ttl_ms), validate_name(origin, "origin"), truncate_reason(reason))
        keys = self.schema.room_keys(ids)
        groups = self.chunks(keys)
        calls = [script_call(scripts.CANCEL, [keys[i] for i in group], args) for group in groups]

        def decode(replies: list[Any]) -> dict[int, CancelResult]:
            results: dict[int, CancelResult] = {}
            for group, reply in zip(groups, replies):
                for n, i in enumerate(group):
                    results[ids[i]] = CancelResult(CancelOutcome(reply[2 * n]), int(reply[2 * n + 1]))
            return {room: results[room] for room in ids}

        return Request(calls, decode, _extra_seconds(len(keys)))

    def room(self, room: int) -> Request[RoomView]:
        room = validate_room(room)
        key = self.schema.room_key(room)
        return Request(
            [script_call(scripts.ROOM, [key, tomb(key)], ())], lambda replies: decode_room_reply(room, key, replies[0])
        )


class FunctionsCore(StoreCore):
    """:class:`StoreCore` whose scripts run as functions (``scripts="functions"``): the one-key update is built as
    FCALL, every other request goes through :func:`~kvstatus.requests.as_functions`."""

    _update_command = ("FCALL", scripts.function_name(scripts.UPDATE))
