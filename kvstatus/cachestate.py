"""The near cache's state as plain data (no I/O): cached rooms, invalidation log, eviction; fed by the drivers
(:mod:`kvstatus._async.nearcache`) and :mod:`kvstatus.invalidation`. docs/design.md ("How the near cache stays
coherent")."""

from __future__ import annotations

import sys
import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

from redis import exceptions as rx

from kvstatus.backend import can_track
from kvstatus.connection import SlotMoved
from kvstatus.errors import InvalidArgumentError
from kvstatus.keys import KeySchema
from kvstatus.model import KVPoll, ParticipantEntry, RoomView
from kvstatus.replies import Reply, decode_room
from kvstatus.rule import shared_failed

if TYPE_CHECKING:
    from kvstatus.model import StoreObserver

MAX_MAX_ROOMS = 10_000_000
CLIENT_BYTES_PER_ROOM = 300
"""Bytes: the bound on client memory per cached room with one participant (tests/nearcache holds it)."""
_LOG_KEEP = 4096
NULL_INVALIDATION = "null invalidation (FLUSHDB/FLUSHALL or tracking table full)"
MISS: Any = object()
"""What a lookup in a status map returns for a room that is not cached."""
POLL_GATE = 0.001
"""Seconds the dict-speed path (:class:`Freshness`) may serve the status maps without reading the sockets."""


@dataclass(frozen=True)
class NearCacheOptions:
    """``max_rooms``: rooms kept (CLOCK, about LRU). ``max_staleness``: seconds, the liveness bound.
    ``bcast``: track the namespace prefix (``BCAST PREFIX``) instead of each key read (docs/guide.md)."""

    max_rooms: int = 16_384
    max_staleness: float = 1.0
    bcast: bool = False

    def __post_init__(self) -> None:
        rooms, staleness = self.max_rooms, self.max_staleness
        if isinstance(rooms, bool) or not isinstance(rooms, int) or not 1 <= rooms <= MAX_MAX_ROOMS:
            raise InvalidArgumentError(f"invalid near cache size {rooms!r}: expected 1..{MAX_MAX_ROOMS} rooms")
        if isinstance(staleness, bool) or not isinstance(staleness, (int, float)) or not 0.01 <= staleness <= 3600:
            raise InvalidArgumentError(f"invalid near cache max_staleness {staleness!r}: expected 0.01..3600 seconds")


CachedRoom = tuple[Any, ...]
"""One room as read, flat to stay small: ``(deadline, failure, participant, status, reason, ...)``. ``deadline``:
the ``time.monotonic()`` at or before which Redis expires the key (None: no TTL or no key); names are interned."""
DEADLINE, FAILURE, FIRST_ENTRY = 0, 1, 2
"""Where a :data:`CachedRoom` keeps its parts."""

_ABSENT: CachedRoom = (None, None)
"""Every room with no key shares this one."""

Reader = tuple[str, bool]
"""Who reads a cached room, and how: a participant, and whether under shared fate (the store's setting)."""


def status_for(entry: CachedRoom, reader: Reader) -> Optional[KVPoll]:
    """``reader``'s status in a cached room (None: no entry), under shared fate if the reader reads so."""
    participant, shared = reader
    for i in range(FIRST_ENTRY, len(entry), 3):
        if entry[i] == participant:
            status: Optional[KVPoll] = entry[i + 1]
            failure = entry[FAILURE]
            if status is None or failure is None or not shared:
                return status
            return shared_failed(status, failure, participant)
    return None


def room_from_replies(
    room: int, key: str, fields: Union[list[Reply], Mapping[Reply, Reply]], pttl: int, sent_at: float
) -> CachedRoom:
    """Decode an ``HGETALL`` reply (flat list or mapping) and a ``PTTL`` reply read at ``sent_at`` or later."""
    if isinstance(fields, list):
        pairs = iter(fields)
        fields = dict(zip(pairs, pairs))
    # Validates every field a poll reads (a corrupted value raises here); timelines are not cached, nor parsed.
    view = decode_room(room, key, fields, pttl, timelines=False)
    # Redis read the key after sent_at: expiring the copy pttl ms after sent_at is never late.
    deadline = sent_at + pttl / 1000 if pttl >= 0 else None
    if deadline is None and not view.participants and view.failure is None:
        return _ABSENT
    parts: list[object] = [deadline, view.failure]
    for name, participant in view.participants.items():
        parts += (sys.intern(name), participant.status, participant.reason)
    return tuple(parts)


