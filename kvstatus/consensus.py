"""The room consensus view: one status for a room over its expected participants.

:func:`entries_request` reads what the rule (:func:`kvstatus.rule.room_consensus`) needs in one round trip (one
``lua/room_statuses.lua`` call on a single Redis; on a cluster one ``HMGET`` per room and one lease read per
participant, pipelined per node); :func:`consensus_many` applies it to every room.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Optional, Union

from kvstatus import scripts
from kvstatus.errors import CorruptedValueError, InvalidArgumentError
from kvstatus.keys import FATE_FIELD, reason_field, validate_name, validate_rooms
from kvstatus.model import FailureRecord, KVPoll, LeaseState, RoomConsensus
from kvstatus.replies import parse_fate, shown, text
from kvstatus.requests import Call, Request, script_call
from kvstatus.rule import room_consensus

if TYPE_CHECKING:  # a core is handed in; importing operations would stack this module on top of it
    from kvstatus.operations import StoreCore

MAX_PARTICIPANTS = 64


def validate_participants(participants: Iterable[str]) -> tuple[str, ...]:
    """The expected participants as a tuple of valid, distinct names (1..64 of them)."""
    if isinstance(participants, (str, bytes)) or not isinstance(participants, Iterable):
        raise InvalidArgumentError(f"participants must be a list of participant names, not {participants!r}")
    names = tuple(validate_name(p, "participant") for p in participants)
    if not names or len(names) > MAX_PARTICIPANTS or len(set(names)) != len(names):
        raise InvalidArgumentError(f"expected 1..{MAX_PARTICIPANTS} distinct participant names, got {list(names)!r}")
    return names


_BY_CHAR: dict[str, Optional[KVPoll]] = {str(status.value): status for status in KVPoll}
_BY_CHAR["-"] = None
_VALUE_CHAR: dict[object, str] = {}
for _s in KVPoll:
    _VALUE_CHAR[str(_s.value)] = _VALUE_CHAR[str(_s.value).encode()] = str(_s.value)


class Entries(NamedTuple):
    """What the consensus view reads. ``codes[i]`` is room ``rooms[i]``'s entries as one string, character j
    participant ``names[j]``'s status ("0".."4", "-" for no entry); ``leases`` the participants' lease
    states; ``reasons`` the recorded reasons of Failed entries (room-major index ``i * len(names) + j``);
    ``epochs`` the epoch of the incarnation each participant's lease record names (0: no record), the fence
    of a sweep of its entries (``lua/sweep.lua``)."""

    rooms: list[int]
    names: tuple[str, ...]
    codes: Sequence[Union[str, bytes]]  # str, or bytes as the client returned them (decoded only where needed)
    leases: list[LeaseState]
    reasons: dict[int, str]
    epochs: list[int]
    fates: dict[int, FailureRecord] = {}  # room index -> its first failure (read with shared fate on only)

    def statuses(self, i: int) -> list[Optional[KVPoll]]:
        """Room ``rooms[i]``'s statuses, in ``names`` order (None: no entry)."""
        return _statuses(self.codes[i])


def _statuses(code: Union[str, bytes]) -> list[Optional[KVPoll]]:
    return [_BY_CHAR[c] for c in (code.decode() if isinstance(code, bytes) else code)]


def consensus_many(entries: Entries) -> dict[int, RoomConsensus]:
    """Apply :func:`room_consensus` to every room of ``entries``."""
    names, leases, reasons, fates = entries.names, entries.leases, entries.reasons, entries.fates
    p = len(names)
    if LeaseState.LOST not in leases and not reasons and not fates:
        # The hot path: nobody is lost and no reason to attach, so a room's result depends on its code alone.
        memo: dict[Union[str, bytes], RoomConsensus] = {}

        def plain(code: Union[str, bytes]) -> RoomConsensus:
            memo[code] = found = room_consensus(names, _statuses(code), leases)
            return found

        return {room: memo.get(code) or plain(code) for room, code in zip(entries.rooms, entries.codes)}
    result: dict[int, RoomConsensus] = {}
    for i, room in enumerate(entries.rooms):
        own = {names[k - i * p]: reasons[k] for k in range(i * p, (i + 1) * p) if k in reasons} if reasons else None
        result[room] = room_consensus(names, entries.statuses(i), leases, own, fates.get(i))
    return result


