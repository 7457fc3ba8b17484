"""A coherent near cache of room hashes, kept in step by Redis' CLIENT TRACKING (sync and async).

How it stays coherent
---------------------
Per Redis server (each primary of a cluster) the cache holds a *link* of two
connections of its own:

- the **data connection** reads rooms that are not cached (``HGETALL`` and
  ``PTTL``, pipelined). It runs ``CLIENT TRACKING ON REDIRECT <id>``, so Redis
  remembers every key it read, present or missing, and reports the next change
  of each of them once;
- the **invalidation connection** (``<id>``) is subscribed to
  ``__redis__:invalidate`` and receives those reports. Its socket is a plain
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

Observed: given the observer of the store that turned it on (``metrics=``, :mod:`kvstatus.observer`), the
cache counts rooms answered from memory (hits) and read from Redis (misses), cached rooms dropped by
Redis' invalidation messages, errors of its reads, and sets its size. Stores made by ``for_participant``
share the cache, so its series carry the labels of the store that made it.
"""

from __future__ import annotations

import asyncio
import select
import ssl
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Optional

import hiredis
import redis
from redis import exceptions as rx
from redis.cluster import key_slot

from kvstatus.clients import is_cluster_client, is_sentinel_client
from kvstatus.connection import STORE_OPTIONS, parse_url
from kvstatus.errors import BackendUnavailableError, InvalidArgumentError
from kvstatus.keys import KeySchema, validate_room, validate_rooms
from kvstatus.operations import decode_room
from kvstatus.rule import KVPoll, ParticipantEntry, RoomView
from kvstatus.translate import connection_refused, translate_error

INVALIDATE_CHANNEL = "__redis__:invalidate"
DEFAULT_MAX_ROOMS = 16_384
DEFAULT_MAX_STALENESS = 1.0
MAX_MAX_ROOMS = 10_000_000
# Upper bound of the client memory per cached room with one participant read through it; tracemalloc
# measured ~770 bytes (a room with an entry) and ~400 (an absent room). tests/nearcache holds the bound.
CLIENT_BYTES_PER_ROOM = 1_000
_LOG_KEEP = 4096
_NULL_INVALIDATION = "null invalidation (FLUSHDB/FLUSHALL or tracking table full)"
_MISS = object()
_PING = b"*1\r\n$4\r\nPING\r\n"
_RECV = 65536
_WOULD_BLOCK = (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError, InterruptedError)
_LINK_ERRORS = (rx.ConnectionError, rx.TimeoutError, OSError, EOFError)


class LinkLost(Exception):
    """A connection of a link failed or closed; the cache was emptied."""


class SlotMoved(Exception):
    """A cluster node answered MOVED/ASK; the cache was emptied."""


@dataclass(frozen=True)
class NearCacheOptions:
    """``max_rooms``: rooms kept (LRU). ``max_staleness``: seconds, the liveness bound above.
    ``bcast``: track the whole namespace prefix (``BCAST PREFIX``) instead of each key read; see the
    benchmark for why the default (per key) is the better choice for this workload."""

    max_rooms: int = DEFAULT_MAX_ROOMS
    max_staleness: float = DEFAULT_MAX_STALENESS
    bcast: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.max_rooms, bool) or not isinstance(self.max_rooms, int) \
                or not 1 <= self.max_rooms <= MAX_MAX_ROOMS:
            raise InvalidArgumentError(f"invalid near cache size {self.max_rooms!r}: expected 1..{MAX_MAX_ROOMS} rooms")
        if isinstance(self.max_staleness, bool) or not isinstance(self.max_staleness, (int, float)) \
                or not 0.01 <= self.max_staleness <= 3600:
            raise InvalidArgumentError(f"invalid near cache max_staleness {self.max_staleness!r}: "
                                       "expected 0.01..3600 seconds")


class CachedRoom(NamedTuple):
    """One room as read: statuses by participant (entries with a status only), the full view, and the
    local ``time.monotonic()`` deadline at or before which Redis expires the key (None: no TTL / no key)."""

    statuses: dict[str, KVPoll]
    view: RoomView
    deadline: Optional[float]


def room_from_replies(room: int, key: str, fields: Any, pttl: int, sent_at: float) -> CachedRoom:
    """Decode an ``HGETALL`` reply (flat list or mapping) and a ``PTTL`` reply read at ``sent_at`` or later."""
    if isinstance(fields, list):
        pairs = iter(fields)
        fields = dict(zip(pairs, pairs))
    view = decode_room(room, key, fields, pttl)
    statuses = {name: entry.status for name, entry in view.participants.items() if entry.status is not None}
    # The key expires pttl ms after Redis read it, which is after sent_at: expiring the copy at
    # sent_at + pttl is never late.
    deadline = sent_at + pttl / 1000 if pttl >= 0 else None
    return CachedRoom(statuses, view, deadline)


def unique_rooms(rooms: Iterable[int]) -> list[int]:
    """The distinct valid rooms of a ``get_many`` argument, in order (same checks as the store)."""
    if isinstance(rooms, (str, bytes, bytearray, Mapping)) or not isinstance(rooms, Iterable):
        raise InvalidArgumentError(f"get_many expects an iterable of room ids, not {type(rooms).__name__}")
    return list(dict.fromkeys(validate_rooms(rooms)))


def view_at(entry: CachedRoom, now: float) -> RoomView:
    """The cached view with its TTL counted down to ``now`` (a copy; the cache keeps its own)."""
    view = entry.view
    ttl_ms = None if entry.deadline is None else max(0, round((entry.deadline - now) * 1000))
    participants = {name: ParticipantEntry(e.status, e.reason) for name, e in view.participants.items()}
    return RoomView(view.room, participants, ttl_ms if view.ttl_ms is not None else None)


# --------------------------------------------------------------------------- the invalidation socket


