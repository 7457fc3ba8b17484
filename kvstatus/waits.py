"""``wait_for``'s parts that are not written for async: the plan of its loop (no I/O) and its watch hub.

**The plan.** The waiter watches the room key through CLIENT TRACKING (a :class:`WatchHub`): Redis tells it
when the room changes, and it re-reads the entry. The writers pay nothing for it (no publish). Every change to
the room wakes the waiter, a peer's Failed or a cancel included: with shared fate
(:func:`kvstatus.rule.shared_status`) its read then answers Failed. A waiter arms its watch *before* it reads the
entry, so a change between the read and the arm cannot be missed. Told of a change, it reads first (the change
may be the one awaited: one round trip to deliver it), then, if it must go on waiting, arms the watch again and
reads once more. It also re-reads the entry every ``recheck`` seconds (a watch connection that died without a
word), and when it cannot watch (the ACL refuses CLIENT TRACKING, the connection broke) it polls every
``poll_interval`` seconds, trying to watch again as it goes unless the ACL refused. The loop is plain data here
(:func:`wait_plan`); the driver that performs its actions is written once in :mod:`kvstatus._async.waiting` and
generated for threads.

**The hub.** Redis tracks the keys a ``CLIENT TRACKING ON`` connection reads and pushes an ``invalidate``
message on that same connection (RESP3) the first time one of them changes afterwards. So a waiter arms its
watch by reading the room key (``EXISTS``) on the hub, then reads the entry through the store: any write to the
room after the arm (an update, a cancel, a clear, the TTL, ``FLUSHALL``) wakes it. The waits of a backend
(:class:`kvstatus.backend.Backend`) share its hub of each node (500 waiters: one connection, not 500). Each wait
holds a :class:`Ticket`; replies come back in the order the arms were sent, so each arm's answer goes to its
ticket, and a push wakes the tickets of its keys whose arm was answered before it (what changed before an arm's
answer is seen by the read that follows the arm). Nothing another client sends reaches this connection (there
is no channel to publish on), and anything the hub cannot read counts as a change of every key, or breaks the
hub: the waiters re-read rather than miss one, and the next arm opens a new hub. The hub is read by whoever the
event loop or a thread appoints (:func:`kvstatus.concurrency.async_start_reader`): :meth:`WatchHub.on_readable`
runs without blocking and calls the woken tickets' ``wake``.
"""

from __future__ import annotations

import collections
import math
import threading
import time
from collections.abc import Generator, Iterable
from typing import Any, Callable, Final, Literal, Optional, Protocol, Union

import hiredis
import redis

from kvstatus.errors import InvalidArgumentError
from kvstatus.invalidation import InvalidationSocket, LinkLost
from kvstatus.model import KVPoll, to_status

RECHECK_SECONDS = 1.0
POLL_INTERVAL_SECONDS = 0.05

# The I/O actions of a wait plan: (kind, argument).
WATCH: Final = "watch"  # argument None; reply: True once the room key is watched, False if not possible now
READ: Final = "read"  # argument None; reply: the entry's status now (Optional[KVPoll])
RECEIVE: Final = "receive"  # argument: seconds to wait; reply: True if the room changed, False if not, None if broken
SLEEP: Final = "sleep"  # argument: seconds
CLOCK: Final = "clock"  # argument None; reply: time.monotonic()
Action = Union[
    tuple[Literal["watch"], None],
    tuple[Literal["read"], None],
    tuple[Literal["receive"], float],
    tuple[Literal["sleep"], float],
    tuple[Literal["clock"], None],
]


def target_statuses(statuses: KVPoll | int | Iterable[KVPoll | int]) -> frozenset[KVPoll]:
    """The statuses to wait for, validated (one status or an iterable of them)."""
    if isinstance(statuses, (KVPoll, int)) and not isinstance(statuses, bool):
        return frozenset({to_status(statuses)})
    if isinstance(statuses, (str, bytes)) or not isinstance(statuses, Iterable):
        raise InvalidArgumentError(f"invalid statuses {statuses!r}: expected a KVPoll, an int 0..4 or an iterable")
    targets = frozenset(to_status(s) for s in statuses)
    if not targets:
        raise InvalidArgumentError("wait_for needs at least one status to wait for")
    return targets


