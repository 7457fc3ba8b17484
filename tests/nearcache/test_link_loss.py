"""A link lost twice over in one poll is dropped once: its invalidation socket fails *and* its PING is overdue.

Before the fix, :meth:`kvstatus.invalidation.Links.poll` listed the link as broken for each, dropped it twice,
and the cache counted two flushes (and two reasons) for one loss.
"""

from __future__ import annotations

import select
import time

import pytest

from kvstatus import KVPoll, StatusStore
from kvstatus.invalidation import InvalidationSocket, LinkLost

pytestmark = pytest.mark.real

READABLE_WAIT = 30.0
"""Seconds to wait for Redis' invalidation to arrive (a bound for a stuck server, not a measure)."""


def test_a_link_that_fails_two_ways_in_one_poll_is_dropped_once(
    cached: StatusStore, writer: StatusStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer.update_status(1, KVPoll.Bootstrapping)
    assert cached.get(1) is KVPoll.Bootstrapping  # tracked from here on: the next write pushes an invalidation
    links = cached.near_cache.links
    (link,) = links.links.values()
    writer.update_status(1, KVPoll.Transferring)
    assert select.select([link.inval.fileno()], [], [], READABLE_WAIT)[0], "no invalidation arrived"

    def lost(self: InvalidationSocket) -> tuple[list[bytes], bool, bool]:
        raise LinkLost("connection failed: injected")

    monkeypatch.setattr(InvalidationSocket, "drain", lost)  # the socket fails as it is read ...
    now = time.monotonic()
    link.ping_outstanding = now - 3600.0  # ... and its PING has had no answer for an hour
    links.next_ping = 0.0
    flushes = cached.near_cache.state.flushes
    links.poll(now)
    assert cached.near_cache.state.flushes == flushes + 1, cached.near_cache.state.flush_reasons
    assert links.links == {}
    monkeypatch.undo()
    assert cached.get(1) is KVPoll.Transferring  # a new link, and the room read again
