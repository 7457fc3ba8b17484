"""The near cache's invalidation reader: per server a RESP3 connection Redis pushes invalidations to, read without
blocking, and the liveness PINGs. docs/design.md ("How the near cache stays coherent")."""

from __future__ import annotations

import contextlib
import select
import ssl
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Callable, Optional

import hiredis
import redis

from kvstatus.connection import connection_class

if TYPE_CHECKING:  # the state is handed in: the reader feeds it, and runs without importing it
    from kvstatus.cachestate import CacheState

_PING = b"*1\r\n$4\r\nPING\r\n"
_RECV = 65536
_WOULD_BLOCK = (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError, InterruptedError)


class LinkLost(Exception):
    """A connection of a link failed or closed; the cache was emptied."""


def peer_of(connection: object) -> object:
    """The address a connected redis-py connection (sync or async) talks to (INFO's run_id needs a permission the
    tenant ACL recipe does not grant)."""
    sock = getattr(connection, "_sock", None)
    if sock is not None:
        return sock.getpeername()
    writer = getattr(connection, "_writer", None)
    if writer is None:
        raise LinkLost("the connection is not connected")
    return writer.get_extra_info("peername")


class InvalidationSocket:
    """The invalidation connection of one server (sync and async caches): ``open`` runs redis-py's blocking RESP3
    handshake and ``CLIENT ID``, then only :meth:`drain` and :meth:`ping` touch the non-blocking socket. It
    subscribes to nothing (invalidations are push messages), so no ``PUBLISH`` can inject one."""

    def __init__(self, connection: Any) -> None:
        self.connection = connection
        self.client_id = 0
        self.peer: object = None
        self.sock: Any = None
        self.reader = hiredis.Reader()

    def open(self) -> None:
        conn = self.connection
        conn.connect()
        conn.send_command("CLIENT", "ID")  # the REDIRECT target
        self.client_id = int(conn.read_response())
        self.peer = peer_of(conn)
        self.sock = conn._sock  # redis-py's handshake is done; this socket is ours from here on
        self.sock.setblocking(False)

    def fileno(self) -> int:
        return int(self.sock.fileno())

    def drain(self) -> tuple[list[bytes], bool, bool]:
        """What arrived, read without blocking: (invalidated keys, flush all?, a PONG arrived?); raises LinkLost."""
        sock, reader = self.sock, self.reader
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
            if not isinstance(message, list):  # the answer to a PING: +PONG
                pong = pong or message == b"PONG"
                continue
            payload = message[-1] if message and message[0] == b"invalidate" else None
            if isinstance(payload, list) and all(isinstance(key, bytes) for key in payload):
                keys.extend(payload)
            else:  # None (FLUSHALL, tracking table full), or a frame this reader does not understand
                flush = True

    def ping(self) -> bool:
        """Send a PING without blocking; False if the socket would block (try again later). Raises LinkLost."""
        try:
            sent = self.sock.send(_PING)
        except _WOULD_BLOCK:
            return False
        except OSError as exc:
            raise LinkLost(f"connection failed: {exc}") from exc
        if sent != len(_PING):  # a partial command would corrupt the stream; give the connection up
            raise LinkLost("connection send buffer full")
        return True

    def close(self) -> None:
        with contextlib.suppress(Exception):  # closing a broken connection must not raise
            self.connection.disconnect()


def sync_twin(conn: Any) -> redis.Connection:
    """A new blocking redis-py connection to the server of ``conn`` (sync or async), with the same credentials,
    database and TLS settings, whose waits end by the running call's deadline."""
    copied = ("username", "password", "socket_timeout", "socket_connect_timeout", "client_name", "credential_provider")
    common: dict[str, Any] = {name: getattr(conn, name, None) for name in copied}
    common["db"] = getattr(conn, "db", 0)
    common["protocol"] = 3  # invalidations arrive as push messages, without a channel
    path = getattr(conn, "path", None)
    context = getattr(conn, "ssl_context", None)  # redis.asyncio's SSLConnection
    if path:
        made: redis.Connection = connection_class(redis.UnixDomainSocketConnection, False)(path=path, **common)
    elif context is not None or isinstance(conn, redis.SSLConnection):
        tls_source = context if context is not None else conn
        made = connection_class(redis.SSLConnection, True)(
            host=conn.host,
            port=conn.port,
            **common,
            ssl_keyfile=getattr(tls_source, "keyfile", None),
            ssl_certfile=getattr(tls_source, "certfile", None),
            ssl_cert_reqs=getattr(tls_source, "cert_reqs", "required"),
            ssl_ca_certs=getattr(tls_source, "ca_certs", None),
            ssl_check_hostname=getattr(tls_source, "check_hostname", False),
        )
    else:
        made = connection_class(redis.Connection, False)(host=conn.host, port=conn.port, **common)
    return made


