"""The rooms a :class:`~kvstatus.sglang.RoomStatusMap` answered Failed on its own, without Redis saying so.

When Redis fails a status call (down, hung past the deadline, a lost lease), the map answers Failed for the
room (:mod:`kvstatus.sglang.outage`). In a dict, Failed is terminal: once one thread has read it, every later
read agrees. An answer made up during an outage must hold the same way. Otherwise the transfer thread that
read Failed drops its part (a chunk's acknowledgement, the Success), Redis answers again, and the scheduler
polls the room's real entry, still open, until SGLang's 300 s timeout. The e2e tier saw exactly that: a lease
lost during start-up, three requests without an answer after 120 s.

So each such room is kept in :class:`FailedHere`, and the map's reads of it answer Failed, with the reason,
until the engine removes the room (``pop``, ``del``, ``clear_room``): the end of its lifecycle. None is ever
forgotten before that, however many there are: a forgotten room would read its stale status again. The rooms
of one outage share its reason (one string), so a kept room costs a dict slot and its int (BENCHMARKS.md,
"Rooms failed here"). The map's dict-speed path stays on: it skips the rooms kept here (one
dict lookup).
"""

from __future__ import annotations

import threading
from typing import Optional

from kvstatus.sglang.roomids import storable


class FailedHere:
    """Room -> the reason the map failed it with. Thread-safe; :attr:`rooms` is read without the lock (a dict's
    ``get``, ``in`` and truth value are atomic)."""

    def __init__(self) -> None:
        self.rooms: dict[int, str] = {}
        self._lock = threading.Lock()

    def add(self, room: object, reason: str) -> None:
        """The map answered Failed for ``room`` with ``reason``; the first reason stays (ids the store cannot
        hold are failed from the start anyway: not kept)."""
        if not storable(room) or not isinstance(room, int):  # the second test only tells mypy
            return
        with self._lock:
            self.rooms.setdefault(room, reason)

    def reason(self, room: object) -> Optional[str]:
        """The reason ``room`` was failed with, or None when it is not kept."""
        return self.rooms.get(room) if self.rooms and isinstance(room, int) else None

    def discard(self, room: object) -> None:
        """The engine removed ``room``: its lifecycle, and this failure with it, is over."""
        if self.rooms and isinstance(room, int):
            with self._lock:
                self.rooms.pop(room, None)
