"""What the operator tools parse from a person and show of a room: a room id or status as typed, the rule explained
in a sentence, and a room's fate as every view shows it."""

from __future__ import annotations

from typing import Optional

from kvstatus.errors import InvalidRoomError, InvalidStatusError
from kvstatus.keys import validate_room
from kvstatus.model import KVPoll, Outcome, Policy, RoomView
from kvstatus.rule import apply_rule, reads


def parse_room(text: str) -> int:
    """Parse a room id typed by a person (decimal digits)."""
    stripped = text.strip()
    if not stripped.isdigit() or not stripped.isascii():
        raise InvalidRoomError(f"invalid room {text!r}: expected a decimal integer in [0, 2**63 - 1]")
    return validate_room(int(stripped))


def parse_status(text: str) -> KVPoll:
    """Parse a status name (case-insensitive) or number, as typed by a person."""
    stripped = text.strip().lower()
    for member in KVPoll:
        if stripped in (member.name.lower(), str(member.value)):
            return member
    names = ", ".join(f"{m.name}={m.value}" for m in KVPoll)
    raise InvalidStatusError(f"invalid status {text!r}: expected one of {names}")


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


def read_names(view: RoomView) -> dict[str, Optional[str]]:
    """:func:`kvstatus.rule.reads` as KVPoll names (None: no status), as the views' JSON shows them."""
    return {name: None if status is None else status.name for name, status in reads(view).items()}


def failed_by_fate(view: RoomView) -> list[str]:
    """The participants whose entry is still open but whose reads answer Failed, because the room failed."""
    return [name for name, status in reads(view).items() if status != view.participants[name].status]


def fate_text(view: RoomView) -> Optional[str]:
    """The room's first failure and who reads Failed by it, e.g. "failed at transfer by prefill-1: NIXL transfer
    timed out; decode-1 reads Failed (shared fate)", or None; not escaped."""
    if view.failure is None:
        return None
    line = view.failure.describe()
    shared = failed_by_fate(view)
    if shared:
        line += f"; {', '.join(shared)} {'reads' if len(shared) == 1 else 'read'} Failed (shared fate)"
    return line
