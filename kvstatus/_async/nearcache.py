"""The near cache's driver: serves reads from :class:`~kvstatus.cachestate.CacheState`, fills misses through the
store's send path on links Redis tracks (docs/design.md, "How the near cache stays coherent"), and reports to the
observer of the store that turned it on (its ``for_participant`` stores share it, under that store's labels)."""

from __future__ import annotations

import contextlib
import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Optional, Protocol, cast

from redis import exceptions as rx

from kvstatus._async.sender import AsyncSender
from kvstatus.cachestate import (
    MISS,
    CachedRoom,
    CacheState,
    NearCacheBase,
    NearCacheOptions,
    Reader,
    register,
    status_for,
    view_at,
)
from kvstatus.concurrency import (
    BROKEN,
    AsyncLock,
    async_close_link,
    async_closed_links,
    async_data_fd,
    async_run_blocking,
    async_start_reader,
)
from kvstatus.connection import SlotFingerprint, SlotMoved, Topology, slot_fingerprint
from kvstatus.errors import KVStatusError, PermissionDeniedError
from kvstatus.invalidation import (
    InvalidationSocket,
    LinkLost,
    LinkReader,
    Links,
    LinkState,
    peer_of,
    sync_twin,
)
from kvstatus.keys import KeySchema, room_batch, validate_room
from kvstatus.model import KVPoll, RoomView
from kvstatus.replies import Reply, ReplyOrError
from kvstatus.requests import Arg, Call, Request
from kvstatus.translate import connection_refused

if TYPE_CHECKING:
    from kvstatus.backend import AsyncClient

log = logging.getLogger("kvstatus.nearcache")
MARKER_TTL_MS = 86_400_000
"""The database marker's TTL: it is made again when it expires (one emptied cache a day at most)."""


class AsyncLinkConnection(Protocol):
    """A link's data connection (a redis-py connection out of its client's pool): what the cache sends on it."""

    def pack_commands(self, commands: Iterable[Iterable[Arg]]) -> list[bytes]: ...

    async def send_packed_command(self, command: list[bytes], check_health: bool = True) -> None: ...

    async def read_response(self, *, disconnect_on_error: bool = True) -> Reply: ...