def _peer_of(connection: Any) -> Any:
    """The address a connected redis-py connection (sync or async) talks to: which server it reached.

    Compared instead of INFO's run_id, which the tenant ACL recipe does not grant (INFO shows every
    namespace's totals)."""
    sock = getattr(connection, "_sock", None)
    if sock is not None:
        return sock.getpeername()
    writer = getattr(connection, "_writer", None)
    if writer is None:
        raise LinkLost("the connection is not connected")
    return writer.get_extra_info("peername")


def _role(reply: Any) -> str:
    """The first field of a ROLE reply: "master", "slave" or "sentinel"."""
    if not isinstance(reply, (list, tuple)) or not reply:
        raise LinkLost(f"unexpected ROLE reply {reply!r}")
    first = reply[0]
    return first.decode() if isinstance(first, bytes) else str(first)


class InvalidationSocket:
    """The invalidation connection of one server, read without blocking (shared by sync and async caches).

    ``open`` runs the blocking handshake (redis-py's: auth, TLS, ``CLIENT SETNAME``), reads the
    connection's ``CLIENT ID`` and the server's address, subscribes, and turns the socket
    non-blocking. From then on only :meth:`drain` and :meth:`ping` touch it.
    """

    def __init__(self, connection: Any) -> None:
        self.connection = connection
        self.client_id = 0
        self.peer: Any = None
        self.sock: Any = None
        self._reader = hiredis.Reader()

    def open(self) -> None:
        conn = self.connection
        conn.connect()
        conn.send_command("CLIENT", "ID")
        self.client_id = int(conn.read_response())
        self.peer = _peer_of(conn)
        conn.send_command("SUBSCRIBE", INVALIDATE_CHANNEL)
        reply = conn.read_response(push_request=True)  # a push frame on RESP3
        if not (isinstance(reply, list) and reply and reply[0] in (b"subscribe", "subscribe")):
            raise LinkLost(f"unexpected SUBSCRIBE reply {reply!r}")
        self.sock = conn._sock  # redis-py's handshake is done; this socket is ours from here on
        self.sock.setblocking(False)

    def fileno(self) -> int:
        return self.sock.fileno()

    def drain(self) -> tuple[list[bytes], bool, bool]:
        """Read what arrived: (invalidated keys, flush everything?, a PONG arrived?). Raises LinkLost."""
        sock, reader = self.sock, self._reader
        while True:
            try:
                data = sock.recv(_RECV)
            except _WOULD_BLOCK:
                break
            except OSError as exc:
                raise LinkLost(f"invalidation connection failed: {exc}") from exc
            if not data:
                raise LinkLost("invalidation connection closed by the server")
            reader.feed(data)
            if len(data) < _RECV and not (isinstance(sock, ssl.SSLSocket) and sock.pending()):
                break
        keys: list[bytes] = []
        flush = pong = False
        while True:
            message = reader.gets()
            if message is False:
                return keys, flush, pong
            if isinstance(message, hiredis.ReplyError):
                raise LinkLost(f"invalidation connection got an error: {message}")
            if not isinstance(message, list):  # RESP3 answers PING with +PONG even when subscribed
                pong = pong or message == b"PONG"
                continue
            kind = message[0]
            if kind == b"message" or kind == b"invalidate":  # RESP2 Pub/Sub message, RESP3 push
                payload = message[-1]
                if payload is None:
                    flush = True
                else:
                    keys.extend(payload)
            elif kind == b"pong":
                pong = True

    def ping(self) -> bool:
        """Send a PING without blocking; False if the socket would block (try again later)."""
        try:
            sent = self.sock.send(_PING)
        except _WOULD_BLOCK:
            return False
        except OSError as exc:
            raise LinkLost(f"invalidation connection failed: {exc}") from exc
        if sent != len(_PING):  # a partial PING would corrupt the stream; give the link up
            raise LinkLost("invalidation connection send buffer full")
        return True

    def close(self) -> None:
        try:
            self.connection.disconnect()
        except Exception:  # noqa: BLE001 - closing a broken connection must not raise
            pass


def sync_twin(conn: Any) -> redis.Connection:
    """A new blocking redis-py connection to the server ``conn`` (sync or async, connected) is on,
    with the same credentials, database and TLS settings."""
    common: dict[str, Any] = {
        "username": getattr(conn, "username", None),
        "password": getattr(conn, "password", None),
        "db": getattr(conn, "db", 0),
        "socket_timeout": getattr(conn, "socket_timeout", None),
        "socket_connect_timeout": getattr(conn, "socket_connect_timeout", None),
        "client_name": getattr(conn, "client_name", None),
        "credential_provider": getattr(conn, "credential_provider", None),
    }
    path = getattr(conn, "path", None)
    if path:
        return redis.UnixDomainSocketConnection(path=path, **common)
    address = {"host": conn.host, "port": conn.port}
    context = getattr(conn, "ssl_context", None)  # redis.asyncio's SSLConnection
    tls_source = context if context is not None else conn
    if context is not None or isinstance(conn, redis.SSLConnection):
        return redis.SSLConnection(
            **address, **common,
            ssl_keyfile=getattr(tls_source, "keyfile", None),
            ssl_certfile=getattr(tls_source, "certfile", None),
            ssl_cert_reqs=getattr(tls_source, "cert_reqs", "required"),
            ssl_ca_certs=getattr(tls_source, "ca_certs", None),
            ssl_check_hostname=getattr(tls_source, "check_hostname", False),
        )
    return redis.Connection(**address, **common)


def tracking_command(client_id: int, schema: KeySchema, bcast: bool) -> tuple[Any, ...]:
    """``CLIENT TRACKING ON REDIRECT <id>`` (with ``BCAST PREFIX <namespace base>`` when ``bcast``)."""
    command: tuple[Any, ...] = ("CLIENT", "TRACKING", "ON", "REDIRECT", client_id)
    if bcast:
        command += ("BCAST", "PREFIX", schema.base)
    return command


