"""``wait_for``'s wake-up: one room key watched through CLIENT TRACKING, on a connection of its own.

Redis tracks the keys a ``CLIENT TRACKING ON`` connection reads and pushes an ``invalidate`` message on
that same connection (RESP3) the first time one of them changes afterwards. So a waiter arms its watch by
reading the room key (``EXISTS``), then reads the entry through the store: any write to the room after
the arm (an update, a cancel, a clear, the TTL, ``FLUSHALL``) wakes it, and it re-arms before it reads
again. The writers pay nothing for it: no publish, no channel, nothing in the update script.

Nothing another client sends reaches this connection (there is no channel to publish on), and anything it
cannot read counts as a change: the waiter re-reads rather than miss one.
"""

from __future__ import annotations

from typing import Any

import hiredis

from kvstatus.invalidation import InvalidationSocket, LinkLost


def _command(*words: bytes) -> bytes:
    parts = [b"*%d\r\n" % len(words)]
    for word in words:
        parts.append(b"$%d\r\n%s\r\n" % (len(word), word))
    return b"".join(parts)


class KeyWatch(InvalidationSocket):
    """One key, tracked on its own RESP3 connection; the socket is non-blocking once :meth:`open` returned.

    ``changed`` is True once an invalidation (or anything unreadable) arrived after the last arm was
    answered; ``armed`` while the key is tracked and no change has been seen since.
    """

    def __init__(self, connection: Any, key: str) -> None:
        super().__init__(connection)
        self.key = key
        self._arm = _command(b"EXISTS", key.encode())
        self.answers = 0  # arms answered so far
        self.asked = 0  # arms sent so far
        self.changed = False

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
        try:
            sent = self.sock.send(self._arm)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as exc:
            raise LinkLost(f"watch connection failed: {exc}") from exc
        if sent != len(self._arm):  # a partial command would corrupt the stream; give the watch up
            raise LinkLost("watch connection send buffer full")
        self.asked += 1
        self.changed = False

    def take(self) -> None:
        """Read what arrived, without blocking: count the arms' answers, note a change. Raises LinkLost (the
        connection broke, or Redis answered an arm with an error: a MOVED slot, an ACL refusal)."""
        self.receive()
        while True:
            message = self.reader.gets()
            if message is False:
                return
            if isinstance(message, hiredis.ReplyError):
                raise LinkLost(f"watch of {self.key} got an error: {message}")
            if isinstance(message, list):  # a push: an invalidation (of the one key tracked), or anything else
                self.changed = True
            else:  # an arm's answer; what changed before it is seen by the read that follows the arm
                self.answers += 1
                self.changed = False
