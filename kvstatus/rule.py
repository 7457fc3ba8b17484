"""The pure-Python reference of the rules the Lua scripts run: the update rule, its fencing, a cancel, shared fate.

``lua/update.lua`` is the rule that runs; :func:`apply_rule` is the same table in Python, the oracle of the tests,
of ``kvstatus explain`` and of the demo's baselines: change one and the tests force you to change the other.
:func:`shared_status` judges an entry with the room's first failure (written once per room by ``lua/lib/fate.lua``
under :data:`kvstatus.keys.FATE_FIELD`; a read rewrites no entry): docs/guide.md ("One room, one fate").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Optional

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


def cancel_outcome(statuses: Iterable[Optional[KVPoll]], failed_before: bool) -> CancelOutcome:
    """What ``lua/cancel.lua`` does to one room (its oracle). ``statuses``: the room's entries (None: a value
    kvstatus does not write); ``failed_before``: the room has a first failure. ALREADY_SERVED (entries, all Success,
    never failed): nothing is written, not even the TTL, so health still counts it as served. Else its open entries
    become Failed: ALREADY_FAILED if it had failed before, CANCELLED if not."""
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
    """The update rule with fencing (``lua/update.lua``; its table: docs/guide.md ("Fencing: a restart under
    the same name")). ``stamp``: the epoch the entry carries, ``epoch``: the writer's (None: none; a writer without a
    lease neither reads nor writes stamps). Returns the result and the entry's stamp afterwards."""
    if epoch is None:
        return apply_rule(current, new, policy), stamp
    if stamp is not None and stamp > epoch:
        return UpdateResult(Outcome.REFUSED_SUPERSEDED, current), stamp
    if stamp is not None and stamp < epoch:
        current = None
    result = apply_rule(current, new, policy)
    return result, epoch if result.outcome.refreshes_ttl else stamp


def explain(current: Optional[KVPoll], new: KVPoll, policy: Policy = Policy.SEED) -> str:
    """One sentence saying which row of the rule fires for (current, new) and why."""
    result = apply_rule(current, new, policy)
    cur = "missing" if current is None else f"{current.name}({current.value})"
    why = {
        Outcome.IGNORED_MISSING: "a Failed update never creates an entry: the room was cleared or never existed, "
        "so a late abort must not resurrect it",
        Outcome.CREATED: "a missing entry is created by a non-Failed status",
        Outcome.FAILED: "Failed overrides any stored status",
        Outcome.UNCHANGED: "the stored status is kept: it is already Failed or at least as far along",
        Outcome.ADVANCED: "statuses only move forward: the new one is greater than the stored one",
        Outcome.REFUSED_TERMINAL: "under the strict policy Failed is terminal",
        Outcome.REFUSED_CREATE: "under the strict policy only Bootstrapping or WaitingForInput may create an entry; "
        "a late status for a cleared room is refused",
        Outcome.REFUSED_SUPERSEDED: "a later incarnation of the participant wrote the entry",
    }[result.outcome]
    after = "no entry" if result.status is None else f"{result.status.name}({result.status.value})"
    return f"{cur} + {new.name}({new.value}) under {policy.value}: {result.outcome.name} -> {after}; {why}."


STAGE_OF_STATUS = {
    KVPoll.Bootstrapping: Stage.BOOTSTRAP,
    KVPoll.WaitingForInput: Stage.WAITING,
    KVPoll.Transferring: Stage.TRANSFER,
    KVPoll.Success: Stage.TRANSFER,
}
"""The stage of a room that fails when an entry in the given status becomes Failed (lua/lib/fate.lua's table)."""


def shared_status(own: Optional[KVPoll], failure: Optional[FailureRecord], participant: str) -> Optional[KVPoll]:
    """This participant's status under shared fate: ``own`` (its entry's status, or None) judged with the room's
    ``failure``, by the table of docs/guide.md ("One room, one fate"). A failure it raised itself (not a cancel) does
    not fail it (a ``seed`` entry may have left it): the differential tests against SGLang's ``update_status`` hold."""
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
    """What each participant's reads of ``view`` answer: its own entry's status judged with the room's first
    failure (:func:`shared_status`). Every operator view (``get``, ``ls``, ``stats``, ``health``, ``watch``, the
    board, the exporter) shows and counts these, so none shows an entry open in a room that has failed."""
    return {name: shared_status(entry.status, view.failure, name) for name, entry in view.participants.items()}


def read_names(view: RoomView) -> dict[str, Optional[str]]:
    """:func:`reads` as KVPoll names (None: no status), as the views' JSON shows them."""
    return {name: None if status is None else status.name for name, status in reads(view).items()}


def failed_by_fate(view: RoomView) -> list[str]:
    """The participants whose entry is still open but whose reads answer Failed, because the room failed."""
    return [name for name, status in reads(view).items() if status != view.participants[name].status]


def fate_text(view: RoomView) -> Optional[str]:
    """The room's fate in one line, or None when it has not failed: its first failure, and who reads Failed by
    it though their own entry is open, e.g. "failed at transfer by prefill-1: NIXL transfer timed out;
    decode-1 reads Failed (shared fate)". Not escaped: a view shows it through its own escaping."""
    if view.failure is None:
        return None
    line = view.failure.describe()
    shared = failed_by_fate(view)
    if shared:
        line += f"; {', '.join(shared)} {'reads' if len(shared) == 1 else 'read'} Failed (shared fate)"
    return line


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
    """The consensus of one room (``statuses[i]`` and ``leases[i]`` are ``participants[i]``'s), first match wins:
    Failed if a lost lease holds an open entry; Bootstrapping while an entry is missing (SGLang's
    ``check_status_pp_consensus``); else the minimum, Failed naming the first recorded reason (docs/guide.md ("The
    consensus view")). ``reasons``: participant -> its failure reason (looked up for Failed entries only); ``fate``:
    the room's first failure (None: shared fate off). A failed room reads Failed, naming it, while any expected
    entry is open or missing, as ``get`` does; once every entry is at Success it reads Success."""
    lost = tuple(p for p, lease in zip(participants, leases) if lease == LeaseState.LOST)
    if lost:
        for p, status, lease in zip(participants, statuses, leases):
            if lease == LeaseState.LOST and status is not None and status not in TERMINAL:
                missing = tuple(q for q, s in zip(participants, statuses) if s is None)
                return RoomConsensus(KVPoll.Failed, lost_reason(p), lost, missing)
    if fate is not None:
        judged = [shared_status(s, fate, p) for p, s in zip(participants, statuses)]
        if None in judged or (KVPoll.Failed in judged and KVPoll.Failed not in statuses):
            missing = tuple(q for q, s in zip(participants, judged) if s is None)
            return RoomConsensus(KVPoll.Failed, fate.describe(), lost, missing)
        # An entry that failed itself: the minimum below, with that entry's own reason.
    if None in statuses:
        return RoomConsensus(
            KVPoll.Bootstrapping, None, lost, tuple(p for p, s in zip(participants, statuses) if s is None)
        )
    low: KVPoll = min(statuses)  # type: ignore[type-var,assignment]
    reason = None
    if low == KVPoll.Failed and reasons:
        reason = next((reasons[p] for p, s in zip(participants, statuses) if s == KVPoll.Failed and p in reasons), None)
    if reason is None and not lost:
        return _PLAIN[low]
    return RoomConsensus(low, reason, lost, ())