class AsyncNearCache(NearCacheBase):
    """The near cache of one namespace (safe to share between the stores of one client): reads answer from
    memory while every link is live; a miss is read through ``sender``, the store's send path, and cached."""

    def __init__(self, client: AsyncClient, schema: KeySchema, options: NearCacheOptions, sender: AsyncSender) -> None:
        self.topology = Topology(client)
        self.state = CacheState(schema, options)
        self.links = Links(self.state, async_close_link)
        self.sender = sender
        self.metrics = self.state.metrics = sender.metrics
        self._lock = threading.Lock()  # guards the state; never held across I/O
        self._io_lock = AsyncLock()  # one fill or check at a time on the links' connections
        self._probe = self.topology.probe_command()
        # SWAPDB sends no invalidation (Redis 7.0): a single server's cache watches a marker of its database.
        self._marker_key = None if self.topology.cluster else schema.database_marker_key
        self._marker: Optional[bytes] = None
        self._fingerprint: Optional[SlotFingerprint] = None
        self._next_check = 0.0
        self.closed = False
        register(self)
        self.refused: Optional[str] = None
        """Why the server refused to track this cache's reads (NOPERM ...): it then runs uncached, keeping nothing."""
        self._watched = False  # a wait watches here: each link's socket is read as soon as it is readable

    # ---- the hot path

    async def _now(self) -> float:
        """``time.monotonic()``, after the topology check if it is due."""
        now = time.monotonic()
        if now >= self._next_check:
            await self._check_topology(now)
        return now

    def _ready(self, now: float) -> bool:
        """Under the lock: apply invalidations, expire, and say whether cached rooms may be served."""
        links = self.links
        for name in async_closed_links(links.links):
            links.drop_links([name], f"data connection of {name or 'server'} closed")
        links.poll(now)
        state = self.state
        if now >= state.earliest_deadline:
            state.expire(now)
        if now < links.live_until:
            state.served(now, links.live_until, self._next_check)
            return True
        state.fresh.until = 0.0
        return False

    async def status(self, room: int, reader: Reader, operation: str = "get") -> Optional[KVPoll]:
        """``reader``'s status in a validated ``room``, or None."""
        now = await self._now()
        with self._lock:
            if self._ready(now):
                status = self.state.flat(reader).get(room, MISS)
                if status is not MISS:
                    if self.state.marking:
                        self.state.referenced.add(room)
                    if self.metrics is not None:
                        self.metrics.on_cache_hit()
                    return status  # type: ignore[no-any-return]
        return status_for((await self._fill([room], operation))[room], reader)

    async def statuses(self, rooms: list[int], reader: Reader) -> dict[int, Optional[KVPoll]]:
        """``reader``'s status in each of the validated, distinct ``rooms``."""
        now = await self._now()
        result: dict[int, Optional[KVPoll]] = {}
        misses = rooms
        with self._lock:
            if self._ready(now):
                flat = self.state.flat(reader)
                misses = []
                for room in rooms:
                    status = flat.get(room, MISS)
                    if status is MISS:
                        misses.append(room)
                    else:
                        result[room] = status
                self.state.referenced.update(result)
        if result and self.metrics is not None:
            self.metrics.on_cache_hit(len(result))
        if not misses:
            return result
        for room, entry in (await self._fill(misses, "get_many")).items():
            result[room] = status_for(entry, reader)
        return {room: result[room] for room in rooms}

    def status_map(self, reader: Reader) -> dict[int, Optional[KVPoll]]:
        """``reader``'s status map, to serve while ``state.fresh`` says so (:class:`~kvstatus.cachestate.Freshness`)."""
        with self._lock:
            return self.state.flat(reader)

    def invalidate(self, rooms: Iterable[int]) -> None:
        """Drop ``rooms``: call after this process wrote them, before returning to its caller."""
        with self._lock:
            self.state.invalidate(rooms)

    @property
    def tracking(self) -> bool:
        """Whether Redis tracks this cache's reads: not refused, and not closed (no link is opened again then)."""
        return self.refused is None and not self.closed

    def watch(self, room: int, wake: Callable[[], None]) -> bool:
        """Call ``wake()`` at each change Redis reports of the validated ``room``, or flush, until :meth:`unwatch`
        (the next read of the room through this cache arms it); False if the cache is refused or closed."""
        if not self.tracking:
            return False
        with self._lock:
            self.state.wait_on(room, wake)
            if not self._watched:
                self._watched = True
                for link in self.links.links.values():
                    self._start_reader(link)
        return True

    def unwatch(self, room: int, wake: Callable[[], None]) -> None:
        with self._lock:
            self.state.stop_waiting(room, wake)

    def _start_reader(self, link: LinkState) -> None:
        """Under the lock: read ``link``'s invalidations as they arrive, not only at the next read."""
        if link.reader is None:
            link.reader = LinkReader(link.inval, self._drain)
            async_start_reader(link.reader)

    def _drain(self) -> None:
        with self._lock:
            self._ready(time.monotonic())

    async def get(self, room: int, reader: Reader) -> Optional[KVPoll]:
        return await self.status(validate_room(room), reader)

    async def check_status(self, room: int, reader: Reader) -> KVPoll:
        status = await self.status(validate_room(room), reader, "check_status")
        if status is None:
            raise KeyError(room)
        return status

    async def get_many(self, rooms: Iterable[int], reader: Reader) -> dict[int, Optional[KVPoll]]:
        if type(rooms) is list or type(rooms) is tuple:  # the hot path: every room cached
            now = await self._now()
            with self._lock:
                found = self.state.hits(rooms, reader) if self._ready(now) else None
            if found is not None:
                if self.metrics is not None:
                    self.metrics.on_cache_hit(len(rooms))
                return found
        unique = list(dict.fromkeys(room_batch(rooms, "get_many")))  # the store's checks, each room once
        return await self.statuses(unique, reader) if unique else {}

    async def room(self, room: int) -> RoomView:
        """Every participant's entry in ``room``, TTL counted down locally."""
        room = validate_room(room)
        now = await self._now()
        with self._lock:
            if self._ready(now):
                entry = self.state.entries.get(room)
                if entry is not None:
                    self.state.referenced.add(room)
                    if self.metrics is not None:
                        self.metrics.on_cache_hit()
                    return view_at(room, entry, now)
        return view_at(room, (await self._fill([room], "room"))[room], time.monotonic())

    async def _fill(self, rooms: list[int], operation: str) -> dict[int, CachedRoom]:
        """Read ``rooms`` from Redis and cache them (unless an invalidation raced the read)."""
        if self.metrics is not None:
            self.metrics.on_cache_miss(len(rooms))
        keys = self.state.schema.room_keys(rooms)
        request = Request([Call((command, key)) for key in keys for command in ("HGETALL", "PTTL")], list)
        if self.tracking:
            fill = AsyncLinkTransport(self)
            try:
                replies = await self.sender.send(request, operation, via=fill)
            except PermissionDeniedError:
                if self.refused is None:
                    raise
            else:
                filled = self.state.decode_fill(rooms, keys, replies, fill.sent_at)
                with self._lock:
                    self.links.poll(time.monotonic())  # invalidations that raced the read arrive before it is stored
                    self.state.store(fill.token, filled)
                return filled
        # Uncached (refused, or closed): the same reads on the client's own connections, kept nowhere.
        replies = await self.sender.send(request, operation)
        return self.state.decode_fill(rooms, keys, replies, time.monotonic())

    async def _open_link(self, name: str) -> None:
        """Under the I/O lock: connect the invalidation and the data connection of node ``name``."""
        data = self.topology.new_data_connection(name)
        inval: Optional[InvalidationSocket] = None
        try:
            await data.connect()
            # Its twin after the connect: a Sentinel-managed connection learns the master's address as it connects.
            inval = InvalidationSocket(sync_twin(data))
            await async_run_blocking(inval.open, inval.close)  # cancelled: closed once the open ends
            if peer_of(data) != inval.peer:
                raise LinkLost("the data and invalidation connections reached different servers")
            bcast = ("BCAST", "PREFIX", self.state.schema.base) if self.state.options.bcast else ()
            await data.send_command("CLIENT", "TRACKING", "ON", "REDIRECT", inval.client_id, *bcast)
            reply = await data.read_response()
            if reply not in (b"OK", "OK"):
                raise LinkLost(f"CLIENT TRACKING answered {reply!r}")
            if self.topology.cluster and self._fingerprint is None:
                await data.send_command("CLUSTER", "SLOTS", check_health=False)
                self._fingerprint = slot_fingerprint(await data.read_response())
            if self._marker_key is not None:
                self._marker = await self._mark_database(data, self._marker_key)
        except BaseException:
            await data.disconnect()
            if inval is not None:
                inval.close()
            raise
        with self._lock:
            # A new link means a new (or reconnected) server: nothing read before can be trusted.
            self.state.flush(f"link to {name or 'server'} opened")
            link = LinkState(name, inval, data, async_data_fd(data), time.monotonic())
            self.links.add_link(link)
            if self._watched:
                self._start_reader(link)

    @staticmethod
    async def _mark_database(data: AsyncLinkConnection, key: str) -> Optional[bytes]:
        """The database's marker id, created if missing (a random id, one day's TTL); None when this user may
        not write it (a read-only user: SWAPDB then goes unnoticed, see the near cache's docs)."""
        token = secrets.token_hex(8)
        commands = (("HSETNX", key, "id", token), ("PEXPIRE", key, MARKER_TTL_MS, "NX"), ("HGET", key, "id"))
        await data.send_packed_command(data.pack_commands(commands), check_health=False)
        replies: list[ReplyOrError] = []
        for _ in range(3):
            try:
                replies.append(await data.read_response())
            except rx.ResponseError as exc:
                replies.append(exc)
        marker = replies[2]
        return marker if isinstance(marker, bytes) and not isinstance(replies[0], Exception) else None

    async def _check_topology(self, now: float) -> None:
        """Every ``max_staleness`` seconds, one round trip: empty the cache if the slot map changed, a Sentinel-managed
        server is no longer the master, the database marker changed (``SWAPDB``), or the check failed."""
        self._next_check = now + self.state.options.max_staleness
        marker_key = self._marker_key if self._marker is not None else None
        reads = [self._probe, ("HGET", marker_key, "id") if marker_key is not None else None]
        calls = [Call(command) for command in reads if command is not None]
        if not calls or not self.links.links:
            return
        try:
            replies = await self.sender.send(Request(calls, list), "topology", via=AsyncLinkTransport(self, probe=True))
        except KVStatusError as exc:
            self._reset_links(f"topology check failed: {exc}")
            if time.monotonic() >= now + self.sender.deadline:
                raise  # the deadline is spent: the read fails now, as a plain read would, not after a fill's deadline
            return
        if marker_key is not None and replies[-1] != self._marker:
            self._reset_links("another database is under the cache (SWAPDB), or it was flushed")
            self._marker = None
            return
        if self._probe is not None:
            reason, self._fingerprint = self.topology.probe_changed(replies[0], self._fingerprint)
            if reason:
                await self._reset_topology(reason)

    async def check(self) -> None:
        """Poll once: apply invalidations, check the topology if due (tests, benchmarks)."""
        await self._now()
        self._drain()

    def _reset_links(self, reason: str) -> None:
        with self._lock:
            self.links.drop_links(self.links.links, reason)  # one flush, however many links

    async def _reset_topology(self, reason: str) -> None:
        self._reset_links(reason)
        self._fingerprint = None
        if self.topology.cluster:
            with contextlib.suppress(rx.RedisError):  # the next read reports it
                await self.topology.client.nodes_manager.initialize()

    async def close(self) -> None:
        self.shut()

    def shut(self) -> None:
        """:meth:`close` without awaiting (from any thread): the links close and the waits on them wake."""
        self._reset_links("closed")
        self.closed = True


