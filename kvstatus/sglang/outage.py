"""What a KV manager's map answers on its own, without Redis: rooms it cannot store, outages, the rooms it
failed itself, and removals that race a read.

**Room ids kvstatus cannot store**: the request fails, the engine goes on.

SGLang takes ``bootstrap_room`` from the request, and its dict accepts any hashable (-1, 2**63, "42", None).
kvstatus stores ints in [0, 2**63 - 1] only, and the store raises ``InvalidRoomError`` for anything else.
Inside the scheduler loop, a transfer thread or the bootstrap thread, that exception would stop the whole
engine for one client's bad id. So :class:`~kvstatus.sglang.RoomStatusMap` answers for such an id as for a
room that **failed from the start**, without touching Redis: ``in`` is True, ``m[room]``, ``get``, ``pop``,
``collect`` and ``consensus`` answer Failed, and a write is refused with :data:`INVALID_ROOM_RESULT`
(REFUSED_CREATE, Failed: nothing was written). Every upstream poll then concludes Failed at its next call
(the sender's ``in`` then ``check_status``, the receiver's ``check_status``, nixl's
``get(room, WaitingForInput)``), so that one request fails with its reason and the engine goes on. Answering
"no entry" instead would make ``m[room]`` raise KeyError in the receiver's poll, and nixl's decode wait out its
300 s timeout. The id is not coerced: "42" made 42 would share room 42's entry with another request, and -1
made 2**63 - 1 likewise. An opening write (Bootstrapping, WaitingForInput) logs one warning; reads log
nothing, as polls repeat.

**Outages**: SGLang calls ``request_status`` from its scheduler loop, its transfer threads and its bootstrap
thread, none of which expects an exception from a dict. A store error raised there (Redis down, hung past the deadline, a
refused ACL, a lost lease) stops the scheduler, and SGLang shuts the whole server down. So
:class:`~kvstatus.sglang.RoomStatusMap` turns such an error into Failed for the room it was about (the request
fails, with the error as its reason), and :class:`Outage` remembers it for :data:`OUTAGE_SECONDS`: meanwhile
every call answers at once, without I/O, so a scheduler polling 256 rooms waits out one deadline, not 256.
Once the window has passed, a background thread (one at a time) probes Redis with one call, within the
deadline, and again one window after each failure; the engine's calls go on answering without I/O until a
probe is answered. So a hung Redis holds an engine thread for one deadline when the outage starts, never
again (a lost lease is held again by the next call instead: Redis answered). One ERROR line is logged when an
outage starts, one WARNING when Redis answers again; nothing per call.

:class:`FailedHere` keeps the rooms answered Failed that way, :class:`Removals` the entries removed a moment
ago (their docstrings say why).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Optional

from kvstatus.errors import BackendError, KVStatusError, LeaseLostError
from kvstatus.keys import MAX_ROOM
from kvstatus.model import KVPoll, Outcome, UpdateResult

log = logging.getLogger("kvstatus.sglang")

# --------------------------------------------------------------------------- room ids it cannot store

INVALID_ROOM_RESULT = UpdateResult(Outcome.REFUSED_CREATE, KVPoll.Failed)
"""What a write of a room id kvstatus cannot store returns: nothing was written, and reads answer Failed."""


def storable(room: object) -> bool:
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


# --------------------------------------------------------------------------- outages

OUTAGE_SECONDS = 1.0
"""After a store call failed on the backend, seconds during which calls answer Failed without trying Redis."""

UNANSWERED_RESULT = UpdateResult(Outcome.REFUSED_CREATE, KVPoll.Failed)
"""What a write that Redis failed returns: nothing is known to be written, and reads answer Failed. Equal to
:data:`INVALID_ROOM_RESULT`, not the same object (the manager tells them apart)."""


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
    """Whether the store is failing now, and since which error. Thread-safe; ``clock`` is monotonic seconds."""

    def __init__(self, participant: str, seconds: float = OUTAGE_SECONDS) -> None:
        self.participant, self.seconds = participant, seconds
        self._until = 0.0
        self.error: Optional[KVStatusError] = None
        """The error of the outage under way (None between outages; read without the lock by the dict-speed path)."""
        self._reason = ""  # the failure reason of the outage's error: one string, shared by the rooms it fails
        self._lock = threading.Lock()
        self._defects: set[str] = set()  # the exception types defect() has logged
        self._superseded = False  # another process took this participant name over (logged once)
        self.probe: Optional[Callable[[], object]] = None
        """One call to Redis within the deadline, raising what the store raises; None: the engine's next call
        after the window tries Redis itself (the map sets it)."""
        self.on_answered: Callable[[], None] = lambda: None  # a probe was answered (the map's fast path is on again)
        self.probes = 0  # probes sent so far
        self._probing = False
        self._closed = threading.Event()

    def reason(self) -> Optional[str]:
        """The reason to fail a room with while an outage lasts, or None when calls should try Redis."""
        error = self.error
        if error is None:
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
            self.error, self._until, self._reason = error, time.monotonic() + self.seconds, reason
        if started and isinstance(error, LeaseLostError):
            log.error(
                "participant %s: its lease is lost (%s: %s); the rooms it reads or writes fail, and calls answer "
                "Failed without trying Redis for %g s at a time",
                self.participant,
                type(error).__name__,
                error,
                self.seconds,
            )
        elif started:
            log.error(
                "participant %s: Redis failed a status call (%s: %s); the rooms it reads or writes fail, and calls "
                "answer Failed without trying Redis until it answers again (a probe in the background every %g s)",
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
        """A store call raised what no store call should (a defect in kvstatus or below it): log it with its
        traceback, once per exception type, and return the failure reason of its room."""
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
        """``store``'s lease was lost (this process stalled past its TTL, or Redis lost the record): hold the
        name again as a new incarnation, so the engine goes on, and end the outage; True if it did. The rooms in
        flight fail: the peers' watches fail the lost incarnation's open entries (:mod:`kvstatus.peerwatch`).
        False when Redis fails the acquire (the next call after the outage window tries again), or when
        another process took the name over: taking it back would fence that one off in turn, so this manager's
        rooms fail until it stops."""
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
    readers: list[Any] = []

    def probe() -> object:
        if not readers:
            readers.append(store.uncached())
        return readers[0].get(PROBE_ROOM)

    return probe


# --------------------------------------------------------------------------- rooms it failed itself


class FailedHere:
    """Room -> the reason the map failed it with. Thread-safe; :attr:`rooms` is read without the lock (a dict's
    ``get``, ``in`` and truth value are atomic).

    The rooms a :class:`~kvstatus.sglang.RoomStatusMap` answered Failed on its own, without Redis saying so.

    When Redis fails a status call (down, hung past the deadline, a lost lease), the map answers Failed for the
    room (:mod:`kvstatus.sglang.outage`). In a dict, Failed is terminal: once one thread has read it, every later
    read agrees. An answer made up during an outage must hold the same way. Otherwise the transfer thread that
    read Failed drops its part (a chunk's acknowledgement, the Success), Redis answers again, and the scheduler
    polls the room's real entry, still open, until SGLang's 300 s timeout. The e2e tier saw exactly that, after
    a lease lost during start-up: requests left without an answer.

    So each such room is kept in :class:`FailedHere`, and the map's reads of it answer Failed, with the reason,
    until the engine removes the room (``pop``, ``del``, ``clear_room``): the end of its lifecycle. None is ever
    forgotten before that, however many there are: a forgotten room would read its stale status again. The rooms
    of one outage share its reason (one string), so a kept room costs a dict slot and its int (BENCHMARKS.md,
    "Rooms failed here"). The map's dict-speed path stays on: it skips the rooms kept here (one
    dict lookup).
    """

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


# --------------------------------------------------------------------------- removals that race a read


REMOVAL_RACE_SECONDS = 5.0
"""Seconds after another thread removed an entry during which ``m[room]`` that finds none answers the removed
status: far longer than a thread starved of the GIL on a loaded box waits between ``in`` and the read, and a
new entry in the room ends it at once."""


class Removals:
    """Removals of the last :data:`REMOVAL_RACE_SECONDS` (room -> status, monotonic seconds, thread id) and the
    removals under way. Thread-safe; the lock is never held across I/O.

    The entries a :class:`~kvstatus.sglang.RoomStatusMap` removed a moment ago, for the reads that race them.

    SGLang threads share a KV manager's map: the scheduler pops concluded rooms while a transfer thread reads one
    with ``room in m`` then ``m[room]``. A dict makes that window a few bytecodes wide; the map's ``pop`` spans a
    round trip and GIL switches, so ``m[room]`` could raise ``KeyError`` for a room ``in`` had just found (it
    killed mooncake's transfer thread in the e2e tier). :class:`Removals` remembers each removal for
    :data:`REMOVAL_RACE_SECONDS` and the ones under way, so that ``m[room]`` by *another* thread that finds no entry
    answers the removed status, as if it had come first (see ``RoomStatusMap._remove``).
    """

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
