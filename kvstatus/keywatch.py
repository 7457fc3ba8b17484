"""``wait_for``'s wake-up: room keys watched through CLIENT TRACKING, every wait of a client on one connection
per node (a :class:`WatchHub`).

Redis tracks the keys a ``CLIENT TRACKING ON`` connection reads and pushes an ``invalidate`` message on
that same connection (RESP3) the first time one of them changes afterwards. So a waiter arms its watch by
reading the room key (``EXISTS``) on the hub, then reads the entry through the store: any write to the room
after the arm (an update, a cancel, a clear, the TTL, ``FLUSHALL``) wakes it, and it re-arms before it reads
again. The writers pay nothing for it: no publish, no channel, nothing in the update script.

The waits of a backend (:class:`kvstatus.backend.Backend`) share its hub of each node (500 waiters: one connection, not 500). Each wait holds a
:class:`Ticket`; replies come back in the order the arms were sent, so each arm's answer goes to its ticket,
and a push wakes the tickets of its keys whose arm was answered before it (what changed before an arm's
answer is seen by the read that follows the arm). Nothing another client sends reaches this connection
(there is no channel to publish on), and anything the hub cannot read counts as a change of every key, or
breaks the hub: the waiters re-read rather than miss one, and the next arm opens a new hub.

The hub is read by whoever the event loop or a thread appoints (:func:`kvstatus.concurrency.async_start_reader`):
:meth:`WatchHub.on_readable` runs without blocking and calls the woken tickets' ``wake``.
"""

from __future__ import annotations

import collections
import threading
from typing import Callable, Optional, Protocol

import hiredis
import redis

from kvstatus.invalidation import InvalidationSocket, LinkLost


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