def check_timeout(timeout: Optional[float]) -> float:
    """``timeout`` in seconds (None: no limit) as a finite or infinite float."""
    if timeout is None:
        return math.inf
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or math.isnan(timeout) or timeout < 0:
        raise InvalidArgumentError(f"invalid timeout {timeout!r}: expected seconds >= 0 or None")
    return float(timeout)


def wait_plan(
    participant: str,
    targets: frozenset[KVPoll],
    timeout: float,
    recheck: float = RECHECK_SECONDS,
    poll_interval: float = POLL_INTERVAL_SECONDS,
) -> Generator[Action, Any, Optional[KVPoll]]:  # each reply's type follows its action's kind
    """The waiting loop: returns the status reached, or None when ``timeout`` seconds passed first."""
    start = yield CLOCK, None
    deadline = start + timeout
    watching = yield WATCH, None
    status: Optional[KVPoll] = yield READ, None
    next_read = start + (recheck if watching else poll_interval)
    while True:
        if status in targets:
            return status
        now = yield CLOCK, None
        if now >= deadline:
            return None
        if now >= next_read:
            watching = yield WATCH, None  # watch first, then read: nothing falls in between
            status = yield READ, None
            next_read = now + (recheck if watching else poll_interval)
            continue
        wait = min(deadline, next_read) - now
        if not watching:
            yield SLEEP, wait
            continue
        changed = yield RECEIVE, wait
        if changed:  # the change may be the awaited one: read it first, and watch again only if not
            status = yield READ, None
            if status in targets:
                return status
        if changed is not False:
            next_read = now  # the room changed, or the watch broke: watch again, then read (nothing is lost)


MIN_STEP_SECONDS = 0.5
"""The least time one step of a wait (a watch, a read) is given, even at the wait's very end."""


def step_deadline(ends: float, deadline: float) -> float:
    """The monotonic time by which a step starting now must end: the store's ``deadline`` (seconds) from now,
    and no later than the wait's end ``ends``, unless that leaves less than :data:`MIN_STEP_SECONDS`."""
    now = time.monotonic()
    return min(now + deadline, max(ends, now + MIN_STEP_SECONDS))


class _Commands(Protocol):
    """A blocking redis-py connection, for the two methods used here (``send_command`` is unannotated)."""

    def send_command(self, *args: str) -> None: ...

    def read_response(self) -> object: ...


class WatchRefused(LinkLost):
    """The ACL refused the watch's read of the key (a user without ``+exists``)."""


class Ticket:
    """One wait's watch of one key on a hub. ``changed`` is True once a push for the key (or anything
    unreadable) arrived after the last arm was answered; ``error`` names an arm the server answered with an
    error (``refused``: by the ACL); ``wake()`` is called (under the hub's lock) whenever any of these moves."""

    __slots__ = ("key", "wake", "asked", "answers", "changed", "error", "refused")

    def __init__(self, key: bytes, wake: Callable[[], None]) -> None:
        self.key = key
        self.wake = wake
        self.asked = 0
        self.answers = 0
        self.changed = True  # not armed yet
        self.error = ""
        self.refused = False

    @property
    def answered(self) -> bool:
        return self.answers == self.asked

    @property
    def armed(self) -> bool:
        return self.asked > 0 and self.answered and not self.changed and not self.error


