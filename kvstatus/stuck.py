"""Stuck rooms, named: which rooms sit in one status too long, and who holds each back (pure Python).

A room is *stuck* when one of its entries is still open (Bootstrapping, WaitingForInput or Transferring)
and none of its timelines (:mod:`kvstatus.timeline`) has moved for longer than a bound. Its *holder* is the
participant that holds it back: a role with no entry at all (a room of decode entries only waits for a
prefill that never wrote; see :func:`kvstatus.keys.naming`), else the open entry with the lowest status, the one
that has waited longest among equals. Rooms whose entries carry no timeline cannot be judged: their writers
do not record one (``timeline=True``; on by default for the SGLang plugin). A room with an open entry that a dead
participant left is stuck at once, held by the dead one (``dead``, read from the leases by the admin tools).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple, Optional, TypedDict

from kvstatus.keys import ROLES, naming
from kvstatus.model import OPEN, KVPoll, RoomView
from kvstatus.timeline import current_steps

DEFAULT_OLDER_THAN_SECONDS = 30.0
"""The bound ``kvstatus ls --stuck`` and the fleet views use unless told: well above a healthy room's whole life
(seconds), well below SGLang's 300 s timeouts."""


class StuckJson(TypedDict):
    """:meth:`Stuck.to_json`: what ``ls --stuck --json`` prints and the board serves."""

    room: int
    holder: str
    status: Optional[str]
    seconds: float
    dead: bool


class Stuck(NamedTuple):
    """A stuck room: ``holder`` (a participant, or ``"<role> (no entry)"``), the holder's ``status`` (None when
    it has no entry), ``seconds`` since any entry of the room last changed (without a timeline: since the
    holder died), and whether the holder is ``dead`` (it died or restarted, leaving its entry open)."""

    room: int
    holder: str
    status: Optional[KVPoll]
    seconds: float
    dead: bool = False

    def to_json(self) -> StuckJson:
        """``{"room", "holder", "status"}`` (the status' name, None when the holder has no entry), ``"seconds"``
        (whole ms) and ``"dead"``: what ``ls --stuck --json`` prints and the board serves."""
        status = None if self.status is None else self.status.name
        seconds = round(self.seconds, 3)
        return {"room": self.room, "holder": self.holder, "status": status, "seconds": seconds, "dead": self.dead}


def missing_holder(role: str) -> str:
    """The holder named for a room in which ``role`` has no entry."""
    return f"{role} (no entry)"


def stuck(
    view: RoomView, now_ms: int, older_than: float = DEFAULT_OLDER_THAN_SECONDS, dead: Mapping[str, int] = {}
) -> Optional[Stuck]:
    """``view`` as a :class:`Stuck` room at ``now_ms`` (Unix ms, Redis' clock), or None: done, failed, moving,
    or without timelines. ``older_than`` in seconds. An entry whose timeline's last step is not its status
    (:func:`~kvstatus.timeline.current_steps`: capped at 160 bytes) moved at a time no timeline says: the room
    is not judged stuck.

    ``dead``: participant -> when it died (Unix ms), for the open entries a dead or restarted participant left
    (:meth:`kvstatus.admin.reads.Deaths.left`). Such a room never moves again: it is stuck at once, whatever
    its timelines say, and its holder is the dead participant (the lowest status among several)."""
    entries = {name: entry.status for name, entry in view.participants.items() if entry.status is not None}
    if not any(status in OPEN for status in entries.values()) or view.failure is not None:
        return None
    left = {name: at for name, at in dead.items() if entries.get(name) in OPEN}
    if left:
        moved = [steps[-1].at_ms for name, steps in view.timelines.items() if steps and name in entries]
        since = max(moved) if moved else max(left.values())
        status, holder = min((entries[name], name) for name in left)
        return Stuck(view.room, holder, status, max(0, now_ms - since) / 1000, dead=True)
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
