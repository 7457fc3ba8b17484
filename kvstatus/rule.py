"""The pure-Python reference of the rules the Lua scripts run (the tests hold ``lua/`` to it): the update rule, its
fencing, a cancel, shared fate (docs/guide.md ("One room, one fate")), and the room consensus view and its read
(docs/guide.md ("The consensus view"))."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Optional, Union

from kvstatus import scripts
from kvstatus.errors import InvalidArgumentError
from kvstatus.keys import FATE_FIELD, reason_field, validate_name, validate_rooms
from kvstatus.model import (
    STRICT_CREATORS,
    CancelOutcome,
    FailureRecord,
    KVPoll,
    LeaseState,
    Outcome,
    Policy,
    RoomConsensus,
    RoomView,
    Stage,
    UpdateResult,
)
from kvstatus.replies import decode_status, parse_fate, text
from kvstatus.requests import Call, Request, script_call

if TYPE_CHECKING:  # a core is handed in; importing operations would stack this module on top of it
    from kvstatus.operations import StoreCore


def cancel_outcome(statuses: Iterable[Optional[KVPoll]], failed_before: bool) -> CancelOutcome:
    """What ``lua/cancel.lua`` does to one room with these entries' ``statuses`` (None: junk) and ``failed_before``
    (it has a first failure). ALREADY_SERVED (all Success, never failed) writes nothing, not even the TTL."""
    seen = list(statuses)
    if seen and all(s is KVPoll.Success for s in seen) and not failed_before:
        return CancelOutcome.ALREADY_SERVED
    return CancelOutcome.ALREADY_FAILED if failed_before else CancelOutcome.CANCELLED


def apply_rule(current: Optional[KVPoll], new: KVPoll, policy: Policy = Policy.SEED) -> UpdateResult:
    """Apply the update rule (docs/guide.md ("The update rule")) to one entry (``current`` None: missing)."""
    if current is None:
        if new == KVPoll.Failed:
            return UpdateResult(Outcome.IGNORED_MISSING, None)
        if policy == Policy.STRICT and new not in STRICT_CREATORS:
            return UpdateResult(Outcome.REFUSED_CREATE, None)
        return UpdateResult(Outcome.CREATED, new)
    if new == KVPoll.Failed:
        if current == KVPoll.Failed:
            return UpdateResult(Outcome.UNCHANGED, current)
        return UpdateResult(Outcome.FAILED, KVPoll.Failed)
    if current == KVPoll.Failed and policy == Policy.STRICT:
        return UpdateResult(Outcome.REFUSED_TERMINAL, current)
    if new > current:
        return UpdateResult(Outcome.ADVANCED, new)
    return UpdateResult(Outcome.UNCHANGED, current)


def apply_fenced(
    current: Optional[KVPoll],
    stamp: Optional[int],
    new: KVPoll,
    epoch: Optional[int],
    policy: Policy = Policy.SEED,
) -> tuple[UpdateResult, Optional[int]]:
    """The update rule with fencing (docs/guide.md ("Fencing: a restart under the same name")) of the entry's
    ``stamp`` and the writer's ``epoch`` (None: no lease, stamps untouched): the result and the stamp afterwards."""
    if epoch is None:
        return apply_rule(current, new, policy), stamp
    if stamp is not None and stamp > epoch:
        return UpdateResult(Outcome.REFUSED_SUPERSEDED, current), stamp
    if stamp is not None and stamp < epoch:
        current = None
    result = apply_rule(current, new, policy)
    return result, epoch if result.outcome.refreshes_ttl else stamp


STAGE_OF_STATUS = {
    KVPoll.Bootstrapping: Stage.BOOTSTRAP,
    KVPoll.WaitingForInput: Stage.WAITING,
    KVPoll.Transferring: Stage.TRANSFER,
    KVPoll.Success: Stage.TRANSFER,
}
"""The stage of a room that fails when an entry in the given status becomes Failed (lua/lib/fate.lua's table)."""


def shared_status(own: Optional[KVPoll], failure: Optional[FailureRecord], participant: str) -> Optional[KVPoll]:
    """``own`` (this participant's entry's status, or None) judged with the room's ``failure``: the table of
    docs/guide.md ("One room, one fate"); a failure it raised itself (not a cancel) does not fail it."""
    if failure is None or own is None or own is KVPoll.Success or own is KVPoll.Failed:
        return own
    if failure.origin == participant and failure.stage is not Stage.CANCELLED:
        return own  # its own failure, which its entry has since left (seed policy): the entry decides
    return KVPoll.Failed