class LinkState:
    """Liveness bookkeeping of one link (times are ``time.monotonic()`` seconds)."""

    __slots__ = ("name", "inval", "data", "data_fd", "confirmed", "ping_outstanding", "reader")

    def __init__(self, name: str, inval: InvalidationSocket, data: Any, data_fd: Optional[int], now: float) -> None:
        self.name = name
        self.inval = inval
        self.data = data
        self.data_fd = data_fd  # sync only: polled for an unexpected close
        self.confirmed = now  # the link was opened, or the last PING answered, at this time
        self.ping_outstanding: Optional[float] = None
        self.reader: Optional[LinkReader] = None


class LinkReader:
    """Drains a link's invalidation socket as soon as it is readable, for ``wait_for``: the event loop or a thread
    (:func:`kvstatus.concurrency.async_start_reader`) calls ``on_readable``; ``on_close`` stops it."""

    def __init__(self, inval: InvalidationSocket, drain: Callable[[], None]) -> None:
        self.inval = inval
        self.on_readable = drain
        self.on_close: Optional[Callable[[], None]] = None

    def fileno(self) -> int:
        return self.inval.fileno()

    def close(self) -> None:
        stop, self.on_close = self.on_close, None
        if stop is not None:
            stop()


class Links:
    """The links of one near cache (one per server), which :meth:`poll` reads into its
    :class:`~kvstatus.cachestate.CacheState`; ``live_until``: the monotonic time until which it may serve."""

    def __init__(self, state: CacheState, close_data: Callable[..., None]) -> None:
        self.state = state
        self._close_data = close_data  # closes a data connection without awaiting (it may be asyncio's)
        self.links: dict[str, LinkState] = {}
        self._poller = select.poll()
        self._fds: dict[int, tuple[LinkState, bool]] = {}
        self.live_until = 0.0
        self.next_ping = 0.0
        self.busy = False
        """True while a read is on the data connections (set under the I/O lock): :meth:`poll` must then not take
        a readable data connection (a reply arriving) for a closed one."""
        self.reads = 0
        """Reads begun on the data connections: one begun and ended during :meth:`poll` changes this, not ``busy``."""

    def add_link(self, link: LinkState) -> None:
        self.links[link.name] = link
        for fd, is_inval in ((link.inval.fileno(), True), (link.data_fd, False)):
            if fd is not None:
                self._fds[fd] = (link, is_inval)
                self._poller.register(fd, select.POLLIN | select.POLLPRI)
        self._update_live()

    def data(self, name: str) -> object:
        """The data connection of link ``name``; :class:`LinkLost` when it was dropped meanwhile."""
        link = self.links.get(name)
        if link is None:
            raise LinkLost(f"the near cache's link to {name or 'the server'} was dropped")
        return link.data

    def drop_links(self, names: Iterable[str], reason: str) -> None:
        """Forget the links ``names``, close their connections, and empty the cache (once)."""
        for link in [self.links.pop(name) for name in list(names) if name in self.links]:
            for fd, (owner, _) in list(self._fds.items()):
                if owner is link:
                    del self._fds[fd]
                    with contextlib.suppress(KeyError, ValueError):
                        self._poller.unregister(fd)
            if link.reader is not None:
                link.reader.close()  # before the socket: its descriptor may be reused at once
            link.inval.close()
            self._close_data(link.data)
        self.state.flush(reason)
        self._update_live()

    def _update_live(self) -> None:
        confirmed = [link.confirmed for link in self.links.values()]
        self.live_until = min(confirmed) + self.state.options.max_staleness if confirmed else 0.0

    def poll(self, now: float) -> None:
        """Apply what arrived on the invalidation sockets, send due PINGs, and drop (and close) failed links."""
        broken: list[str] = []
        reads, busy = self.reads, self.busy
        for fd, _ in self._poller.poll(0):
            link, is_inval = self._fds.get(fd, (None, False))
            if link is None or link.name in broken:
                continue
            if not is_inval:
                # The data connection has nothing to say unless it closed, or a read of another thread is on it
                # (busy now or before the poll, or one began and ended meanwhile).
                if not (busy or self.busy or self.reads != reads):
                    broken.append(link.name)
                continue
            try:
                keys, flush, pong = link.inval.drain()
            except LinkLost:
                broken.append(link.name)
                continue
            if flush:
                self.state.invalidate_all()
            elif keys:
                self.state.apply(keys)
            if pong and link.ping_outstanding is not None:
                link.confirmed = link.ping_outstanding
                link.ping_outstanding = None
                self._update_live()
        if now >= self.next_ping:
            self.next_ping = now + self.state.options.max_staleness / 4
            for link in self.links.values():
                if link.ping_outstanding is None:
                    try:
                        if link.inval.ping():
                            link.ping_outstanding = now
                    except LinkLost:
                        broken.append(link.name)
                elif now - link.ping_outstanding > max(5.0, 4 * self.state.options.max_staleness):
                    broken.append(link.name)  # no answer at all: a dead peer that sent no FIN
        for name in dict.fromkeys(broken):  # a link may fail two ways in one poll: dropped once
            self.drop_links([name], f"connection of {name or 'server'} lost")