class AsyncLinkTransport:
    """The near cache's transport (:class:`~kvstatus._async.sender.AsyncTransport`) for one fill or check, pipelined
    per node; a broken link or a moved slot empties the cache and answers a connection error (resent)."""

    def __init__(self, cache: AsyncNearCache, probe: bool = False) -> None:
        self.cache = cache
        self.probe = probe
        self.resend_delays = () if probe else cache.sender.options.retry_delays()
        self.token = (0, 0)
        self.sent_at = 0.0

    async def io(self, calls: list[Call]) -> list[ReplyOrError]:
        cache = self.cache
        try:
            async with cache._io_lock:
                links = cache.links.links
                if self.probe:
                    groups = {next(iter(links), ""): list(range(len(calls)))} if links else {}
                else:
                    groups = cache.topology.group([call.args[1] for call in calls])
                    for name in groups:
                        if name not in links:
                            if cache.closed:  # shut during this fill: open nothing that nobody would close
                                raise LinkLost("the near cache was closed")
                            await cache._open_link(name)
                if not groups:
                    raise LinkLost("the near cache has no link")
                with cache._lock:
                    self.token = cache.state.token()
                conns = {name: cast(AsyncLinkConnection, cache.links.data(name)) for name in groups}
                self.sent_at = time.monotonic()
                cache.links.reads += 1
                cache.links.busy = True
                try:
                    for name, indices in groups.items():
                        packed = conns[name].pack_commands([calls[i].args for i in indices])
                        await conns[name].send_packed_command(packed, check_health=False)
                    replies: list[ReplyOrError] = [None] * len(calls)
                    for name, indices in groups.items():
                        conn = conns[name]
                        for i in indices:
                            try:
                                replies[i] = await conn.read_response(disconnect_on_error=True)
                            except rx.ResponseError as exc:
                                replies[i] = exc
                except BaseException:
                    # Cancelled or failed between a send and its last reply: an unread reply would answer the next fill.
                    cache._reset_links("a read was interrupted")
                    raise
                finally:
                    cache.links.busy = False
                for reply in replies:
                    if isinstance(reply, rx.ResponseError) and str(reply).startswith(("MOVED", "ASK")):
                        raise SlotMoved(str(reply))
        except SlotMoved as exc:
            await cache._reset_topology(str(exc))
            return [rx.ConnectionError(f"the near cache's read met a moved slot: {exc}")] * len(calls)
        except (LinkLost, *BROKEN) as exc:
            cache._reset_links(f"read failed: {exc}")
            standalone = not (cache.topology.cluster or cache.topology.sentinel)
            # No resend, said as it is: the credentials (not the link), or a standalone server refusing connections.
            if isinstance(exc, rx.AuthenticationError) or (connection_refused(exc) and standalone):
                self.resend_delays = ()
                return [exc] * len(calls)
            return [rx.ConnectionError(f"the near cache's connection failed: {exc}")] * len(calls)
        except rx.NoPermissionError as exc:  # the ACL refuses tracking (CLIENT TRACKING, CLIENT ID, HELLO 3)
            cache.refused = str(exc)  # said once: the cache runs uncached from now on
            log.warning(
                "kvstatus near cache (namespace %s): the server refused to track reads (%s); reads run "
                "uncached. Grant +client|tracking +client|id (the ACL recipe with its near cache), or turn "
                "the near cache off",
                cache.state.schema.namespace,
                exc,
            )
            return [exc] * len(calls)
        except rx.RedisError as exc:  # another refusal while opening a link
            return [exc] * len(calls)
        return replies

    async def reset(self) -> None:
        """Nothing to do before a resend: a failed link was already dropped, and is reopened by the next read."""

    async def load(self, source: str) -> None:
        """The near cache sends no scripts."""
