"""The entries a :class:`~kvstatus.sglang.RoomStatusMap` removed a moment ago, for the reads that race them.

SGLang threads share a KV manager's map: the scheduler pops concluded rooms while a transfer thread reads one
with ``room in m`` then ``m[room]``. A dict makes that window a few bytecodes wide; the map's ``pop`` spans a
round trip and GIL switches, so ``m[room]`` could raise ``KeyError`` for a room ``in`` had just found (it
killed mooncake's transfer thread in the e2e tier). :class:`Removals` remembers each removal for
:data:`REMOVAL_RACE_SECONDS` and the ones under way, so that ``m[room]`` by *another* thread that finds no entry
answers the removed status, as if it had come first (see ``RoomStatusMap._remove``).
"""

from __future__ import annotations

import threading
import time
from typing import Optional

from kvstatus.rule import KVPoll

REMOVAL_RACE_SECONDS = 5.0
"""Seconds after another thread removed an entry during which ``m[room]`` that finds none answers the removed
status: longer than a thread starved of the GIL on a loaded box waits between ``in`` and the read (over 50 ms
was seen), and a new entry in the room ends it at once."""


class Removals:
    """Removals of the last :data:`REMOVAL_RACE_SECONDS` (room -> status, monotonic seconds, thread id) and the
    removals under way. Thread-safe; the lock is never held across I/O."""

    def __init__(self) -> None:
        self._done: dict[int, tuple[KVPoll, float, int]] = {}  # oldest first
        self._under_way: dict[int, threading.Event] = {}
        self._lock = threading.Lock()

    def begin(self, room: int) -> threading.Event:
        """A removal of ``room`` starts; pass the returned event to :meth:`end`, whatever happens."""
        started = threading.Event()
        with self._lock:
            self._under_way[room] = started
        return started

    def end(self, room: int, started: threading.Event, status: Optional[KVPoll]) -> None:
        """The removal begun with ``started`` answered ``status`` (None: there was no entry, or it failed)."""
        with self._lock:
            done, now = self._done, time.monotonic()
            while done:  # drop what is past the grace, oldest first
                oldest = next(iter(done))
                if now - done[oldest][1] <= REMOVAL_RACE_SECONDS:
                    break
                del done[oldest]
            if status is not None:
                done.pop(room, None)
                done[room] = (status, now, threading.get_ident())
            if self._under_way.get(room) is started:
                del self._under_way[room]
        started.set()

    def reopened(self, room: int) -> None:
        """A new entry is being written in ``room``: its removal is past."""
        if self._done:
            with self._lock:
                self._done.pop(room, None)

    def seen_by_another_thread(self, room: int, wait: float) -> Optional[KVPoll]:
        """The status ``room``'s entry had if another thread removed it within :data:`REMOVAL_RACE_SECONDS`, else
        None; a removal still under way is waited for, at most ``wait`` seconds."""
        under_way = self._under_way.get(room)
        if under_way is not None:
            under_way.wait(wait)
        with self._lock:
            removed = self._done.get(room)
        if removed is None:
            return None
        status, at, by = removed
        if by != threading.get_ident() and time.monotonic() - at <= REMOVAL_RACE_SECONDS:
            return status
        return None
