"""Free loopback ports for the test servers: a disjoint range for each pytest-xdist worker.

``bind(0)`` hands out ports from the kernel's ephemeral range (32768-60999 on
Linux), where the other workers' picks and the local ports of every outgoing
connection land too. Under xdist that lets one worker start a server on the port
that another worker's stopped server will be restarted on (``restart()`` keeps
its port), or on the port a test picked because nothing listens there. So each
worker walks its own slice of :data:`FIRST`..:data:`LAST`, below the ephemeral
range and with room for a cluster node's bus port (+10000), and hands out each
port once. A port is taken only if both it and its bus port can be bound at
that moment; another test run on the machine can still race for it, which
``RedisServer`` survives by retrying on a new port.
"""

from __future__ import annotations

import os
import random
import socket
import threading

from kvstatus.demo.server import LOOPBACK, RedisServerError

CLUSTER_BUS_OFFSET = 10000
"""A cluster node's bus listens on its port + this."""
FIRST = 10000
LAST = 19999
"""Server ports come from FIRST..LAST; cluster bus ports then lie in 20000-29999, both below 32768."""

__all__ = ["CLUSTER_BUS_OFFSET", "FIRST", "LAST", "PortRange", "free_port", "install"]


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((LOOPBACK, port))
        except OSError:
            return False
        return True


class PortRange:
    """Worker ``index`` of ``count``: its slice of ``first``..``last`` (FIRST..LAST by default), each port
    handed out once. ``bus``: a port is taken only if its cluster bus port (+10000) is free too."""

    def __init__(self, index: int = 0, count: int = 1, first: int = FIRST, last: int = LAST, bus: bool = True) -> None:
        if not 0 <= index < count:
            raise ValueError(f"worker index {index} is not in 0..{count - 1}")
        width = (last - first + 1) // count
        self.first = first + index * width
        self.last = self.first + width - 1
        self._bus = bus
        # Another test run on this machine uses the same slices: start somewhere else in ours.
        self._next = random.Random(os.getpid()).randint(self.first, self.last)
        self._given: set[int] = set()
        self._lock = threading.Lock()

    def __contains__(self, port: int) -> bool:
        return self.first <= port <= self.last

    def take(self) -> int:
        """A port of this slice, never handed out before, that it (and its cluster bus port) can bind now."""
        with self._lock:
            for _ in range(self.last - self.first + 1):
                port = self._next
                self._next = port + 1 if port < self.last else self.first
                if port in self._given or not _bindable(port):
                    continue
                if not self._bus or _bindable(port + CLUSTER_BUS_OFFSET):
                    self._given.add(port)
                    return port
        raise RedisServerError(f"no free port left in {self.first}-{self.last}")


_range = PortRange()


def free_port() -> int:
    """A TCP port on 127.0.0.1, free a moment ago, from this process's slice (see :func:`install`)."""
    return _range.take()


def install(index: int, count: int) -> PortRange:
    """Make this process worker ``index`` of ``count``: every test ``RedisServer`` takes its ports here."""
    global _range
    _range = PortRange(index, count)
    return _range
