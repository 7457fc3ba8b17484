"""The few things that really differ between the sync and the async I/O, each as a pair of names: tools/unasync.py
maps each ``Async*`` / ``async_*`` name of kvstatus/_async/ to its twin here to write kvstatus/_sync/."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
import select
import socket
import threading
import time
from collections.abc import Awaitable, Mapping
from typing import Callable, Optional, Protocol, TypeVar

import redis.asyncio.connection
import redis.connection
import redis.exceptions as rx

AsyncLock = asyncio.Lock
Lock = threading.Lock

async_sleep = asyncio.sleep
sleep = time.sleep

AsyncRedisConnection = redis.asyncio.connection.AbstractConnection
RedisConnection = redis.connection.AbstractConnection
"""A redis-py connection, asyncio or blocking (a presence holds its subscription on one, outside the pool)."""

BROKEN = (rx.ConnectionError, rx.TimeoutError, OSError, EOFError)
"""What a broken connection raises, sync or async."""
_T = TypeVar("_T")


class _Reader(Protocol):
    """What :func:`start_reader` watches: a socket's owner that reads what arrives (a near cache's link)."""

    on_close: Optional[Callable[[], None]]

    def fileno(self) -> int: ...

    def on_readable(self) -> None: ...


class _Link(Protocol):
    """A near cache link (``kvstatus.invalidation.LinkState``): its data connection."""

    @property
    def data(self) -> object: ...


class _SyncConnection(Protocol):
    """A redis-py sync connection, for the one (unannotated) method used here."""

    def disconnect(self) -> object: ...


class _Connected(Protocol):
    """A connected redis-py sync connection (redis-py types ``_sock`` as None, its value before ``connect()``)."""

    @property
    def _sock(self) -> socket.socket: ...


class _KeyRouter(Protocol):
    """redis-py's sync RedisCluster, for the one (unannotated) method used here."""

    def get_node_from_key(self, key: str) -> object: ...


def _settle(future: asyncio.Future[_T], value: _T) -> None:
    if not future.done():
        future.set_result(value)


def _running_loop() -> Optional[asyncio.AbstractEventLoop]:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


async def async_wait_future(future: asyncio.Future[_T], seconds: float, expired: _T) -> _T:
    """``future``'s result, or ``expired`` once ``seconds`` (inf: no limit) passed first. Unlike ``asyncio.wait_for``
    (up to Python 3.11), a cancel always raises, and cancels the future unless it was done."""
    timer = None
    if not math.isinf(seconds):
        timer = asyncio.get_running_loop().call_later(max(seconds, 0.0), _settle, future, expired)
    try:
        return await future
    finally:
        if timer is not None:
            timer.cancel()


async def async_wait_turn(
    waiters: collections.deque[asyncio.Future[bool]], seconds: float, pass_on: Callable[[], object]
) -> bool:
    """Queue on ``waiters``, first come first served: True once woken (:func:`wake_first`), False after ``seconds``.
    A waiter cancelled as it was woken calls ``pass_on``: no wake-up is ever lost."""
    turn: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
    waiters.append(turn)
    try:
        return await async_wait_future(turn, seconds, False)
    except BaseException:
        if turn.done() and not turn.cancelled() and turn.result():
            pass_on()
        raise
    finally:
        if turn in waiters:
            waiters.remove(turn)


def wake_first(waiters: collections.deque[asyncio.Future[bool]]) -> bool:
    """Wake the first of ``waiters`` still waiting (not timed out, not cancelled); False if there is none."""
    while waiters:
        turn = waiters.popleft()
        if not turn.done():
            turn.set_result(True)
            return True
    return False


