"""A lost link empties the cache once, with a reason that names its server.

- A link lost twice over in one poll (its invalidation socket fails *and* its PING is overdue) is dropped once:
  :meth:`kvstatus.invalidation.Links.poll` listed it as broken for each, dropped it twice, and the cache counted
  two flushes (and two reasons) for one loss. A single server's link (named "") read "connection of  lost".
- A reset of every link (a failed read or topology check, SWAPDB, a moved slot, a close) flushed once per link
  and once more.
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
    assert cached.near_cache.state.flush_reasons[-1] == "connection of server lost"  # a single server's link
    assert links.links == {}
    monkeypatch.undo()
    assert cached.get(1) is KVPoll.Transferring  # a new link, and the room read again


def test_a_reset_of_the_links_empties_the_cache_once(cached: StatusStore, writer: StatusStore) -> None:
    writer.update_status(1, KVPoll.Bootstrapping)
    assert cached.get(1) is KVPoll.Bootstrapping
    cache = cached.near_cache
    assert len(cache.links.links) == 1
    woken: list[int] = []
    cache.watch(1, lambda: woken.append(1))  # a wait_for on the room is woken by each flush
    flushes = cache.state.flushes
    cache.shut()
    assert (cache.state.flushes, cache.state.flush_reasons[-1], woken) == (flushes + 1, "closed", [1])
    assert cache.links.links == {}