def entries_request(core: StoreCore, rooms: Iterable[int], participants: Iterable[str]) -> Request[Entries]:
    """The :class:`~kvstatus.operations.Request` reading :class:`Entries` of ``rooms`` in one round trip."""
    if isinstance(rooms, (str, bytes, bytearray, Mapping)) or not isinstance(rooms, Iterable):
        raise InvalidArgumentError(f"expected an iterable of room ids, not {type(rooms).__name__}")
    ids = list(dict.fromkeys(validate_rooms(rooms)))
    names = validate_participants(participants)
    if not ids:
        return Request([], lambda replies: Entries([], names, [], [], {}, []))
    schema = core.schema
    keys = schema.room_keys(ids)
    lease_keys = [schema.lease_key(name) for name in names]
    p = len(names)
    shared = core.shared_fate

    if not core.cluster:
        call = script_call(
            scripts.ROOM_STATUSES, keys + lease_keys, (str(len(ids)), FATE_FIELD if shared else "", *names)
        )

        def decode_one(replies: list[Any]) -> Entries:
            leases_raw, codes, flat, epochs, flat_fates = replies[0]
            reasons = {int(flat[j]): text(flat[j + 1]) for j in range(0, len(flat), 2)}
            fates = _fates(flat_fates[::2], flat_fates[1::2], keys)
            leases = [LeaseState(int(v)) for v in leases_raw]
            return Entries(ids, names, codes, leases, reasons, list(map(int, epochs)), fates)

        return Request([call], decode_one)

    reason_fields = [reason_field(name) for name in names]
    calls = [Call(("HMGET", key, *names, *reason_fields, FATE_FIELD)) for key in keys]
    calls += [
        script_call(scripts.ROOM_STATUSES, [lease_key], ("0", "", name)) for lease_key, name in zip(lease_keys, names)
    ]

    def decode_cluster(replies: list[Any]) -> Entries:
        n = len(ids)
        codes: list[str] = []
        reasons: dict[int, str] = {}
        for i, reply in enumerate(replies[:n]):
            chars = []
            for j in range(p):
                value = reply[j]
                char = "-" if value is None else _VALUE_CHAR.get(value)
                if char is None:
                    raise CorruptedValueError(
                        f"key {keys[i]} field {names[j]} holds {shown(value)}, not a status 0..4; left as it is"
                    )
                if char == "0" and reply[p + j] is not None:
                    reasons[i * p + j] = text(reply[p + j])
                chars.append(char)
            codes.append("".join(chars))
        leases = [LeaseState(int(reply[0][0])) for reply in replies[n:]]
        with_fate = [i for i, code in enumerate(codes) if shared and replies[i][2 * p] is not None and code != "4" * p]
        fates = _fates(with_fate, [replies[i][2 * p] for i in with_fate], keys)
        return Entries(ids, names, codes, leases, reasons, [int(reply[3][0]) for reply in replies[n:]], fates)

    return Request(calls, decode_cluster)


def _fates(
    indices: Sequence[Union[int, str, bytes]], values: Sequence[object], keys: Sequence[str]
) -> dict[int, FailureRecord]:
    """Room index -> its first failure, parsed (a value kvstatus does not write raises, naming its key)."""
    found: dict[int, FailureRecord] = {}
    for index, value in zip(indices, values):
        i = int(index)
        record = parse_fate(value, keys[i])
        if record is not None:
            found[i] = record
    return found


def consensus_calls(
    core: StoreCore, rooms: Iterable[int], participants: Iterable[str]
) -> Request[dict[int, RoomConsensus]]:
    """The :class:`~kvstatus.operations.Request` of ``room_statuses``: {room: RoomConsensus}, in one round trip."""

    read = entries_request(core, rooms, participants)
    decode_entries = read.decode
    return Request(read.calls, lambda replies: consensus_many(decode_entries(replies)))