class AsyncGate:
    """Admits at most ``limit`` calls at a time; the others wait up to their timeout, first come first served
    (asyncio). A waiter cancelled as it was admitted passes its turn on: no admission is ever lost."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._free = limit
        self._waiters: collections.deque[asyncio.Future[bool]] = collections.deque()

    async def acquire(self, timeout: float) -> bool:
        """True once admitted; False if ``timeout`` seconds passed first."""
        if self._free > 0 and not self._waiters:
            self._free -= 1
            return True
        return await async_wait_turn(self._waiters, timeout, self.release)

    def release(self) -> None:
        if not wake_first(self._waiters):
            self._free += 1


class Gate:
    """:class:`AsyncGate` for threads."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._semaphore = threading.BoundedSemaphore(limit)

    def acquire(self, timeout: float) -> bool:
        return self._semaphore.acquire(timeout=max(0.0, timeout))

    def release(self) -> None:
        self._semaphore.release()


class AsyncBackground:
    """Work that runs beside its owner until :meth:`stop`: an asyncio task."""

    def __init__(self) -> None:
        self._task: Optional[asyncio.Task[None]] = None
        self._stopped = False

    @property
    def started(self) -> bool:
        return self._task is not None

    def start(self, work: Callable[[], Awaitable[None]], name: str) -> None:
        self._task = asyncio.get_running_loop().create_task(work(), name=name)  # type: ignore[arg-type]

    async def wait(self, seconds: float) -> bool:
        """Sleep ``seconds``; True if the work should stop."""
        await asyncio.sleep(seconds)
        return self._stopped

    async def stop(self) -> None:
        self._stopped = True
        task, self._task = self._task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            # asyncio.wait, not ``await task``: the work's own end (cancelled, or an error the work logged) is not
            # raised here, so a CancelledError out of this await is always a cancel of the caller, and propagates.
            await asyncio.wait((task,))
            if not task.cancelled():
                task.exception()  # retrieved: its errors were logged by the work


class Background:
    """:class:`AsyncBackground` as a daemon thread."""

    def __init__(self) -> None:
        self._thread: Optional[threading.Thread] = None
        self._stop = threading.Event()

    @property
    def started(self) -> bool:
        return self._thread is not None

    def start(self, work: Callable[[], None], name: str) -> None:
        self._thread = threading.Thread(target=work, daemon=True, name=name)
        self._thread.start()

    def wait(self, seconds: float) -> bool:
        return self._stop.wait(seconds)

    def stop(self) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(5.0)


async def async_run_blocking(work: Callable[[], _T], undo: Optional[Callable[[], None]] = None) -> _T:
    """Run a short blocking call (a bounded handshake) off the event loop. A cancel of the caller raises at once;
    the thread cannot be stopped, so ``undo`` (closing what ``work`` opens) runs once it has ended, whatever it did."""
    running = asyncio.ensure_future(asyncio.to_thread(work))
    try:
        return await asyncio.shield(running)
    except asyncio.CancelledError:
        running.add_done_callback(lambda ended: _undo(ended, undo))
        raise


def _undo(ended: asyncio.Future[_T], undo: Optional[Callable[[], None]]) -> None:
    if not ended.cancelled():
        ended.exception()  # retrieved: the caller is gone
    if undo is not None:
        undo()


def run_blocking(work: Callable[[], _T], undo: Optional[Callable[[], None]] = None) -> _T:
    return work()


def async_pipeline_route(client: object, key: str) -> dict[str, object]:
    """Keyword arguments that send a pipelined script call straight to its node: none for redis.asyncio,
    whose cluster pipeline finds an EVALSHA's slot itself."""
    return {}


def pipeline_route(client: _KeyRouter, key: str) -> dict[str, object]:
    """redis-py's sync cluster pipeline would ask a node COMMAND GETKEYS for every script call."""
    return {"target_nodes": client.get_node_from_key(key)}


def readable(source: _Reader, seconds: float) -> bool:
    poller = select.poll()  # not select.select(): a busy process has descriptors above 1024
    poller.register(source.fileno(), select.POLLIN | select.POLLPRI)
    return bool(poller.poll(math.ceil(max(seconds, 0.0) * 1000)))


async def async_pending(connection: AsyncRedisConnection) -> bool:
    """Whether a connected redis.asyncio connection has a reply or a push to read now (raises once it closed)."""
    check = getattr(connection, "can_read", None) or connection.can_read_destructive  # redis-py < 8
    return bool(await check())