# --------------------------------------------------------------------------- the shared state


class LinkState:
    """Liveness bookkeeping of one link (times are ``time.monotonic()`` seconds)."""

    __slots__ = ("name", "inval", "data", "data_fd", "confirmed", "ping_sent", "ping_outstanding")

    def __init__(self, name: str, inval: InvalidationSocket, data: Any, data_fd: Optional[int], now: float) -> None:
        self.name = name
        self.inval = inval
        self.data = data
        self.data_fd = data_fd  # sync only: polled for an unexpected close
        self.confirmed = now
        self.ping_sent = now
        self.ping_outstanding: Optional[float] = None


class CacheState:
    """Everything the sync and async caches share: entries, invalidation log, liveness, polling.

    Not thread-safe by itself: :class:`NearCache` holds a lock around it, the async cache runs it on
    one event loop.
    """

    def __init__(self, schema: KeySchema, options: NearCacheOptions,
                 close_link: Callable[[LinkState], None]) -> None:
        self.schema = schema
        self._close_link = close_link
        self.options = options
        self.entries: OrderedDict[int, CachedRoom] = OrderedDict()  # in fill order
        # Per participant read so far: room -> its status (None: no entry), for every cached room. The hot
        # paths are then one C-level dict lookup per room.
        self.flats: dict[str, dict[int, Optional[KVPoll]]] = {}
        # Rooms read since they were last given a second chance (CLOCK, an LRU approximation that costs
        # one C-level set update per read instead of an OrderedDict move per room). Reads are only recorded
        # once the cache is 3/4 full (``marking``): before that nothing is evicted, and a room read at a poll
        # loop's rate is marked long before the cache fills up.
        self.referenced: set[int] = set()
        self.marking = False
        self.links: dict[str, LinkState] = {}
        self.flushes = 0
        self.flush_reasons: list[str] = []  # the latest few, for tests and debugging
        self.invalidated = 0  # rooms invalidated since the start (the log's end)
        self._log: list[int] = []
        self._poller = select.poll()
        self._fds: dict[int, tuple[LinkState, bool]] = {}
        self.live_until = 0.0
        self.next_ping = 0.0
        self.earliest_deadline = float("inf")
        self._ping_interval = options.max_staleness / 4
        self.metrics: Any = None  # a kvstatus.observer.StoreObserver, told of invalidations and the size

    # ---- links

    def add_link(self, link: LinkState) -> None:
        self.links[link.name] = link
        self._register(link.inval.fileno(), link, True)
        if link.data_fd is not None:
            self._register(link.data_fd, link, False)
        self._update_live()

    def _register(self, fd: int, link: LinkState, is_inval: bool) -> None:
        self._fds[fd] = (link, is_inval)
        self._poller.register(fd, select.POLLIN | select.POLLPRI)

    def drop_link(self, name: str, reason: str) -> Optional[LinkState]:
        """Forget a link (the caller closes its connections) and empty the cache."""
        link = self.links.pop(name, None)
        if link is not None:
            for fd, (owner, _) in list(self._fds.items()):
                if owner is link:
                    del self._fds[fd]
                    try:
                        self._poller.unregister(fd)
                    except (KeyError, ValueError):
                        pass
            self._close_link(link)
        self.flush(reason)
        self._update_live()
        return link

    def _update_live(self) -> None:
        if self.links:
            self.live_until = min(link.confirmed for link in self.links.values()) + self.options.max_staleness
        else:
            self.live_until = 0.0

    # ---- invalidation

    def flush(self, reason: str) -> None:
        metrics = self.metrics
        if metrics is not None and self.entries:
            if reason == _NULL_INVALIDATION:
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
        self.flush_reasons = (self.flush_reasons + [reason])[-8:]

    def invalidate(self, rooms: Iterable[int]) -> int:
        """Drop ``rooms`` (an invalidation, or this process's own write) and log them for racing fills;
        returns how many were cached."""
        pop = self.entries.pop
        flats = list(self.flats.values())
        log = self._log
        dropped = 0
        for room in rooms:
            if pop(room, None) is not None:
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

    def _apply(self, keys: list[bytes]) -> None:
        room_of = self.schema.room_of
        rooms = [room for room in map(room_of, keys) if room is not None]
        dropped = self.invalidate(rooms)
        if dropped and self.metrics is not None:
            self.metrics.on_cache_invalidation(dropped)

    def poll(self, now: float) -> list[str]:
        """Apply whatever arrived on the invalidation sockets; return the names of failed links
        (their rooms are already flushed; the caller closes and forgets them). Sends due PINGs."""
        broken: list[str] = []
        events = self._poller.poll(0)
        for fd, _ in events:
            link, is_inval = self._fds.get(fd, (None, False))
            if link is None or link.name in broken:
                continue
            if not is_inval:
                broken.append(link.name)  # the data connection has nothing to say unless it closed
                continue
            try:
                keys, flush, pong = link.inval.drain()
            except LinkLost:
                broken.append(link.name)
                continue
            if flush:
                self.flush(_NULL_INVALIDATION)
            elif keys:
                self._apply(keys)
            if pong and link.ping_outstanding is not None:
                link.confirmed = link.ping_outstanding
                link.ping_outstanding = None
                self._update_live()
        if now >= self.next_ping:
            self.next_ping = now + self._ping_interval
            for link in self.links.values():
                if link.ping_outstanding is None:
                    try:
                        if link.inval.ping():
                            link.ping_outstanding = now
                    except LinkLost:
                        if link.name not in broken:
                            broken.append(link.name)
                elif now - link.ping_outstanding > max(5.0, 4 * self.options.max_staleness):
                    broken.append(link.name)  # no answer at all: a dead peer that sent no FIN
        for name in broken:
            self.drop_link(name, f"connection of {name} lost")
        return broken

    # ---- lookups and fills

    def expire(self, now: float) -> None:
        """Drop rooms whose key has expired in Redis (or will within a second: one sweep per second)."""
        horizon = now + 1.0
        expired = [room for room, entry in self.entries.items()
                   if entry.deadline is not None and entry.deadline <= horizon]
        for room in expired:
            self._forget(room)
        self.earliest_deadline = min(
            (entry.deadline for entry in self.entries.values() if entry.deadline is not None), default=float("inf"))
        if expired and self.metrics is not None:
            self.metrics.set_cache_size(len(self.entries))

    def token(self) -> tuple[int, int]:
        """Where a fill starts: (flushes, invalidated)."""
        return self.flushes, self.invalidated

    def store(self, token: tuple[int, int], filled: dict[int, CachedRoom]) -> None:
        """Keep the rooms of a fill that no invalidation or flush raced since ``token``."""
        flushes, start = token
        if flushes != self.flushes:
            return
        logged_from = self.invalidated - len(self._log)
        if start < logged_from:
            return  # the log no longer reaches back to the fill's start
        raced = set(self._log[start - logged_from:]) if start < self.invalidated else ()
        entries = self.entries
        flats = self.flats.items()
        for room, entry in filled.items():
            if room in raced:
                continue
            entries[room] = entry
            entries.move_to_end(room)
            for participant, flat in flats:
                flat[room] = entry.statuses.get(participant)
            if entry.deadline is not None and entry.deadline < self.earliest_deadline:
                self.earliest_deadline = entry.deadline
        self._evict()
        if self.metrics is not None:
            self.metrics.set_cache_size(len(entries))

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
                self._forget(room, entry_gone=True)
        if len(referenced) > 2 * self.options.max_rooms:
            referenced.clear()  # rooms read but since invalidated; keep the set bounded

    def _forget(self, room: int, entry_gone: bool = False) -> None:
        if not entry_gone:
            self.entries.pop(room, None)
        for flat in self.flats.values():
            flat.pop(room, None)

    def flat(self, participant: str) -> dict[int, Optional[KVPoll]]:
        """The room -> status map of ``participant`` (built on its first read)."""
        flat = self.flats.get(participant)
        if flat is None:
            flat = self.flats[participant] = {room: e.statuses.get(participant) for room, e in self.entries.items()}
        return flat

    def hits(self, rooms: Any, participant: str) -> Optional[dict[int, Optional[KVPoll]]]:
        """``participant``'s status in every room of the list or tuple ``rooms`` if all are cached, else None."""
        try:
            result = dict(zip(rooms, map(self.flat(participant).__getitem__, rooms)))
        except (KeyError, TypeError):
            return None
        # Only validated ints are cached, but True, 1.0 or KVPoll.Success would find room 1 or 4.
        if list(map(type, rooms)).count(int) != len(rooms):  # twice as fast as a set of the types
            return None
        if self.marking:
            self.referenced.update(rooms)
        return result

    def fill_commands(self, rooms: Sequence[int]) -> tuple[list[str], list[tuple[Any, ...]]]:
        keys = self.schema.room_keys(rooms)
        commands: list[tuple[Any, ...]] = []
        for key in keys:
            commands.append(("HGETALL", key))
            commands.append(("PTTL", key))
        return keys, commands

    @staticmethod
    def decode_fill(rooms: Sequence[int], keys: list[str], replies: list[Any], sent_at: float) -> dict[int, CachedRoom]:
        for reply in replies:
            if isinstance(reply, rx.ResponseError):
                text = str(reply)
                if text.startswith(("MOVED", "ASK")):
                    raise SlotMoved(text)
                raise reply
        return {room: room_from_replies(room, key, replies[2 * i], replies[2 * i + 1], sent_at)
                for i, (room, key) in enumerate(zip(rooms, keys))}