class WatchHub(InvalidationSocket):
    """One RESP3 connection with tracking on, shared by every wait of one client on one node; thread-safe.

    ``broken`` says why the connection failed (every ticket was woken; the hub takes no more arms).
    """

    def __init__(self, connection: redis.Connection) -> None:
        super().__init__(connection)
        self.lock = threading.Lock()
        self.tickets: dict[bytes, set[Ticket]] = {}
        self.pending: collections.deque[Ticket] = collections.deque()  # arms sent, answers not yet read
        self.broken = ""
        self.on_close: Optional[Callable[[], None]] = None  # stops whoever reads the hub

    def setup(self, conn: _Commands) -> None:
        """``CLIENT TRACKING ON`` through redis-py, blocking: an ACL refusal raises ``NoPermissionError``."""
        conn.send_command("CLIENT", "TRACKING", "ON")
        reply = conn.read_response()
        if reply not in (b"OK", "OK"):
            raise LinkLost(f"CLIENT TRACKING answered {reply!r}")

    def join(self, key: str, wake: Callable[[], None]) -> Ticket:
        ticket = Ticket(key.encode(), wake)
        with self.lock:
            self.tickets.setdefault(ticket.key, set()).add(ticket)
        return ticket

    def leave(self, ticket: Ticket) -> None:
        """The wait ended: its arms still unanswered are read and dropped (the stream stays in step)."""
        with self.lock:
            waiting = self.tickets.get(ticket.key)
            if waiting is not None:
                waiting.discard(ticket)
                if not waiting:
                    del self.tickets[ticket.key]

    def arm(self, ticket: Ticket) -> None:
        """Send the tracked read of the ticket's key; its answer arrives later. Raises LinkLost."""
        with self.lock:
            if self.broken:
                raise LinkLost(self.broken)
            command = b"*2\r\n$6\r\nEXISTS\r\n$%d\r\n%b\r\n" % (len(ticket.key), ticket.key)
            try:
                sent = self.send(command)
            except LinkLost as exc:
                self._break(str(exc))
                raise
            if not sent:  # a socket of small commands that would block: a stuck connection
                self._break("watch connection send buffer full")
                raise LinkLost(self.broken)
            self.pending.append(ticket)
            ticket.asked += 1
            ticket.changed = False
            ticket.error = ""

    def on_readable(self) -> None:
        """Read what arrived, without blocking, and wake the tickets it concerns."""
        with self.lock:
            if self.broken:
                return
            try:
                self.receive()
                self._dispatch()
            except LinkLost as exc:
                self._break(str(exc))

    def _dispatch(self) -> None:
        while True:
            message = self.reader.gets()
            if message is False:
                return
            if isinstance(message, list):  # a push
                keys = message[1] if len(message) == 2 and message[0] == b"invalidate" else None
                if isinstance(keys, list):
                    for key in keys:
                        for ticket in self.tickets.get(key, ()):
                            self._changed(ticket)
                else:  # every key (FLUSHALL: no list), or a push not understood
                    for tickets in self.tickets.values():
                        for ticket in tickets:
                            self._changed(ticket)
                continue
            if not self.pending:
                raise LinkLost(f"watch connection answered nothing it was asked: {message!r}")
            ticket = self.pending.popleft()
            ticket.answers += 1
            if isinstance(message, hiredis.ReplyError):  # NOPERM (the ACL), MOVED (a cluster's slot moved)
                ticket.error = f"watch of {ticket.key.decode(errors='replace')} got an error: {message}"
                ticket.refused = str(message).startswith("NOPERM")
            elif ticket.answered:
                ticket.changed = False  # what changed before the answer is seen by the read after the arm
            ticket.wake()

    @staticmethod
    def _changed(ticket: Ticket) -> None:
        if ticket.asked and ticket.answered and not ticket.changed:
            ticket.changed = True
            ticket.wake()

    def _break(self, reason: str) -> None:
        """Under the lock: the connection failed; wake every ticket and close."""
        self.broken = reason or "watch connection failed"
        for tickets in self.tickets.values():
            for ticket in tickets:
                ticket.wake()
        self._shut()

    def _shut(self) -> None:
        stop, self.on_close = self.on_close, None
        if stop is not None:
            stop()
        super().close()

    def close(self) -> None:
        with self.lock:
            if not self.broken:
                self.broken = "the store closed"
                for tickets in self.tickets.values():
                    for ticket in tickets:
                        ticket.wake()
            self._shut()
