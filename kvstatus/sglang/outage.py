"""What a KV manager's status calls do when Redis fails them: the rooms fail, the engine goes on.

SGLang calls ``request_status`` from its scheduler loop, its transfer threads and its bootstrap thread, none of
which expects an exception from a dict. A store error raised there (Redis down, hung past the deadline, a
refused ACL, a lost lease) stops the scheduler, and SGLang shuts the whole server down. So
:class:`~kvstatus.sglang.RoomStatusMap` turns such an error into Failed for the room it was about (the request
fails, with the error as its reason), and :class:`Outage` remembers it for :data:`OUTAGE_SECONDS`: meanwhile
every call answers at once, without I/O, so a scheduler polling 256 rooms waits out one deadline, not 256.
The next call after the window tries Redis again. One ERROR line is logged when an outage starts, one
WARNING when Redis answers again; nothing per call.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Optional

from kvstatus.errors import BackendError, KVStatusError, LeaseLostError
from kvstatus.rule import KVPoll, Outcome, UpdateResult

log = logging.getLogger("kvstatus.sglang")

OUTAGE_SECONDS = 1.0
"""After a store call failed on the backend, seconds during which calls answer Failed without trying Redis."""

UNANSWERED_RESULT = UpdateResult(Outcome.REFUSED_CREATE, KVPoll.Failed)
"""What a write that Redis failed returns: nothing is known to be written, and reads answer Failed. Equal to
:data:`~kvstatus.sglang.roomids.INVALID_ROOM_RESULT`, not the same object (the manager tells them apart)."""

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
        self._lock = threading.Lock()
        self._defects: set[str] = set()  # the exception types defect() has logged
        self._superseded = False  # another process took this participant name over (logged once)

    def reason(self) -> Optional[str]:
        """The reason to fail a room with while an outage lasts, or None when calls should try Redis."""
        error = self.error
        if error is None or time.monotonic() >= self._until:
            return None
        return outage_reason(error)

    def failed(self, error: KVStatusError) -> str:
        """A store call failed with ``error``: start (or extend) the outage; returns the room's failure reason."""
        with self._lock:
            started = self.error is None
            self.error, self._until = error, time.monotonic() + self.seconds
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
                "answer Failed without trying Redis for %g s at a time until it answers again",
                self.participant,
                type(error).__name__,
                error,
                self.seconds,
            )
        return outage_reason(error)

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