# --------------------------------------------------------------------------- topology


def _slot_fingerprint(reply: Any) -> tuple[Any, ...]:
    """Slot ranges and their primaries from a ``CLUSTER SLOTS`` reply, order-independent."""
    ranges = []
    for item in reply or ():
        start, end, primary = item[0], item[1], item[2]
        host = primary[0].decode() if isinstance(primary[0], bytes) else str(primary[0])
        ranges.append((int(start), int(end), host, int(primary[1])))
    return tuple(sorted(ranges))


class Topology:
    """Which server holds a key, and how to open connections to it (sync or async client)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.cluster = is_cluster_client(client)
        self.asynchronous = type(client).__module__.startswith("redis.asyncio") or \
            type(client).__module__.startswith("fakeredis.aioredis")
        self.sentinel = is_sentinel_client(client)

    def probe_command(self) -> Optional[tuple[str, ...]]:
        """What the periodic topology check sends on a data connection: the slot map of a cluster, the role
        of a Sentinel-managed master, nothing on a plain server (a restart closes the connections)."""
        if self.cluster:
            return ("CLUSTER", "SLOTS")
        if self.sentinel:
            return ("ROLE",)
        return None

    def probe_changed(self, reply: Any, previous: Optional[tuple[Any, ...]]) -> tuple[Optional[str], Any]:
        """(why the cache must be emptied or None, the fingerprint to remember) for a probe reply."""
        if self.cluster:
            fingerprint = _slot_fingerprint(reply)
            changed = previous is not None and fingerprint != previous
            return ("cluster slot map changed" if changed else None), fingerprint
        role = _role(reply)
        return (None if role == "master" else f"the server became a {role} (failover)"), None

    def group(self, rooms: Sequence[int], keys: list[str]) -> dict[str, list[int]]:
        """Indices of ``keys`` by the name of the node that serves them ("" on a single server)."""
        if not self.cluster:
            return {"": list(range(len(keys)))}
        manager = self.client.nodes_manager
        groups: dict[str, list[int]] = {}
        for i, key in enumerate(keys):
            node = manager.get_node_from_slot(key_slot(key.encode()))
            groups.setdefault(node.name, []).append(i)
        return groups

    def node_name(self, key: str) -> str:
        """The name of the node serving ``key`` ("" on a single server)."""
        if not self.cluster:
            return ""
        return self.client.nodes_manager.get_node_from_slot(key_slot(key.encode())).name

    def new_data_connection(self, name: str) -> Any:
        """An unconnected connection to node ``name`` (any name on a single server)."""
        # Built from the pool's settings, not pool.make_connection(): these connections never return to the
        # pool, and make_connection() counts every one against max_connections for good.
        if not self.cluster:
            pool = self.client.connection_pool
            return pool.connection_class(**pool.connection_kwargs)
        node = self.client.get_node(node_name=name)
        if node is None:
            raise SlotMoved(f"node {name} left the cluster")
        if self.asynchronous:
            return node.connection_class(**node.connection_kwargs)
        pool = node.redis_connection.connection_pool
        return pool.connection_class(**pool.connection_kwargs)


# --------------------------------------------------------------------------- the sync cache


class _CacheBase:
    """What the sync and async caches hold alike: the topology, the shared :class:`CacheState`, the resend
    delays and the periodic topology check's bookkeeping; only the locks and the link closer differ."""

    def __init__(self, close_link: Callable[[LinkState], None], client: Any, schema: KeySchema,
                 options: Optional[NearCacheOptions] = None,
                 resend_delays: Sequence[float] = (0.05, 0.1, 0.2, 0.4, 0.8), metrics: Any = None) -> None:
        self.topology = Topology(client)
        self.state = CacheState(schema, options or NearCacheOptions(), close_link)
        # A kvstatus.observer.StoreObserver (the store's that made the cache) or None: hits, misses, errors.
        self.metrics = self.state.metrics = metrics
        self.resend_delays = tuple(resend_delays)
        self._probe = self.topology.probe_command()
        self._fingerprint: Any = None
        self._next_check = 0.0
        self.closed = False

    def _lookup(self, rooms: list[int], participant: str, now: float) -> tuple[dict[int, Optional[KVPoll]], list[int]]:
        """(the cached statuses of ``rooms``, the rooms to read) at ``now``; the sync cache holds its lock."""
        result: dict[int, Optional[KVPoll]] = {}
        if not self._ready(now):  # type: ignore[attr-defined]
            return result, list(rooms)
        misses: list[int] = []
        flat = self.state.flat(participant)
        for room in rooms:
            status = flat.get(room, _MISS)
            if status is _MISS:
                misses.append(room)
            else:
                result[room] = status  # type: ignore[assignment]
        self.state.referenced.update(result)
        return result, misses


