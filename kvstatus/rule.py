"""The pure-Python reference of the rules the Lua scripts run: the update rule, its fencing, a cancel.

The Lua script ``lua/update.lua`` is the rule that runs; :func:`apply_rule` is
the same table in Python, used as the oracle in tests, by ``kvstatus explain``
and by the demo's baselines. Change one and the tests force you to change the other.

One room, one fate: SGLang keeps one ``request_status`` dict per KV manager, and when one side of a room
fails upstream tells the other by a ZMQ message, lost when the peer is gone. kvstatus holds every
participant's entry in one room hash, so with ``shared_fate`` on (the default) a read answers Failed as soon
as the room failed for anyone: :func:`shared_status`, with its table, judges an entry with the room's first
failure (written once per room by ``lua/lib/fate.lua`` under :data:`kvstatus.keys.FATE_FIELD`; the read
rewrites no entry). :func:`reads` and :func:`fate_text` are what every operator view shows of it.
:func:`room_consensus` gives a room one status over its expected participants.
The data these rules take and give is :mod:`kvstatus.model`.
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
    """What ``lua/cancel.lua`` does to one room (the reference the tests hold the script to).

    ``statuses``: the room's entries (None for a value kvstatus does not write); ``failed_before``: the room has
    a first failure. ALREADY_SERVED when it has entries, all Success, and never failed: nothing is written (no
    entry failed, no first failure, TTL untouched), so health still counts it as served. Else its open entries
    become Failed, and the outcome is ALREADY_FAILED if it had failed before, CANCELLED if not."""
    seen = list(statuses)
    if seen and all(s is KVPoll.Success for s in seen) and not failed_before:
        return CancelOutcome.ALREADY_SERVED
    return CancelOutcome.ALREADY_FAILED if failed_before else CancelOutcome.CANCELLED


def apply_rule(current: Optional[KVPoll], new: KVPoll, policy: Policy = Policy.SEED) -> UpdateResult:
    """Apply the update rule (README, "The update rule") to one participant's entry (``current`` None: missing)."""
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
    """The update rule with fencing (``lua/update.lua``): ``stamp`` is the epoch the entry carries (None: none),
    ``epoch`` the writer's (None: a writer without a lease, which neither reads nor writes stamps). Returns the
    result and the entry's stamp afterwards. A write from an older epoch than the stamp is REFUSED_SUPERSEDED;
    an entry stamped with an older epoch is a previous incarnation's, missing for this one (a restarted
    process' dict is empty); any outcome that writes or touches the entry stamps it with the writer's epoch."""
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
    """This participant's status under shared fate: ``own`` (its entry's status, or None) judged with the
    room's ``failure``.

    SGLang keeps one ``request_status`` dict per KV manager; kvstatus holds every participant's entry in one
    room hash, so with ``shared_fate`` on a read answers Failed as soon as the room failed for anyone
    (`One room, one fate` in the guide):

    =====================  ==================================  ==================================
    own entry              a peer's entry became Failed        the room was cancelled
    =====================  ==================================  ==================================
    missing                missing (nothing to fail)           missing (nothing to fail)
    Bootstrapping          Failed                              Failed (and stored by the cancel)
    WaitingForInput        Failed                              Failed (and stored by the cancel)
    Transferring           Failed                              Failed (and stored by the cancel)
    Success                Success (its part is done)          Success (its part is done)
    Failed                 Failed                              Failed
    =====================  ==================================  ==================================

    A failure this participant raised itself is its own entry's business: under the ``seed`` policy an
    entry may leave Failed, and its reads then follow the entry, exactly as upstream's dict would. So one
    participant alone never reads anything the per-entry rule would not give it: the differential tests
    against SGLang's ``update_status`` hold with shared fate on."""
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
    """The consensus of one room: ``statuses[i]`` and ``leases[i]`` belong to ``participants[i]``.

    The rule, for a room and its expected participants (first match wins):

    1. **Failed**, reason "participant P lost its lease", if a participant whose
       lease is lost (it held one, and it expired or was released) has an entry
       that is not terminal (neither Failed nor Success): that entry can never
       finish.
    2. **Bootstrapping** if an expected participant has no entry yet (the
       semantics of SGLang's ``check_status_pp_consensus``).
    3. Otherwise the **minimum** over the entries; when that is Failed, the reason
       is the first recorded failure reason among the Failed entries.

    A participant that never held a lease is never lost: it only counts through
    its entry.

    ``reasons`` maps a participant to its recorded failure reason (only Failed entries are looked up);
    ``fate`` is the room's first failure (shared fate: None when the reader has it off). A room that failed reads
    Failed, naming its first failure, while any expected participant's entry is open or missing (none will serve
    it), as ``get`` does; once every entry is at Success it reads Success.
    """
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
        # An entry that failed itself: the minimum below, with that entry's own reason, as before.
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
