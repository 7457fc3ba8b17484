"""``wait_for``'s wake-up: one room key watched through CLIENT TRACKING, on a connection of its own.

Redis tracks the keys a ``CLIENT TRACKING ON`` connection reads and pushes an ``invalidate`` message on
that same connection (RESP3) the first time one of them changes afterwards. So a waiter arms its watch by
reading the room key (``EXISTS``), then reads the entry through the store: any write to the room after
the arm (an update, a cancel, a clear, the TTL, ``FLUSHALL``) wakes it, and it re-arms before it reads
again. The writers pay nothing for it: no publish, no channel, nothing in the update script.

Nothing another client sends reaches this connection (there is no channel to publish on), and anything it
cannot read counts as a change: the waiter re-reads rather than miss one.

A wait that ends gives its connection back to its client's :class:`WatchPool`, so the next ``wait_for`` on
that node arms in one round trip instead of opening a connection (redis-py's handshake and ``CLIENT
TRACKING``, five). Keys a pooled connection watched before may still wake it once: a spurious wake costs a
read, never a missed change.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any, Optional

import hiredis

from kvstatus.invalidation import InvalidationSocket, LinkLost


class WatchRefused(LinkLost):
    """The ACL refused the watch's read of the key (a user without ``+exists``)."""


class KeyWatch(InvalidationSocket):
    """One key, tracked on its own RESP3 connection; the socket is non-blocking once :meth:`open` returned.

    ``changed`` is True once an invalidation (or anything unreadable) arrived after the last arm was
    answered; ``armed`` while the key is tracked and no change has been seen since.
    """

    def __init__(self, connection: Any, key: str) -> None:
        super().__init__(connection)
        self.answers = 0  # arms answered so far
        self.asked = 0  # arms sent so far
        self.retarget(key)

    def retarget(self, key: str) -> None:
        """Watch ``key`` from the next :meth:`arm` on (a pooled connection's next wait)."""
        self.key = key
        self._key = key.encode()
        self._arm = b"".join(self.connection.pack_command("EXISTS", self._key))
        self.changed = True  # not armed for this key yet

    def setup(self, conn: Any) -> None:
        """``CLIENT TRACKING ON`` through redis-py, blocking: an ACL refusal raises ``NoPermissionError``."""
        conn.send_command("CLIENT", "TRACKING", "ON")
        reply = conn.read_response()
        if reply not in (b"OK", "OK"):
            raise LinkLost(f"CLIENT TRACKING answered {reply!r}")

    @property
    def armed(self) -> bool:
        return self.asked > 0 and self.answers == self.asked and not self.changed

    def arm(self) -> None:
        """Send the tracked read of the key (its answer arrives later, see :meth:`take`). Raises LinkLost."""
        if not self.send(self._arm):  # a socket of one small command that would block: a stuck connection
            raise LinkLost("watch connection send buffer full")
        self.asked += 1
        self.changed = False

    def take(self) -> None:
        """Read what arrived, without blocking: count the arms' answers, note a change. Raises LinkLost (the
        connection broke, or Redis answered an arm with an error: a MOVED slot), WatchRefused (the ACL)."""
        self.receive()
        while True:
            message = self.reader.gets()
            if message is False:
                return
            if isinstance(message, hiredis.ReplyError):
                refused = str(message).startswith("NOPERM")  # the ACL: asking again would not help
                raise (WatchRefused if refused else LinkLost)(f"watch of {self.key} got an error: {message}")
            if isinstance(message, list):  # a push
                keys = message[1] if len(message) == 2 and message[0] == b"invalidate" else None
                # This key, every key (FLUSHALL: no list), or a push not understood; another key is one a pooled
                # connection watched for an earlier wait.
                if not isinstance(keys, list) or self._key in keys:
                    self.changed = True
            else:  # an arm's answer; what changed before it is seen by the read that follows the arm
                self.answers += 1
                self.changed = False


class WatchPool:
    """Idle watch connections of one client, by node name; thread-safe. A forked child starts with none (the
    parent's sockets are left to the parent)."""

    MAX_IDLE_PER_NODE = 4

    def __init__(self) -> None:
        self._idle: dict[str, list[KeyWatch]] = {}
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._closed = False

    def take(self, node: str) -> Optional[KeyWatch]:
        with self._lock:
            if self._pid != os.getpid():
                self._idle, self._pid = {}, os.getpid()
            idle = self._idle.get(node)
            return idle.pop() if idle else None

    def give(self, node: str, watch: KeyWatch) -> None:
        """Keep ``watch`` for the next wait on ``node``, or close it (a full pool, an arm still unanswered)."""
        if watch.answers == watch.asked:
            with self._lock:
                idle = self._idle.setdefault(node, [])
                if not self._closed and self._pid == os.getpid() and len(idle) < self.MAX_IDLE_PER_NODE:
                    idle.append(watch)
                    return
        watch.close()

    def close(self) -> None:
        """Close the idle connections; a watch given back later is closed too."""
        with self._lock:
            idle = [watch for watches in self._idle.values() for watch in watches]
            self._idle, self._closed = {}, True
        for watch in idle:
            watch.close()


_POOLS: weakref.WeakKeyDictionary[Any, WatchPool] = weakref.WeakKeyDictionary()
_POOLS_LOCK = threading.Lock()


def pool_of(client: Any) -> WatchPool:
    """The watch pool of a redis-py client (made on first use, gone with the client)."""
    with _POOLS_LOCK:
        pool = _POOLS.get(client)
        if pool is None:
            pool = _POOLS[client] = WatchPool()
        return pool


def close_pool(client: Any) -> None:
    """Close the watch connections ``client``'s pool holds (its store is closing the client)."""
    with _POOLS_LOCK:
        pool = _POOLS.pop(client, None)
    if pool is not None:
        pool.close()