class NearCache(_CacheBase):
    """The near cache of one namespace on a blocking redis-py client (thread-safe).

    ``rooms(rooms)`` returns each room's :class:`CachedRoom`, from the cache or read (and cached);
    ``invalidate(rooms)`` drops rooms after this process writes them. Connections are opened on first
    use; ``close()`` closes them.
    """

    def __init__(self, client: Any, schema: KeySchema, options: Optional[NearCacheOptions] = None,
                 resend_delays: Sequence[float] = (0.05, 0.1, 0.2, 0.4, 0.8), metrics: Any = None) -> None:
        super().__init__(_close_sync_link, client, schema, options, resend_delays, metrics)
        self._lock = threading.Lock()
        self._io_lock = threading.Lock()

    # ---- the hot path

    def _ready(self, now: float) -> bool:
        """Under the lock: apply invalidations, expire, and say whether cached rooms may be served."""
        state = self.state
        state.poll(now)
        if now >= state.earliest_deadline:
            state.expire(now)
        return now < state.live_until

    def status(self, room: int, participant: str) -> Optional[KVPoll]:
        """``participant``'s status in a validated ``room``, or None."""
        now = time.monotonic()
        if now >= self._next_check:
            self._check_topology(now)
        with self._lock:
            if self._ready(now):
                status = self.state.flat(participant).get(room, _MISS)
                if status is not _MISS:
                    if self.state.marking:
                        self.state.referenced.add(room)
                    if self.metrics is not None:
                        self.metrics.on_cache_hit()
                    return status  # type: ignore[return-value]
        return self._fill([room])[room].statuses.get(participant)

    def statuses(self, rooms: list[int], participant: str) -> dict[int, Optional[KVPoll]]:
        """``participant``'s status in each of the validated, distinct ``rooms``."""
        now = time.monotonic()
        if now >= self._next_check:
            self._check_topology(now)
        with self._lock:
            result, misses = self._lookup(rooms, participant, now)
        if result and self.metrics is not None:
            self.metrics.on_cache_hit(len(result))
        if not misses:
            return result
        for room, entry in self._fill(misses).items():
            result[room] = entry.statuses.get(participant)
        return {room: result[room] for room in rooms}

    def _hits(self, rooms: Any, participant: str) -> Optional[dict[int, Optional[KVPoll]]]:
        now = time.monotonic()
        if now >= self._next_check:
            self._check_topology(now)
        with self._lock:
            return self.state.hits(rooms, participant) if self._ready(now) else None

    def view(self, room: int) -> RoomView:
        """Every participant's entry in a validated ``room``, TTL counted down locally."""
        now = time.monotonic()
        if now >= self._next_check:
            self._check_topology(now)
        with self._lock:
            if self._ready(now):
                entry = self.state.entries.get(room)
                if entry is not None:
                    self.state.referenced.add(room)
                    if self.metrics is not None:
                        self.metrics.on_cache_hit()
                    return view_at(entry, now)
        return view_at(self._fill([room])[room], time.monotonic())

    def invalidate(self, rooms: Iterable[int]) -> None:
        """Drop ``rooms``: call after this process wrote them, before returning to its caller."""
        with self._lock:
            self.state.invalidate(rooms)

    # ---- the store's read methods, with its argument checks and semantics

    def get(self, room: int, participant: str) -> Optional[KVPoll]:
        return self.status(validate_room(room), participant)

    def check_status(self, room: int, participant: str) -> KVPoll:
        status = self.status(validate_room(room), participant)
        if status is None:
            raise KeyError(room)
        return status

    def get_many(self, rooms: Iterable[int], participant: str) -> dict[int, Optional[KVPoll]]:
        if type(rooms) is list or type(rooms) is tuple:  # the hot path: every room cached
            found = self._hits(rooms, participant)
            if found is not None:
                if self.metrics is not None:
                    self.metrics.on_cache_hit(len(rooms))
                return found
        unique = unique_rooms(rooms)
        return self.statuses(unique, participant) if unique else {}

    def room(self, room: int) -> RoomView:
        return self.view(validate_room(room))

    # ---- misses

    def _fill(self, rooms: list[int]) -> dict[int, CachedRoom]:
        """Read ``rooms`` from Redis (and cache them); the observer counts them as misses, and any error.

        Raises kvstatus errors only, as the store does: a refused read (NOPERM) or a key of another type
        (WRONGTYPE) is PermissionDeniedError / CorruptedValueError, never a redis-py exception."""
        if self.metrics is not None:
            self.metrics.on_cache_miss(len(rooms))
        try:
            return self._fill_retrying(rooms)
        except Exception as exc:
            error = _fill_error(exc, self.metrics)
            if error is exc:
                raise
            raise error from exc

    def _fill_retrying(self, rooms: list[int]) -> dict[int, CachedRoom]:
        delays = self.resend_delays
        for attempt in range(len(delays) + 1):
            try:
                return self._fill_once(rooms)
            except SlotMoved as exc:
                self._reset_topology(str(exc))
            except (LinkLost, *_LINK_ERRORS) as exc:
                self._reset_links(f"read failed: {exc}")
                # A standalone server that refuses the connection is down: no resend (issue 19 item 17).
                if attempt == len(delays) or (connection_refused(exc) and not (self.topology.cluster
                                                                               or self.topology.sentinel)):
                    raise translate_error(exc if isinstance(exc, rx.RedisError) else rx.ConnectionError(str(exc))) \
                        from exc
            if attempt == len(delays):
                break
            time.sleep(delays[attempt])
        raise BackendUnavailableError("the near cache could not read from Redis: the cluster kept moving slots")

    def _fill_once(self, rooms: list[int]) -> dict[int, CachedRoom]:
        state = self.state
        keys, commands = state.fill_commands(rooms)
        with self._io_lock:
            groups = self.topology.group(rooms, keys)
            with self._lock:
                for name in groups:
                    if name not in state.links:
                        self._open_link(name)
                links = [state.links[name] for name in groups]
                token = state.token()
            sent_at = time.monotonic()
            for link, indices in zip(links, groups.values()):
                conn = link.data
                conn.send_packed_command(conn.pack_commands([commands[2 * i + j] for i in indices for j in (0, 1)]),
                                         check_health=False)
            replies: list[Any] = [None] * len(commands)
            for link, indices in zip(links, groups.values()):
                conn = link.data
                for i in indices:
                    for j in (0, 1):
                        try:
                            replies[2 * i + j] = conn.read_response(disconnect_on_error=True)
                        except rx.ResponseError as exc:
                            replies[2 * i + j] = exc
        filled = state.decode_fill(rooms, keys, replies, sent_at)
        with self._lock:
            state.poll(time.monotonic())  # invalidations that raced the read arrive before it is stored
            state.store(token, filled)
        return filled

    def _open_link(self, name: str) -> None:
        """Under both locks: connect the invalidation and the data connection of node ``name``."""
        data = self.topology.new_data_connection(name)
        inval: Optional[InvalidationSocket] = None
        try:
            data.connect()
            inval = InvalidationSocket(sync_twin(data))
            inval.open()
            if _peer_of(data) != inval.peer:
                raise LinkLost("the data and invalidation connections reached different servers")
            data.send_command(*tracking_command(inval.client_id, self.state.schema, self.state.options.bcast))
            reply = data.read_response()
            if reply not in (b"OK", "OK"):
                raise LinkLost(f"CLIENT TRACKING answered {reply!r}")
        except BaseException:
            data.disconnect()
            if inval is not None:
                inval.close()
            raise
        if self.topology.cluster and self._fingerprint is None:
            data.send_command("CLUSTER", "SLOTS", check_health=False)
            self._fingerprint = _slot_fingerprint(data.read_response())
        # A new link means a new (or reconnected) server: nothing read before can be trusted.
        self.state.flush(f"link to {name or 'server'} opened")
        self.state.add_link(LinkState(name, inval, data, data._sock.fileno(), time.monotonic()))

    def _check_topology(self, now: float) -> None:
        """Every ``max_staleness`` seconds: has the cluster's slot map changed, or is the Sentinel-managed server
        no longer the master? Then empty the cache (a failure empties it too). One round trip."""
        self._next_check = now + self.state.options.max_staleness
        if self._probe is None or not self.state.links:
            return
        try:
            with self._io_lock:
                link = next(iter(self.state.links.values()), None)
                if link is None:
                    return
                link.data.send_command(*self._probe, check_health=False)
                reply = link.data.read_response()
        except (LinkLost, *_LINK_ERRORS, rx.ResponseError) as exc:
            self._reset_links(f"topology check failed: {exc}")
            return
        reason, self._fingerprint = self.topology.probe_changed(reply, self._fingerprint)
        if reason:
            self._reset_topology(reason)

    def check(self) -> None:
        """Poll once: apply invalidations, check the topology if due (tests, benchmarks)."""
        now = time.monotonic()
        if now >= self._next_check:
            self._check_topology(now)
        with self._lock:
            self._ready(now)

    def _reset_links(self, reason: str) -> None:
        with self._lock:
            for name in list(self.state.links):
                self.state.drop_link(name, reason)
            self.state.flush(reason)

    def _reset_topology(self, reason: str) -> None:
        self._reset_links(reason)
        self._fingerprint = None
        if self.topology.cluster:
            try:
                self.topology.client.nodes_manager.initialize()
            except rx.RedisError:
                pass  # the next read reports it

    def close(self) -> None:
        self._reset_links("closed")
        self.closed = True


