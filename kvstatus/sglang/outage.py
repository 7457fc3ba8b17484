"""What a KV manager's map answers without Redis, since nothing may raise into SGLang's scheduler loop or threads: room
ids it cannot store, outages (:class:`Outage`), the rooms it failed itself (:class:`FailedHere`), removals that race a
read (:class:`Removals`) and open rooms whose entry Redis lost (:class:`OpenRooms`; invariant: a missing entry shows a
loss only to a call *sent* after the reply that showed it). docs/sglang.md ("How the plugin works inside")."""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import OrderedDict
from typing import Any, Callable, Optional, TypeGuard

from kvstatus.errors import BackendError, KVStatusError, LeaseLostError
from kvstatus.keys import MAX_ROOM
from kvstatus.model import KVPoll, Outcome, UpdateResult

log = logging.getLogger("kvstatus.sglang")

INVALID_ROOM_RESULT = UpdateResult(Outcome.REFUSED_CREATE, KVPoll.Failed)
"""What a write of a room id kvstatus cannot store returns: nothing was written, and reads answer Failed."""


def storable(room: object) -> TypeGuard[int]:
    """True for a room id the store accepts: an int (not bool) in [0, 2**63 - 1]."""
    return isinstance(room, int) and not isinstance(room, bool) and 0 <= room <= MAX_ROOM


def invalid_room_reason(room: object) -> str:
    """The failure reason of a request whose ``bootstrap_room`` kvstatus cannot store (its repr cut to 40 chars)."""
    shown = repr(room)
    if len(shown) > 40:
        shown = shown[:37] + "..."
    return (
        f"bootstrap_room {shown} ({type(room).__name__}) is not a room id kvstatus can store (an int in "
        "[0, 2**63 - 1]): the request fails"
    )


OUTAGE_SECONDS = 1.0
"""After a store call failed on the backend, seconds during which calls answer Failed without trying Redis."""

UNANSWERED_RESULT = UpdateResult(Outcome.REFUSED_CREATE, KVPoll.Failed)
"""What a write that Redis failed returns (reads then answer Failed). Equal to :data:`INVALID_ROOM_RESULT`, not
the same object (the manager tells them apart)."""