def shared_failed(own: KVPoll, failure: FailureRecord, participant: str) -> KVPoll:
    """:func:`shared_status` of an entry that exists, in a room that has failed (typed for the near cache)."""
    status = shared_status(own, failure, participant)
    return own if status is None else status


def reads(view: RoomView) -> dict[str, Optional[KVPoll]]:
    """What each participant's reads of ``view`` answer (:func:`shared_status`): what every operator view shows."""
    return {name: shared_status(entry.status, view.failure, name) for name, entry in view.participants.items()}


TERMINAL = frozenset({KVPoll.Failed, KVPoll.Success})
"""The statuses an entry ends in."""


def lost_reason(participant: str) -> str:
    """The failure reason of an entry whose participant lost its lease (the consensus view's and the sweeper's)."""
    return f"participant {participant} lost its lease"


_PLAIN = {status: RoomConsensus(status) for status in KVPoll}


def room_consensus(
    participants: Sequence[str],
    statuses: Sequence[Optional[KVPoll]],
    leases: Sequence[LeaseState],
    reasons: Optional[Mapping[str, str]] = None,
    fate: Optional[FailureRecord] = None,
) -> RoomConsensus:
    """The consensus of one room (docs/guide.md ("The consensus view")); ``statuses[i]`` and ``leases[i]`` are
    ``participants[i]``'s, ``reasons`` the Failed entries' reasons, ``fate`` the room's first failure (None: shared
    fate off; else the room reads Failed while any entry is open or missing)."""
    lost = tuple(p for p, lease in zip(participants, leases) if lease == LeaseState.LOST)
    missing = tuple(p for p, s in zip(participants, statuses) if s is None)
    if lost:
        for p, status, lease in zip(participants, statuses, leases):
            if lease == LeaseState.LOST and status is not None and status not in TERMINAL:
                return RoomConsensus(KVPoll.Failed, lost_reason(p), lost, missing)
    if fate is not None:
        judged = [shared_status(s, fate, p) for p, s in zip(participants, statuses)]
        if missing or (KVPoll.Failed in judged and KVPoll.Failed not in statuses):  # judged is None where s is
            return RoomConsensus(KVPoll.Failed, fate.describe(), lost, missing)
        # An entry that failed itself: the minimum below, with that entry's own reason.
    if missing:
        return RoomConsensus(KVPoll.Bootstrapping, None, lost, missing)
    low: KVPoll = min(statuses)  # type: ignore[type-var,assignment]
    reason = None
    if low == KVPoll.Failed and reasons:
        reason = next((reasons[p] for p, s in zip(participants, statuses) if s == KVPoll.Failed and p in reasons), None)
    if reason is None and not lost:
        return _PLAIN[low]
    return RoomConsensus(low, reason, lost, ())


# ---- the consensus read

MAX_PARTICIPANTS = 64


def validate_participants(participants: Iterable[str]) -> tuple[str, ...]:
    """The expected participants as a tuple of valid, distinct names (1..64 of them)."""
    if isinstance(participants, (str, bytes)) or not isinstance(participants, Iterable):
        raise InvalidArgumentError(f"participants must be a list of participant names, not {participants!r}")
    names = tuple(validate_name(p, "participant") for p in participants)
    if not names or len(names) > MAX_PARTICIPANTS or len(set(names)) != len(names):
        raise InvalidArgumentError(f"expected 1..{MAX_PARTICIPANTS} distinct participant names, got {list(names)!r}")
    return names


_BY_CHAR: dict[str, Optional[KVPoll]] = {"-": None, **{str(status.value): status for status in KVPoll}}


class Entries(NamedTuple):
    """What the consensus view reads. ``codes[i]``: room ``rooms[i]``'s statuses, character j ``names[j]``'s ("0".."4",
    "-": no entry); ``reasons``: Failed entries' reasons by index ``i * len(names) + j``; ``epochs``: each lease
    record's incarnation (0: none), the fence of a sweep (``lua/sweep.lua``)."""

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
                status = decode_status(reply[j], keys[i], names[j])  # raises, naming the key
                char = "-" if status is None else str(status.value)
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
    found = {int(index): parse_fate(value, keys[int(index)]) for index, value in zip(indices, values)}
    return {i: record for i, record in found.items() if record is not None}


def consensus_calls(
    core: StoreCore, rooms: Iterable[int], participants: Iterable[str]
) -> Request[dict[int, RoomConsensus]]:
    """The :class:`~kvstatus.operations.Request` of ``room_statuses``: {room: RoomConsensus}, in one round trip."""

    read = entries_request(core, rooms, participants)
    return Request(read.calls, lambda replies: consensus_many(read.decode(replies)))