def _fill_error(exc: Exception, metrics: Any) -> Exception:
    """The error a failed fill raises: ``exc`` as its kvstatus error (told to ``metrics``, if any)."""
    error = translate_error(exc)
    if metrics is not None:
        metrics.on_error(error)
    return error  # type: ignore[return-value]


def _close_sync_link(link: LinkState) -> None:
    link.inval.close()
    try:
        link.data.disconnect()
    except Exception:  # noqa: BLE001
        pass


# --------------------------------------------------------------------------- the async cache


class AsyncNearCache(_CacheBase):
    """:class:`NearCache` on ``redis.asyncio``: same state and rules; the data connections are async, the
    invalidation sockets are the same non-blocking sockets (read without awaiting, so a change is seen
    even when the event loop has not run since it arrived)."""

    def __init__(self, client: Any, schema: KeySchema, options: Optional[NearCacheOptions] = None,
                 resend_delays: Sequence[float] = (0.05, 0.1, 0.2, 0.4, 0.8), metrics: Any = None) -> None:
        super().__init__(_close_async_link, client, schema, options, resend_delays, metrics)
        self._io_lock = asyncio.Lock()

    def _ready(self, now: float) -> bool:
        state = self.state
        for link in list(state.links.values()):
            reader = getattr(link.data, "_reader", None)  # redis.asyncio keeps the stream here
            if reader is None or reader.at_eof():
                self._drop(link.name, f"data connection of {link.name or 'server'} closed")
        state.poll(now)
        if now >= state.earliest_deadline:
            state.expire(now)
        return now < state.live_until

    def _drop(self, name: str, reason: str) -> None:
        self.state.drop_link(name, reason)

    async def status(self, room: int, participant: str) -> Optional[KVPoll]:
        now = time.monotonic()
        if now >= self._next_check:
            await self._check_topology(now)
        if self._ready(now):
            status = self.state.flat(participant).get(room, _MISS)
            if status is not _MISS:
                if self.state.marking:
                    self.state.referenced.add(room)
                if self.metrics is not None:
                    self.metrics.on_cache_hit()
                return status  # type: ignore[return-value]
        return (await self._fill([room]))[room].statuses.get(participant)

    async def statuses(self, rooms: list[int], participant: str) -> dict[int, Optional[KVPoll]]:
        now = time.monotonic()
        if now >= self._next_check:
            await self._check_topology(now)
        result, misses = self._lookup(rooms, participant, now)
        if result and self.metrics is not None:
            self.metrics.on_cache_hit(len(result))
        if not misses:
            return result
        for room, entry in (await self._fill(misses)).items():
            result[room] = entry.statuses.get(participant)
        return {room: result[room] for room in rooms}

    async def view(self, room: int) -> RoomView:
        now = time.monotonic()
        if now >= self._next_check:
            await self._check_topology(now)
        if self._ready(now):
            entry = self.state.entries.get(room)
            if entry is not None:
                self.state.referenced.add(room)
                if self.metrics is not None:
                    self.metrics.on_cache_hit()
                return view_at(entry, now)
        return view_at((await self._fill([room]))[room], time.monotonic())

    def invalidate(self, rooms: Iterable[int]) -> None:
        self.state.invalidate(rooms)

    async def get(self, room: int, participant: str) -> Optional[KVPoll]:
        return await self.status(validate_room(room), participant)

    async def check_status(self, room: int, participant: str) -> KVPoll:
        status = await self.status(validate_room(room), participant)
        if status is None:
            raise KeyError(room)
        return status

    async def get_many(self, rooms: Iterable[int], participant: str) -> dict[int, Optional[KVPoll]]:
        if type(rooms) is list or type(rooms) is tuple:
            now = time.monotonic()
            if now >= self._next_check:
                await self._check_topology(now)
            if self._ready(now):
                found = self.state.hits(rooms, participant)
                if found is not None:
                    if self.metrics is not None:
                        self.metrics.on_cache_hit(len(rooms))
                    return found
        unique = unique_rooms(rooms)
        return await self.statuses(unique, participant) if unique else {}

    async def room(self, room: int) -> RoomView:
        return await self.view(validate_room(room))

    async def _fill(self, rooms: list[int]) -> dict[int, CachedRoom]:
        if self.metrics is not None:
            self.metrics.on_cache_miss(len(rooms))
        try:
            return await self._fill_retrying(rooms)
        except Exception as exc:
            error = _fill_error(exc, self.metrics)
            if error is exc:
                raise
            raise error from exc

    async def _fill_retrying(self, rooms: list[int]) -> dict[int, CachedRoom]:
        delays = self.resend_delays
        for attempt in range(len(delays) + 1):
            try:
                return await self._fill_once(rooms)
            except SlotMoved as exc:
                await self._reset_topology(str(exc))
            except (LinkLost, *_LINK_ERRORS) as exc:
                self._reset_links(f"read failed: {exc}")
                # A standalone server that refuses the connection is down: no resend (issue 19 item 17).
                if attempt == len(delays) or (connection_refused(exc) and not (self.topology.cluster
                                                                               or self.topology.sentinel)):
                    raise translate_error(exc if isinstance(exc, rx.RedisError) else rx.ConnectionError(str(exc))) \
                        from exc
            if attempt == len(delays):
                break
            await asyncio.sleep(delays[attempt])
        raise BackendUnavailableError("the near cache could not read from Redis: the cluster kept moving slots")

    async def _fill_once(self, rooms: list[int]) -> dict[int, CachedRoom]:
        state = self.state
        keys, commands = state.fill_commands(rooms)
        async with self._io_lock:
            groups = self.topology.group(rooms, keys)
            for name in groups:
                if name not in state.links:
                    await self._open_link(name)
            links = [state.links[name] for name in groups]
            token = state.token()
            sent_at = time.monotonic()
            for link, indices in zip(links, groups.values()):
                conn = link.data
                await conn.send_packed_command(
                    conn.pack_commands([commands[2 * i + j] for i in indices for j in (0, 1)]), check_health=False)
            replies: list[Any] = [None] * len(commands)
            for link, indices in zip(links, groups.values()):
                conn = link.data
                for i in indices:
                    for j in (0, 1):
                        try:
                            replies[2 * i + j] = await conn.read_response(disconnect_on_error=True)
                        except rx.ResponseError as exc:
                            replies[2 * i + j] = exc
        filled = state.decode_fill(rooms, keys, replies, sent_at)
        state.poll(time.monotonic())
        state.store(token, filled)
        return filled

    async def _open_link(self, name: str) -> None:
        data = self.topology.new_data_connection(name)
        inval: Optional[InvalidationSocket] = None
        try:
            await data.connect()
            inval = InvalidationSocket(sync_twin(data))
            await asyncio.to_thread(inval.open)
            if _peer_of(data) != inval.peer:
                raise LinkLost("the data and invalidation connections reached different servers")
            await data.send_command(*tracking_command(inval.client_id, self.state.schema, self.state.options.bcast))
            reply = await data.read_response()
            if reply not in (b"OK", "OK"):
                raise LinkLost(f"CLIENT TRACKING answered {reply!r}")
        except BaseException:
            await data.disconnect()
            if inval is not None:
                inval.close()
            raise
        if self.topology.cluster and self._fingerprint is None:
            await data.send_command("CLUSTER", "SLOTS", check_health=False)
            self._fingerprint = _slot_fingerprint(await data.read_response())
        self.state.flush(f"link to {name or 'server'} opened")
        self.state.add_link(LinkState(name, inval, data, None, time.monotonic()))

    async def _check_topology(self, now: float) -> None:
        self._next_check = now + self.state.options.max_staleness
        if self._probe is None or not self.state.links:
            return
        try:
            async with self._io_lock:
                link = next(iter(self.state.links.values()), None)
                if link is None:
                    return
                await link.data.send_command(*self._probe, check_health=False)
                reply = await link.data.read_response()
        except (LinkLost, *_LINK_ERRORS, rx.ResponseError) as exc:
            self._reset_links(f"topology check failed: {exc}")
            return
        reason, self._fingerprint = self.topology.probe_changed(reply, self._fingerprint)
        if reason:
            await self._reset_topology(reason)

    def check(self) -> None:
        self._ready(time.monotonic())

    def _reset_links(self, reason: str) -> None:
        for name in list(self.state.links):
            self._drop(name, reason)
        self.state.flush(reason)

    async def _reset_topology(self, reason: str) -> None:
        self._reset_links(reason)
        self._fingerprint = None
        if self.topology.cluster:
            try:
                await self.topology.client.nodes_manager.initialize()
            except rx.RedisError:
                pass

    async def close(self) -> None:
        self._reset_links("closed")
        self.closed = True


