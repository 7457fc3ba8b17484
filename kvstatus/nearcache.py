"""A coherent near cache of room hashes, kept in step by Redis' CLIENT TRACKING (sync and async).

How it stays coherent
---------------------
Per Redis server (each primary of a cluster) the cache holds a *link* of two
connections of its own:

- the **data connection** reads rooms that are not cached (``HGETALL`` and
  ``PTTL``, pipelined). It runs ``CLIENT TRACKING ON REDIRECT <id>``, so Redis
  remembers every key it read, present or missing, and reports the next change
  of each of them once;
- the **invalidation connection** (``<id>``) speaks RESP3 and receives those
  reports as push messages, subscribed to nothing: no channel permission, and
  nothing another client publishes reaches it. Its socket is a plain
  non-blocking socket, read *on every cache read* before the lookup (no
  listener thread: measured to leave changes unseen for ~0.6 s behind the
  GIL). The async cache reads it the same way, so a change is seen even if the
  event loop has not run since.

Rules that make a cached read never older than the last change Redis reported
before the read started:

- an invalidation drops the room; a null invalidation (``FLUSHDB``,
  ``FLUSHALL``, tracking table overflow) drops every room;
- a fill that raced an invalidation of the same room (or any flush) is
  returned to its caller but not stored (:class:`CacheState` keeps a short log
  of invalidated rooms and compares it with the fill's starting point);
- a closed or failing connection of any link, a reconnect (every new link
  empties the cache), a cluster slot map change (a MOVED/ASK reply, or the
  topology check) or a Sentinel-managed server that is no longer the master
  (the topology check) empties the whole cache before the next read is served.
  The topology check runs on the read path every ``max_staleness`` seconds:
  one ``CLUSTER SLOTS`` (cluster) or ``ROLE`` (Sentinel) round
  trip; a plain server needs none (a restart closes the connections);
- *liveness*: every ``max_staleness / 4`` seconds the cache sends a ``PING`` on
  each invalidation connection. A cached value is served only while, for every
  link, a PING sent at most ``max_staleness`` seconds ago has been answered:
  the answer proves that every invalidation Redis queued before it has been
  applied. Past that (an idle reader, a silent network partition) reads go to
  Redis, which either answers (and refills) or raises;
- the store's own writes drop their rooms locally at once (read-your-writes).

Staleness guarantee: a cached read returns a room as it was at some moment no
earlier than ``min(now - max_staleness, the last reported change)``; on a
healthy loopback a change is applied by the first read that starts after its
invalidation reached the socket (measured p99 well under 1 ms, see
``benchmarks/nearcache.py``). On a cluster, a room that was cached as *absent*
and whose slot moved to another node without a MOVED reply is refreshed by the
slot map check, at most ``max_staleness`` seconds later.

Bounded: at most ``max_rooms`` rooms; the oldest fill not read since its last chance is evicted first
(CLOCK, an approximation of least recently used).

Every command the cache sends (fills, topology checks) goes through the store's send path
(:mod:`kvstatus._async.sender`): the store's deadline, observer, resends and error translation apply,
so a miss against a hung server raises within the deadline like a plain read.

Layout: the state is :mod:`kvstatus.cachestate` (plain data), the invalidation reader
:mod:`kvstatus.invalidation`, the topology :mod:`kvstatus.topology`, and the driver is written once in
:mod:`kvstatus._async.nearcache` (the sync one is generated). This module keeps their import paths.

Observed: given the observer of the store that turned it on (``metrics=``, :mod:`kvstatus.observer`), the
cache counts rooms answered from memory (hits) and read from Redis (misses), cached rooms dropped by
Redis' invalidation messages, errors of its reads, and sets its size. Stores made by ``for_participant``
share the cache, so its series carry the labels of the store that made it.
"""

from kvstatus._async.nearcache import AsyncNearCache
from kvstatus._sync.nearcache import NearCache
from kvstatus.cachestate import (
    _LOG_KEEP,
    CLIENT_BYTES_PER_ROOM,
    DEFAULT_MAX_ROOMS,
    DEFAULT_MAX_STALENESS,
    MAX_MAX_ROOMS,
    CachedRoom,
    CacheState,
    NearCacheBase,
    NearCacheOptions,
    make_near_cache,
    near_cache_setting,
    room_from_replies,
    unique_rooms,
    view_at,
)
from kvstatus.invalidation import INVALIDATE_CHANNEL, InvalidationSocket, LinkLost, Links, LinkState
from kvstatus.topology import SlotMoved, Topology

__all__ = [
    "_LOG_KEEP",
    "CLIENT_BYTES_PER_ROOM",
    "DEFAULT_MAX_ROOMS",
    "DEFAULT_MAX_STALENESS",
    "INVALIDATE_CHANNEL",
    "MAX_MAX_ROOMS",
    "AsyncNearCache",
    "CacheState",
    "CachedRoom",
    "InvalidationSocket",
    "LinkLost",
    "LinkState",
    "Links",
    "NearCache",
    "NearCacheBase",
    "NearCacheOptions",
    "SlotMoved",
    "Topology",
    "make_near_cache",
    "near_cache_setting",
    "room_from_replies",
    "unique_rooms",
    "view_at",
]
