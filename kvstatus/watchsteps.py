"""What the peer watch does about a look's :class:`~kvstatus.peerwatch.WatchPlan`, every step planned here (no I/O).

:func:`act` is a generator: it yields each :class:`~kvstatus.requests.Request` and takes its decoded reply back
(``send``), or the error the send raised (``throw``: a ``finally`` here still runs, then the error goes on to the
caller). The lease keeper and its sync twin only send, so this policy is written once for both.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING, Any, Optional

from kvstatus import scripts
from kvstatus.cachestate import writes_sent
from kvstatus.consensus import Entries, entries_request
from kvstatus.keys import incarnation_field, is_decode, reason_field
from kvstatus.leasestate import log
from kvstatus.model import OPEN, KVPoll, LeaseState, Outcome, Stage
from kvstatus.requests import Request, script_call
from kvstatus.rule import lost_reason

if TYPE_CHECKING:  # the watch is handed in; importing it would stack this module on top of it
    from kvstatus.operations import StoreCore
    from kvstatus.peerwatch import PeerWatch, WatchPlan

Steps = Generator[Request[Any], Any, Any]
"""Requests out, their decoded replies in; returns what the step's docstring says."""


def restart_reason(participant: str) -> str:
    return f"participant {participant} restarted; this entry was its previous incarnation's"


def orphan_reason(room: int, seconds: float) -> str:
    return (
        f"no decode joined room {room} within {seconds:g} s: the decode it was sent to is dead or never got the request"
    )


def died_reason(participant: str) -> str:
    return f"participant {participant} died: its connection to Redis closed"


def awaited_reason(participant: str, address: str, stage: Stage) -> str:
    """The failure reason of this store's entry in a room waiting on ``participant``, lost or restarted first."""
    if stage is Stage.SUPERSEDED:
        return f"participant {participant} restarted; this room waited on its previous incarnation at {address}"
    return f"participant {participant} lost its lease; this room waits on it at {address}"


def act(watch: PeerWatch, plan: WatchPlan) -> Steps:
    """Carry out ``plan``; returns how many entries were failed."""
    failed = 0
    for name, rooms in plan.suspects.items():
        if rooms:
            entries = yield entries_request(watch.core, rooms, [name])
            state = entries.leases[0]
            if state is LeaseState.ALIVE:  # by Redis' clock; silent for its TTL by this one's: expired
                silent = yield watch.silence_request(name)
                if silent is not None and (yield watch.expire_request(name, *silent)):
                    state = LeaseState.LOST
            watch.confirmed(name, state)
            if state is LeaseState.LOST:
                failed += yield from _fail_gone(watch, entries, name, lost_reason(name))
    for name, rooms in plan.dead.items():
        if rooms:
            entries = yield entries_request(watch.core, rooms, [name])
            failed += yield from _fail_gone(watch, entries, name, died_reason(name))
    for name, rooms in plan.restarted.items():
        # The new incarnation's epoch fences its own entries off: it may have written these rooms already.
        below, address = yield watch.identity_request(name)
        outcomes = yield from _fail(watch, rooms, name, Stage.SUPERSEDED, restart_reason(name), below)
        failed += outcomes.count(Outcome.FAILED)
        # Rooms it never wrote, or (unless its previous incarnation released its lease) in which that incarnation
        # reached Success (REFUSED_TERMINAL): what it owed this side after that went with it, as for a loss above.
        owed = (
            (Outcome.IGNORED_MISSING,) if name in plan.orderly else (Outcome.IGNORED_MISSING, Outcome.REFUSED_TERMINAL)
        )
        absent = [room for room, outcome in zip(rooms, outcomes) if outcome in owed]
        failed += yield from _fail_awaiting(watch, absent, name, address, Stage.SUPERSEDED)
    if plan.orphans:
        failed += yield from _fail_orphans(watch, plan.orphans, plan.orphan_seconds)
    if plan.forget:
        yield watch.forget_request(plan.forget)
    return failed


def _fail_orphans(watch: PeerWatch, rooms: list[int], seconds: float) -> Steps:
    """Fail this store's own entry, still Bootstrapping, in those of ``rooms`` that no decode joined within
    ``seconds`` (one read a room); returns how many were failed."""
    core, failed = watch.core, 0
    for room in rooms:
        view = yield core.room(room)
        own = view.participants.get(watch.participant)
        if own is None or own.status is not KVPoll.Bootstrapping or any(map(is_decode, view.participants)):
            watch.joined(room)
            continue
        try:
            yield core.record_failure(room, orphan_reason(room, seconds))
            result = yield core.update_status(room, KVPoll.Failed)
        finally:
            writes_sent(core.schema, [room])  # this process's reads of the room see the failure at once
        watch.wrote(room, result.status)
        failed += result.outcome is Outcome.FAILED
    if failed:
        log.warning(
            "participant %s: %d of its rooms failed: no decode joined them within %g s",
            watch.participant,
            failed,
            seconds,
        )
    return failed