def _close_async_link(link: LinkState) -> None:
    """Close a link of the async cache without awaiting (from the synchronous read path)."""
    link.inval.close()
    conn = link.data
    writer = getattr(conn, "_writer", None)
    if writer is not None:
        try:
            writer.close()
        except Exception:  # noqa: BLE001
            pass
    conn._reader = conn._writer = None


def near_cache_for(client: Any, schema: KeySchema, options: Optional[NearCacheOptions] = None,
                   resend_delays: Sequence[float] = (0.05, 0.1, 0.2, 0.4, 0.8), metrics: Any = None) -> Any:
    """A :class:`NearCache` or :class:`AsyncNearCache`, whichever fits ``client``."""
    topology = Topology(client)
    cls: Callable[..., Any] = AsyncNearCache if topology.asynchronous else NearCache
    return cls(client, schema, options, resend_delays, metrics)


def near_cache_setting(url: str, near_cache: Any) -> Any:
    """The near cache a store built by ``from_url`` gets: the argument if given (not None), else the URL's
    ``near_cache=true`` / ``near_cache_size=N`` query options (None: no cache)."""
    if near_cache is not None:
        return near_cache
    query = parse_url(url).query  # has validated the values
    size = query.get("near_cache_size")
    enabled = STORE_OPTIONS["near_cache"](query["near_cache"]) if "near_cache" in query else size is not None
    if not enabled:
        return None
    return NearCacheOptions(max_rooms=STORE_OPTIONS["near_cache_size"](size)) if size is not None else True


def make_near_cache(setting: Any, client: Any, schema: KeySchema, resend_delays: Sequence[float],
                    metrics: Any = None) -> Any:
    """The cache object for a store: None (``setting`` None/False), a shared cache object as given (with its own
    observer), or a new one (``setting`` True or :class:`NearCacheOptions`) told of its work by ``metrics``."""
    if setting is None or setting is False:
        return None
    if isinstance(setting, (NearCache, AsyncNearCache)):
        return setting
    if setting is not True and not isinstance(setting, NearCacheOptions):
        raise InvalidArgumentError(f"invalid near_cache {setting!r}: expected True, False or NearCacheOptions")
    if type(client).__module__.startswith("fakeredis"):
        raise InvalidArgumentError("the near cache needs a real Redis (CLIENT TRACKING); fakeredis has none")
    options = setting if isinstance(setting, NearCacheOptions) else NearCacheOptions()
    return near_cache_for(client, schema, options, resend_delays or (0.05, 0.1, 0.2, 0.4, 0.8), metrics)