class Unanswered(Exception):
    """A store call that Redis failed (or that an outage skipped): the room fails with ``reason``."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


STORE_DOWN = (BackendError, LeaseLostError)
"""Errors that say the store, not the room, is at fault: they start an outage."""


def outage_reason(error: KVStatusError) -> str:
    """The failure reason of a request whose room could not be read or written (the error has no password)."""
    if isinstance(error, LeaseLostError):  # Redis answered: the store refuses writes of a lost or taken-over lease
        return f"kvstatus: this participant's lease is lost, its status calls are refused ({type(error).__name__}: {error})"
    return f"kvstatus: Redis could not be reached for this room's status ({type(error).__name__}: {error})"


class Outage:
    """Whether the store is failing now, and since which error. Thread-safe; ``seconds``: the window, seconds."""

    def __init__(self, participant: str, seconds: float = OUTAGE_SECONDS) -> None:
        self.participant, self.seconds = participant, seconds
        self._until = 0.0
        self.error: Optional[KVStatusError] = None  # None between outages; read without the lock
        self._reason = ""  # one string, shared by the rooms the outage fails
        self._lock = threading.Lock()
        self._defects: set[str] = set()  # the exception types defect() has logged
        self._superseded = False  # another process took this participant name over (logged once)
        # One call to Redis within the deadline (the map sets it); None: the next call after the window tries Redis.
        self.probe: Optional[Callable[[], object]] = None
        self.on_answered: Callable[[], None] = lambda: None  # a probe was answered (the map's fast path is on again)
        self.probes = 0  # probes sent so far
        self._probing = False
        self._closed = threading.Event()

    def reason(self) -> Optional[str]:
        """The reason to fail a room with while an outage lasts, or None when calls should try Redis."""
        if (error := self.error) is None:
            return None
        if time.monotonic() < self._until:
            return self._reason
        if self.probe is None or not isinstance(error, BackendError):
            return None
        self._start_probe()
        return self._reason

    def _start_probe(self) -> None:
        with self._lock:
            if self._probing or self._closed.is_set():
                return
            self._probing = True
        threading.Thread(target=self._probe_loop, name=f"kvstatus-probe-{self.participant}", daemon=True).start()

    def _probe_loop(self) -> None:
        """Probe Redis once each window has passed, until it answers (then end the outage) or the map is closed."""
        try:
            while not self._closed.wait(max(self._until - time.monotonic(), 0.0)):
                if self.error is None or self.probe is None:
                    return
                self.probes += 1
                try:
                    self.probe()
                except STORE_DOWN as exc:
                    self.failed(exc)
                    continue
                except Exception:  # noqa: BLE001 - Redis answered, with an error about the probe itself
                    pass
                self.answered()
                self.on_answered()
                return
        finally:
            with self._lock:
                self._probing = False

    def close(self) -> None:
        """Stop probing (the map is closed)."""
        self._closed.set()

    def failed(self, error: KVStatusError) -> str:
        """A store call failed with ``error``: start (or extend) the outage; returns the room's failure reason."""
        reason = outage_reason(error)
        with self._lock:
            started = self.error is None
            # error last: reason() reads it first, without the lock, then the window and the reason it set
            self._reason, self._until, self.error = reason, time.monotonic() + self.seconds, error
        if started:
            log.error(
                "participant %s: its lease is lost (%s: %s); the rooms it reads or writes fail, and calls answer "
                "Failed without trying Redis for %g s at a time"
                if isinstance(error, LeaseLostError)
                else "participant %s: Redis failed a status call (%s: %s); the rooms it reads or writes fail, and "
                "calls answer Failed without trying Redis until it answers again (a probe in the background "
                "every %g s)",
                self.participant,
                type(error).__name__,
                error,
                self.seconds,
            )
        if started and self.probe is not None and isinstance(error, BackendError):
            self._start_probe()
        return reason

    def answered(self) -> None:
        """A store call succeeded: the outage, if any, is over."""
        if self.error is None:
            return
        with self._lock:
            ended, self.error = self.error is not None, None
        if ended:
            log.warning("participant %s: Redis answers status calls again", self.participant)

    def defect(self, error: Exception) -> str:
        """A store call raised what no store call should (a defect in kvstatus or below): log it with its traceback,
        once per exception type; returns the room's failure reason."""
        kind = type(error).__name__
        if kind not in self._defects:
            self._defects.add(kind)
            log.error(
                "participant %s: a status call raised %s, a defect (please report it); the room fails, the "
                "engine goes on (logged once per kind)",
                self.participant,
                kind,
                exc_info=error,
            )
        return f"kvstatus: internal error ({kind}: {error}); the room fails"

    def hold_again(self, store: Any) -> bool:
        """``store``'s lease was lost: hold the name again as a new incarnation and end the outage; True if it did
        (the rooms in flight fail). False when Redis fails the acquire, or another process took the name over (this
        manager's rooms then fail until it stops: docs/sglang.md, "Outages")."""
        lease = store.lease
        if lease is not None and lease.taken_over:
            if not self._superseded:
                self._superseded = True
                log.error(
                    "participant %s: another process holds this participant name now (a newer incarnation); this "
                    "manager does not take it back and its rooms fail. Stop this process, or give each instance "
                    "its own name (KVSTATUS_SGLANG_INSTANCE)",
                    self.participant,
                )
            return False
        try:
            store.acquire_lease(again=True)
        except KVStatusError:
            return False
        log.warning(
            "participant %s: holding its name again as lease incarnation %s; the rooms it had in flight fail",
            self.participant,
            store.lease.generation,
        )
        self.answered()
        return True


PROBE_ROOM = 0
"""The room a probe reads (any room: the probe asks whether Redis answers, not what it holds)."""


def probe_of(store: Any) -> Callable[[], object]:
    """The probe of ``store``'s outages: one read of :data:`PROBE_ROOM` on the store's client and settings, without
    its near cache (which could answer from memory), lease or peer watch; raises what the store raises."""
    reader = functools.cache(store.uncached)  # made at the first probe
    return lambda: reader().get(PROBE_ROOM)