def pending(connection: RedisConnection) -> bool:
    return bool(connection.can_read(timeout=0))


def async_close_link(connection: AsyncRedisConnection) -> None:
    """Close an asyncio connection without awaiting (from the synchronous read path of the near cache)."""
    writer = getattr(connection, "_writer", None)
    if writer is not None:
        with contextlib.suppress(Exception):  # closing a broken connection must not raise
            writer.close()
    connection._reader = connection._writer = None


def close_link(connection: _SyncConnection) -> None:
    with contextlib.suppress(Exception):
        connection.disconnect()


def async_data_fd(connection: object) -> Optional[int]:
    """The socket the near cache polls to notice a closed data connection: none for asyncio
    (:func:`async_closed_links` checks its reader instead)."""
    return None


def data_fd(connection: _Connected) -> Optional[int]:
    return int(connection._sock.fileno())


def async_closed_links(links: Mapping[str, _Link]) -> list[str]:
    """Names of the near cache's links whose asyncio data connection has ended (checked on every read)."""
    readers = {name: getattr(link.data, "_reader", None) for name, link in links.items()}
    return [name for name, reader in readers.items() if reader is None or reader.at_eof()]


def closed_links(links: Mapping[str, _Link]) -> tuple[str, ...]:
    """Sync data connections are polled through their socket (:func:`data_fd`) instead."""
    return ()


class AsyncSignal:
    """A wake-up a waiting task sleeps on (asyncio), set from the event loop or from another thread."""

    def __init__(self) -> None:
        self._set = False
        self._future: Optional[asyncio.Future[bool]] = None

    def set(self) -> None:
        self._set = True
        future = self._future
        if future is not None and not future.done():
            loop = future.get_loop()
            if _running_loop() is loop:
                future.set_result(True)
            elif not loop.is_closed():  # from another thread: a sync caller that closed what the task waits on
                loop.call_soon_threadsafe(_settle, future, True)

    def clear(self) -> None:
        self._set = False

    async def wait(self, seconds: float) -> None:
        """Until set (at once if it is) or ``seconds`` passed; a cancel of the caller always raises."""
        if self._set:
            return
        self._future = asyncio.get_running_loop().create_future()
        try:
            await async_wait_future(self._future, seconds, False)
        finally:
            self._future = None


class Signal:
    """:class:`AsyncSignal` for threads."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def set(self) -> None:
        self._event.set()

    def clear(self) -> None:
        self._event.clear()

    def wait(self, seconds: float) -> None:
        self._event.wait(None if math.isinf(seconds) else max(seconds, 0.0))


def async_start_reader(source: _Reader) -> None:
    """Call ``source.on_readable()`` from the running loop whenever ``source`` has something to read, until
    ``source.on_close`` is called (it is set here)."""
    loop = asyncio.get_running_loop()
    fd = source.fileno()
    loop.add_reader(fd, source.on_readable)

    def remove() -> None:
        if loop.is_closed():
            return
        if _running_loop() is loop:
            loop.remove_reader(fd)
        else:  # closed from another thread (a sync caller of the pool's close)
            loop.call_soon_threadsafe(loop.remove_reader, fd)

    source.on_close = remove


def start_reader(source: _Reader) -> None:
    """:func:`async_start_reader` for threads: a daemon thread polls ``source`` until ``on_close``."""
    stopped = threading.Event()
    source.on_close = stopped.set

    def run() -> None:
        while not stopped.is_set():
            try:
                if readable(source, 0.5) and not stopped.is_set():
                    source.on_readable()
            except (OSError, ValueError):  # closed under the poll
                return

    threading.Thread(target=run, daemon=True, name="kvstatus-watch").start()


def async_checkpoint() -> None:
    """Raise ``CancelledError`` if the running task was asked to cancel and redis-py's ``asyncio.wait_for`` swallowed
    it (``Task.cancelling()``, 3.11+; on Python 3.10 it lands at the task's next await instead)."""
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)
    if cancelling is not None and cancelling():
        raise asyncio.CancelledError()


def checkpoint() -> None:
    """Threads cannot be cancelled: nothing to check."""