def _fail_gone(watch: PeerWatch, entries: Entries, name: str, reason: str) -> Steps:
    """Fail the open entries (in ``entries``, just read) of ``name``, which lost its lease or died; returns how
    many entries were failed."""
    open_rooms = [room for i, room in enumerate(entries.rooms) if entries.statuses(i)[0] in OPEN]
    below = entries.epochs[0] + 1 if entries.epochs[0] else None  # not a later incarnation's
    outcomes = yield from _fail(watch, open_rooms, name, Stage.LEASE_LOST, reason, below)
    failed: int = outcomes.count(Outcome.FAILED)
    # Rooms that wait on the peer by address and that it never wrote, or (unless it released its
    # lease: an orderly exit first sends what it owes) in which it reached Success: what it owed this
    # side after that (SGLang's decode waits for the prefill's completion message) will not come.
    done = None if watch.released(name) else KVPoll.Success
    absent = [room for i, room in enumerate(entries.rooms) if entries.statuses(i)[0] in (None, done)]
    if watch.awaits_any(absent):
        address = watch.peer_address(name)
        if address is None:
            address = (yield watch.identity_request(name))[1]
        failed += yield from _fail_awaiting(watch, absent, name, address, Stage.LEASE_LOST, reason)
    return failed


def _fail_awaiting(
    watch: PeerWatch,
    rooms: list[int],
    name: str,
    address: Optional[str],
    stage: Stage,
    cause: Optional[str] = None,
) -> Steps:
    """Fail this store's own open entries in those of ``rooms`` (where ``name`` has no entry) that wait on
    ``name`` at its ``address`` (None: it has none, nothing to do), naming ``cause`` (what happened to ``name``;
    None: the stage says); returns how many were failed."""
    awaiting = [] if address is None else watch.awaiting(rooms, address)
    if address is None or not awaiting:
        return 0
    reason = awaited_reason(name, address, stage) if cause is None else f"{cause}; this room waits on it at {address}"
    outcomes = yield from _fail(watch, awaiting, watch.participant, stage, reason, None)
    for room, outcome in zip(awaiting, outcomes):
        if outcome is Outcome.FAILED:
            watch.closed(room)
    return outcomes.count(Outcome.FAILED)


def _fail(watch: PeerWatch, rooms: list[int], name: str, stage: Stage, reason: str, below: Optional[int]) -> Steps:
    """Fail ``name``'s open entries in ``rooms`` (logged), but those stamped ``below`` or later (an incarnation
    epoch; None: no fence); returns the outcome in each room, in order."""
    if not rooms:
        return []
    try:
        outcomes: list[Outcome] = yield fail_entries_request(watch.core, rooms, name, stage, reason, below)
    finally:
        writes_sent(watch.core.schema, rooms)  # this process's reads of those rooms see the failure at once
    failed = outcomes.count(Outcome.FAILED)
    if failed:
        log.warning(
            "participant %s: %s; failed %s's open entries in %d of this participant's rooms (stage %s)",
            watch.participant,
            reason,
            name,
            failed,
            stage.value,
        )
    return outcomes


def fail_entries_request(
    core: StoreCore, rooms: list[int], participant: str, stage: Stage, reason: str, below: Optional[int] = None
) -> Request[list[Outcome]]:
    """The calls failing ``participant``'s open entries in ``rooms`` with ``reason`` and the room's first failure
    at ``stage`` (``lua/sweep.lua``: one call per chunk of rooms, per slot on a cluster). ``below``: the fence,
    an incarnation epoch; entries stamped with it or a later one are left alone (None: no fence). Decodes to
    the outcome in each room, in the order of ``rooms``."""
    keys = core.schema.room_keys(rooms)
    args: tuple[str, ...] = (participant, reason_field(participant), reason, stage.value)
    if below is not None:
        args += (incarnation_field(participant), str(below))
    groups = core.chunks(keys)
    calls = [script_call(scripts.SWEEP, [keys[i] for i in group], args) for group in groups]

    def decode(replies: list[Any]) -> list[Outcome]:
        outcomes = [Outcome.UNCHANGED] * len(keys)
        for group, reply in zip(groups, replies):
            for i, code in zip(group, reply):
                outcomes[i] = Outcome(code)
        return outcomes

    return Request(calls, decode)
