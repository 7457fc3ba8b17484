"""Stuck rooms, named: which rooms sit in one status too long, and who holds each back (pure Python).

A room is *stuck* when one of its entries is still open (Bootstrapping, WaitingForInput or Transferring)
and none of its timelines (:mod:`kvstatus.timeline`) has moved for longer than a bound. Its *holder* is the
participant that holds it back: a role with no entry at all (a room of decode entries only waits for a
prefill that never wrote; see :mod:`kvstatus.naming`), else the open entry with the lowest status, the one
that has waited longest among equals. Rooms whose entries carry no timeline cannot be judged: their writers
do not record one (``timeline=True``; on by default for the SGLang plugin).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

from kvstatus.naming import ROLES, naming
from kvstatus.rule import OPEN, KVPoll, RoomView
from kvstatus.timeline import current_steps

DEFAULT_OLDER_THAN_SECONDS = 30.0
"""The bound ``kvstatus ls --stuck`` and the fleet views use unless told: well above a healthy room's whole life
(seconds), well below SGLang's 300 s timeouts."""


class Stuck(NamedTuple):
    """A stuck room: ``holder`` (a participant, or ``"<role> (no entry)"``), the holder's ``status`` (None when
    it has no entry), and ``seconds`` since any entry of the room last changed."""

    room: int
    holder: str
    status: Optional[KVPoll]
    seconds: float

    def to_json(self) -> dict[str, Any]:
        """``{"room", "holder", "status"}`` (the status' name, None when the holder has no entry) and ``"seconds"``
        (whole ms): what ``ls --stuck --json`` prints and the board serves (the board's room as a string)."""
        status = None if self.status is None else self.status.name
        return {"room": self.room, "holder": self.holder, "status": status, "seconds": round(self.seconds, 3)}


def missing_holder(role: str) -> str:
    """The holder named for a room in which ``role`` has no entry."""
    return f"{role} (no entry)"


def stuck(view: RoomView, now_ms: int, older_than: float = DEFAULT_OLDER_THAN_SECONDS) -> Optional[Stuck]:
    """``view`` as a :class:`Stuck` room at ``now_ms`` (Unix ms, Redis' clock), or None: done, failed, moving,
    or without timelines. ``older_than`` in seconds. An entry whose timeline's last step is not its status
    (:func:`~kvstatus.timeline.current_steps`: capped at 160 bytes) moved at a time no timeline says: the room
    is not judged stuck."""
    entries = {name: entry.status for name, entry in view.participants.items() if entry.status is not None}
    if not any(status in OPEN for status in entries.values()) or view.failure is not None:
        return None
    last_steps = {}
    for name, steps in view.timelines.items():
        if steps and name in entries:
            if not current_steps(steps, entries[name]):
                return None
            last_steps[name] = steps[-1].at_ms
    if not last_steps:
        return None
    seconds = max(0, now_ms - max(last_steps.values())) / 1000
    if seconds < older_than:
        return None
    roles = {naming(name).role for name in entries}
    if roles & set(ROLES):
        for role in ROLES:
            if role not in roles:
                return Stuck(view.room, missing_holder(role), None, seconds)
    open_entries = [(status, last_steps.get(name, 0), name) for name, status in entries.items() if status in OPEN]
    status, _, holder = min(open_entries)
    return Stuck(view.room, holder, status, seconds)