def view_at(room: int, entry: CachedRoom, now: float) -> RoomView:
    """Cached ``room`` as a :class:`RoomView`, its TTL counted down to ``now`` (a new object each call)."""
    participants = {entry[i]: ParticipantEntry(entry[i + 1], entry[i + 2]) for i in range(FIRST_ENTRY, len(entry), 3)}
    deadline = entry[DEADLINE]
    ttl_ms = None if deadline is None else max(0, round((deadline - now) * 1000))
    return RoomView(room, participants, ttl_ms, failure=entry[FAILURE])


class Freshness:
    """The lock-free read door of the SGLang map (docs/design.md, "How the near cache stays coherent"): while
    ``time.monotonic() < until`` a reader may look rooms up in a :meth:`CacheState.flat` map, appending one item
    to :attr:`hits` per read (``list.append`` is atomic, ``+= 1`` is not), which :meth:`CacheState.served` drops
    each :data:`POLL_GATE`. Only the driver writes ``until``, under its lock (0 after a flush)."""

    __slots__ = ("until", "hits")

    def __init__(self) -> None:
        self.until = 0.0
        self.hits: list[int] = []


NEVER_FRESH = Freshness()
"""The door of a reader with no (working) near cache: never fresh; nothing writes its ``until``."""


class CacheState:
    """The cached rooms, the per-reader status maps, the log of invalidated rooms racing fills are checked
    against, and eviction. Not thread-safe: its driver holds a lock around it."""

    def __init__(self, schema: KeySchema, options: NearCacheOptions) -> None:
        self.schema = schema
        self.options = options
        self.entries: OrderedDict[int, CachedRoom] = OrderedDict()  # in fill order
        # Per reader: room -> its status (None: no entry), for every cached room (see :meth:`flat`).
        self.flats: dict[Reader, dict[int, Optional[KVPoll]]] = {}
        # Rooms read since their last second chance (CLOCK); the hot paths record them only once the cache is
        # 3/4 full (``marking``): nothing is evicted before, and a polled room is marked long before it fills.
        self.referenced: set[int] = set()
        self.marking = False
        self.flushes = 0
        self.flush_reasons: list[str] = []  # the latest few, for tests and debugging
        self.invalidated = 0  # rooms invalidated since the start (the log's end)
        self._log: list[int] = []
        self.earliest_deadline = float("inf")
        self.fresh = Freshness()
        self.metrics: Optional[StoreObserver] = None  # told of invalidations and the size
        self.waiters: dict[int, list[Callable[[], None]]] = {}
        """Room -> the ``wake`` of each ``wait_for`` on it: called by :meth:`apply`, :meth:`flush` (not own writes)."""
        self.pushed = 0  # rooms Redis reported changed so far (what the doctor's wait_for check counts)

    def invalidate_all(self) -> None:
        """The server invalidated every key (a null invalidation: FLUSHDB/FLUSHALL, or its tracking table full)."""
        self.flush(NULL_INVALIDATION)

    def flush(self, reason: str) -> None:
        metrics = self.metrics
        if metrics is not None and self.entries:
            if reason == NULL_INVALIDATION:
                metrics.on_cache_invalidation(len(self.entries))
            metrics.set_cache_size(0)
        self.entries.clear()
        for flat in self.flats.values():
            flat.clear()
        self.referenced.clear()
        self.marking = False
        self._log.clear()
        self.flushes += 1
        self.earliest_deadline = float("inf")
        self.fresh.until = 0.0
        self.flush_reasons = (self.flush_reasons + [reason])[-8:]
        for wakes in self.waiters.values():
            for wake in wakes:
                wake()

    def invalidate(self, rooms: Iterable[int]) -> int:
        """Drop ``rooms`` (invalidated, or written here) and log them for racing fills; returns how many were cached."""
        pop = self.entries.pop
        flats = list(self.flats.values())
        log = self._log
        dropped = 0
        for room in rooms:
            if pop(room, None) is not None:  # every write of this process passes here: no call per room
                dropped += 1
                for flat in flats:
                    flat.pop(room, None)
            log.append(room)
            self.invalidated += 1
        if len(log) > 2 * _LOG_KEEP:
            del log[: len(log) - _LOG_KEEP]
        if dropped and self.metrics is not None:
            self.metrics.set_cache_size(len(self.entries))
        return dropped

    def apply(self, keys: list[bytes]) -> None:
        """Drop the rooms of invalidated keys (keys of other namespaces are ignored)."""
        rooms = [room for room in map(self.schema.room_of, keys) if room is not None]
        dropped = self.invalidate(rooms)
        if dropped and self.metrics is not None:
            self.metrics.on_cache_invalidation(dropped)
        self.pushed += len(rooms)
        for room in rooms:
            for wake in self.waiters.get(room, ()):
                wake()

    def wait_on(self, room: int, wake: Callable[[], None]) -> None:
        """Call ``wake()`` at each change Redis reports of ``room`` from now on, until :meth:`stop_waiting`."""
        self.waiters.setdefault(room, []).append(wake)

    def stop_waiting(self, room: int, wake: Callable[[], None]) -> None:
        wakes = self.waiters.get(room, [])
        if wake in wakes:
            wakes.remove(wake)
        if not wakes:
            self.waiters.pop(room, None)

    def expire(self, now: float) -> None:
        """Drop rooms whose key has expired in Redis (or will within a second: one sweep per second)."""
        deadlines = {room: entry[DEADLINE] for room, entry in self.entries.items() if entry[DEADLINE] is not None}
        expired = [room for room, deadline in deadlines.items() if deadline <= now + 1.0]
        for room in expired:
            self._forget(room)
            del deadlines[room]
        self.earliest_deadline = min(deadlines.values(), default=float("inf"))
        if expired and self.metrics is not None:
            self.metrics.set_cache_size(len(self.entries))

    def token(self) -> tuple[int, int]:
        """Where a fill starts: (flushes, invalidated)."""
        return self.flushes, self.invalidated

    def store(self, token: tuple[int, int], filled: dict[int, CachedRoom]) -> None:
        """Keep the rooms of a fill that no invalidation or flush raced since ``token``."""
        flushes, start = token
        logged_from = self.invalidated - len(self._log)
        if flushes != self.flushes or start < logged_from:
            return  # a flush raced it, or the log no longer reaches back to the fill's start
        raced = set(self._log[start - logged_from :]) if start < self.invalidated else ()
        flats = self.flats.items()
        for room, entry in filled.items():
            if room in raced:
                continue
            self.entries[room] = entry
            self.entries.move_to_end(room)
            for reader, flat in flats:
                flat[room] = status_for(entry, reader)
            deadline = entry[DEADLINE]
            if deadline is not None and deadline < self.earliest_deadline:
                self.earliest_deadline = deadline
        self.fresh.until = min(self.fresh.until, self.earliest_deadline)
        self._evict()
        if self.metrics is not None:
            self.metrics.set_cache_size(len(self.entries))

    def _evict(self) -> None:
        """CLOCK: drop the oldest rooms beyond ``max_rooms``; a room read since its last chance moves to the end."""
        entries, referenced = self.entries, self.referenced
        self.marking = len(entries) * 4 >= self.options.max_rooms * 3
        while len(entries) > self.options.max_rooms:
            room, entry = entries.popitem(last=False)
            if room in referenced:
                referenced.discard(room)
                entries[room] = entry
            else:
                self._forget(room)
        if len(referenced) > 2 * self.options.max_rooms:
            referenced.clear()  # rooms read but since invalidated; keep the set bounded

    def _forget(self, room: int) -> None:
        self.entries.pop(room, None)
        for flat in self.flats.values():
            flat.pop(room, None)

    def served(self, now: float, live_until: float, next_check: float) -> None:
        """The driver checked the links at ``now`` and they are live until ``live_until``: open the dict-speed
        path until the first of that, ``now + POLL_GATE``, the next topology check and the first expiry."""
        self.fresh.until = min(now + POLL_GATE, live_until, next_check, self.earliest_deadline)
        hits = self.fresh.hits
        count = len(hits)
        del hits[:count]  # a hit appended meanwhile stays for the next call
        if count and self.metrics is not None:
            self.metrics.on_cache_hit(count)

    def flat(self, reader: Reader) -> dict[int, Optional[KVPoll]]:
        """``reader``'s room -> status map (None: no entry; no key: not cached), one dict for the cache's life."""
        flat = self.flats.get(reader)
        if flat is None:
            flat = self.flats[reader] = {room: status_for(e, reader) for room, e in self.entries.items()}
        return flat

    def hits(self, rooms: Sequence[int], reader: Reader) -> Optional[dict[int, Optional[KVPoll]]]:
        """``reader``'s status in every room of the list or tuple ``rooms`` if all are cached, else None."""
        try:
            result = dict(zip(rooms, map(self.flat(reader).__getitem__, rooms)))
        except (KeyError, TypeError):
            return None
        # Only validated ints are cached, but True, 1.0 or KVPoll.Success would find room 1 or 4.
        if list(map(type, rooms)).count(int) != len(rooms):  # twice as fast as a set of the types
            return None
        if self.marking:
            self.referenced.update(rooms)
        return result

    @staticmethod
    def decode_fill(rooms: Sequence[int], keys: list[str], replies: list[Any], sent_at: float) -> dict[int, CachedRoom]:
        """The rooms of a fill's replies (an ``HGETALL`` and a ``PTTL`` of each of ``keys``, in turn); raises
        :class:`SlotMoved` for a MOVED/ASK reply, any other error as is."""
        for reply in replies:
            if isinstance(reply, rx.ResponseError):
                if str(reply).startswith(("MOVED", "ASK")):
                    raise SlotMoved(str(reply))
                raise reply
        return {
            room: room_from_replies(room, key, replies[2 * i], replies[2 * i + 1], sent_at)
            for i, (room, key) in enumerate(zip(rooms, keys))
        }


