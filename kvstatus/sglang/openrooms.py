"""The rooms a :class:`~kvstatus.sglang.RoomStatusMap` has open, and a Redis that forgot them.

A manager's entry in a room exists from its opening write until the engine removes it (``pop``, ``del``,
``clear_room``), or until the room's TTL runs out without a write. Redis restarted without persistence, a
failover to a replica that never had the entry, or a flush drop it in between: upstream's dict cannot lose an
entry, so SGLang then meets ``KeyError`` from ``check_status``, a Success that finds no entry is refused, and a
WaitingForInput creates the entry again in a room nothing will ever fail.

So the map keeps the rooms it has open (:class:`OpenRooms`), and **an open entry is its own marker**: a read
that finds no entry for an open room, or a write whose outcome says the entry was missing (CREATED,
REFUSED_CREATE, IGNORED_MISSING), shows that Redis lost it. That costs no round trip (the read or write was
made anyway) and needs no key of its own: on a cluster it judges each room on the node that holds it, and a
failover to a replica that has the data keeps the entry, so it is not taken for a loss.

**Only an order Redis kept is evidence.** Threads of one manager write and read a room at once (the
scheduler, the bootstrap and transfer threads), and each handles its reply when it gets the GIL, not in the
order Redis ran the calls. So a call that found no entry proves a loss only when it was *sent* after a reply
that showed the entry had come back (Redis ran the two in that order); a CREATED handled after another
thread's WaitingForInput, both sent at once, is the first write, not a loss. In the same way a write sent
before the engine removed the room does not open it again when its reply comes after the removal. The room then reads
Failed on every path, with :func:`lost_reason`; the write is not kept (a CREATED is removed at once), and
later writes of the room are refused without I/O, until the engine removes it. A room whose last write is
older than the store's TTL expired instead, and is forgotten.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Optional

from kvstatus.model import KVPoll, Outcome, UpdateResult

LOST_RESULT = UpdateResult(Outcome.REFUSED_CREATE, KVPoll.Failed)
"""What a write of a room Redis lost returns: nothing is kept, and reads answer Failed."""

_HOLDS_ENTRY = (Outcome.CREATED, Outcome.ADVANCED, Outcome.FAILED, Outcome.UNCHANGED)
_FOUND_NONE = (Outcome.CREATED, Outcome.REFUSED_CREATE, Outcome.IGNORED_MISSING)


def lost_reason(participant: str, room: int) -> str:
    """The failure reason of an open room whose entry Redis no longer holds."""
    return (
        f"kvstatus: Redis lost its data: participant {participant}'s entry in room {room} is gone though this "
        "manager never removed it and its TTL had not run out (Redis restarted without persistence, failed over "
        "to a replica that did not have it, or was flushed; or a sweep removed it after a lost lease)"
    )


REMOVALS_KEPT = 60.0
"""Seconds a removal is remembered, so that the late reply of a write sent before it does not open the room
again: far beyond a call's deadline and its resends."""


class OpenRooms:
    """The open rooms, room -> monotonic time at which this map last handled a write's reply that left an entry
    (oldest first), and the rooms found lost (kept until the engine removes them). Thread-safe; :attr:`rooms`
    and :attr:`lost` are read without the lock (``in`` on a dict or set is atomic). ``ttl``: the store's room
    TTL, seconds. ``started`` arguments: the monotonic time the call was sent (before its round trip)."""

    def __init__(self, participant: str, ttl: float) -> None:
        self.participant, self.ttl = participant, ttl
        self.rooms: OrderedDict[int, float] = OrderedDict()
        self.lost: set[int] = set()
        self._removed: OrderedDict[int, float] = OrderedDict()  # room -> when the engine removed it, oldest first
        self._lock = threading.Lock()

    def wrote(self, room: int, result: UpdateResult, started: float) -> Optional[str]:
        """This map's write of ``room``, sent at ``started``, answered ``result``: the reason to fail the room
        when the outcome shows that Redis lost the entry of an open room, else None (the room is open, or stays
        as it was)."""
        now = time.monotonic()
        with self._lock:
            removed = self._removed.get(room)
            if removed is not None and started <= removed:
                return None  # sent before the engine removed the room: its reply opens nothing again
            at = self.rooms.get(room)
            if at is not None and at < started and result.outcome in _FOUND_NONE and now - at < self.ttl:
                return self._lose(room)
            if result.outcome in _HOLDS_ENTRY:
                self.rooms[room] = now
                self.rooms.move_to_end(room)
                while now - next(iter(self.rooms.values())) >= self.ttl:  # expired (no write for a TTL)
                    self.rooms.popitem(last=False)
        return None

    def vanished(self, room: int, started: float) -> Optional[str]:
        """A read of ``room`` sent at ``started`` found no entry of this map's participant: the reason to fail it
        when the room is open (Redis lost the entry), else None (not open, opened by a reply handled after the
        read was sent, or expired after its TTL: no entry is the truth)."""
        if room not in self.rooms:
            return None
        with self._lock:
            at = self.rooms.get(room)
            if at is None or at >= started:
                return None
            if time.monotonic() - at >= self.ttl:
                del self.rooms[room]
                return None
            return self._lose(room)

    def _lose(self, room: int) -> str:
        del self.rooms[room]
        self.lost.add(room)
        return lost_reason(self.participant, room)

    def removed(self, room: object) -> None:
        """The engine removes ``room`` (called before the removal is sent): it is neither open nor lost any more,
        and a write sent before now does not open it again."""
        if type(room) is int:
            now = time.monotonic()
            with self._lock:
                self.rooms.pop(room, None)
                self.lost.discard(room)
                self._removed[room] = now
                self._removed.move_to_end(room)
                while now - next(iter(self._removed.values())) > REMOVALS_KEPT:
                    self._removed.popitem(last=False)