class FailedHere:
    """The rooms a :class:`~kvstatus.sglang.RoomStatusMap` answered Failed on its own (room -> reason). Thread-safe;
    :attr:`rooms` is read without the lock. Invariant: as in a dict, Failed is terminal, so a room is kept until the
    engine removes it, however many there are (a forgotten one would read its stale open status, polled until
    SGLang's 300 s timeout). An outage's rooms share its reason string (cost: BENCHMARKS.md, "Rooms failed here")."""

    def __init__(self) -> None:
        self.rooms: dict[int, str] = {}
        self._lock = threading.Lock()

    def add(self, room: object, reason: str) -> None:
        """The map answered Failed for ``room``; the first reason stays (ids the store cannot hold are not kept)."""
        if storable(room):
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


REMOVAL_RACE_SECONDS = 5.0
"""Seconds after another thread removed an entry during which ``m[room]`` that finds none answers the removed
status (a new entry in the room ends it at once)."""


class Removals:
    """The entries a :class:`~kvstatus.sglang.RoomStatusMap` removed in the last :data:`REMOVAL_RACE_SECONDS` and
    the removals under way, so that ``m[room]`` by *another* thread that finds no entry answers the removed status
    (SGLang reads ``room in m`` then ``m[room]`` while the scheduler pops). Thread-safe; no lock held across I/O."""

    def __init__(self) -> None:
        self._done: dict[int, tuple[KVPoll, float, int]] = {}  # room -> (status, monotonic, thread id), oldest first
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
            while done and now - next(iter(done.values()))[1] > REMOVAL_RACE_SECONDS:  # past the grace, oldest first
                del done[next(iter(done))]
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
            status, at, by = self._done.get(room, (None, 0.0, 0))
        if by != threading.get_ident() and time.monotonic() - at <= REMOVAL_RACE_SECONDS:
            return status
        return None


LOST_RESULT = UpdateResult(Outcome.REFUSED_CREATE, KVPoll.Failed)
"""What a write of a room Redis lost returns: nothing is kept, and reads answer Failed."""

_HOLDS_ENTRY = (Outcome.CREATED, Outcome.ADVANCED, Outcome.FAILED, Outcome.UNCHANGED)
_FOUND_NONE = (Outcome.CREATED, Outcome.REFUSED_CREATE, Outcome.IGNORED_MISSING)


REMOVALS_KEPT = 60.0
"""Seconds a removal is remembered, so that the late reply of a write sent before it does not open the room again."""


class OpenRooms:
    """The open rooms (room -> monotonic time this map last handled a write's reply that left an entry, oldest
    first) and the rooms found lost, kept until the engine removes them. Thread-safe; :attr:`rooms` and :attr:`lost`
    are read without the lock. ``ttl``: the store's room TTL, seconds; ``started``: monotonic time a call was sent."""

    def __init__(self, participant: str, ttl: float) -> None:
        self.participant, self.ttl = participant, ttl
        self.rooms: OrderedDict[int, float] = OrderedDict()
        self.lost: set[int] = set()
        self._removed: OrderedDict[int, float] = OrderedDict()  # room -> when the engine removed it, oldest first
        self._lock = threading.Lock()

    def wrote(self, room: int, result: UpdateResult, started: float) -> Optional[str]:
        """This map's write of ``room``, sent at ``started``, answered ``result``: the reason to fail the room when
        the outcome shows that Redis lost an open room's entry, else None."""
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
        """A read of ``room`` sent at ``started`` found no entry of this participant: the reason to fail it when the
        room is open (Redis lost the entry), else None (not open, opened after the read was sent, or expired)."""
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
        return (  # the failure reason of an open room whose entry Redis no longer holds
            f"kvstatus: Redis lost its data: participant {self.participant}'s entry in room {room} is gone though "
            "this manager never removed it and its TTL had not run out (Redis restarted without persistence, failed "
            "over to a replica that did not have it, or was flushed; or a sweep removed it after a lost lease)"
        )

    def removed(self, room: object) -> None:
        """The engine removes ``room`` (called before the removal is sent): neither open nor lost any more, and a
        write sent before now does not open it again."""
        if type(room) is int:
            now = time.monotonic()
            with self._lock:
                self.rooms.pop(room, None)
                self.lost.discard(room)
                self._removed[room] = now
                self._removed.move_to_end(room)
                while now - next(iter(self._removed.values())) > REMOVALS_KEPT:
                    self._removed.popitem(last=False)