class NearCacheBase:
    """What both near-cache drivers are (:class:`~kvstatus._sync.nearcache.NearCache`,
    :class:`~kvstatus._async.nearcache.AsyncNearCache`): a store given one shares it."""

    closed: bool
    state: CacheState

    def invalidate(self, rooms: Iterable[int]) -> None:
        raise NotImplementedError

    def status_map(self, reader: Reader) -> dict[int, Optional[KVPoll]]:
        raise NotImplementedError


_CACHES: dict[str, list[weakref.ref[NearCacheBase]]] = {}
"""The process's near caches by namespace base: a list is replaced, never changed, so readers need no lock."""
_CACHES_LOCK = threading.Lock()


def register(cache: NearCacheBase) -> None:
    """Make ``cache`` one of this process's near caches, told of :func:`writes_sent`."""
    base = cache.state.schema.base
    with _CACHES_LOCK:
        live = [ref for ref in _CACHES.get(base, ()) if ref() is not None]
        _CACHES[base] = [*live, weakref.ref(cache)]


def writes_sent(schema: KeySchema, rooms: Iterable[int]) -> None:
    """This process wrote (or may have written) ``rooms`` of ``schema``'s namespace: its near caches drop them."""
    refs = _CACHES.get(schema.base)
    if not refs:
        return
    rooms = list(rooms)
    for ref in refs:
        cache = ref()
        if cache is not None:
            cache.invalidate(rooms)


def make_near_cache(
    setting: Union[bool, NearCacheOptions, NearCacheBase, None],
    cache_class: Callable[..., NearCacheBase],
    client: object,
    schema: KeySchema,
    sender: object,
) -> Optional[NearCacheBase]:
    """The cache of a store: None (``setting`` None/False), a shared cache as given, or a new
    ``cache_class`` (``setting`` True or :class:`NearCacheOptions`) that sends through ``sender``."""
    if setting is None or setting is False:
        return None
    if isinstance(setting, NearCacheBase):
        return setting
    if setting is not True and not isinstance(setting, NearCacheOptions):
        raise InvalidArgumentError(f"invalid near_cache {setting!r}: expected True, False or NearCacheOptions")
    if not can_track(client):
        raise InvalidArgumentError("the near cache needs a real Redis (CLIENT TRACKING); fakeredis has none")
    options = setting if isinstance(setting, NearCacheOptions) else NearCacheOptions()
    return cache_class(client, schema, options, sender)
