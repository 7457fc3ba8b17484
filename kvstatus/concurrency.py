"""The few things that really differ between the sync and the async I/O, each as a pair of names: tools/unasync.py
maps each ``Async*`` / ``async_*`` name of kvstatus/_async/ to its twin here to write kvstatus/_sync/."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
import select
import threading
import time
from collections.abc import Awaitable, Mapping
from typing import TYPE_CHECKING, Callable, Optional, TypeVar

import redis.asyncio.connection
import redis.connection
import redis.exceptions as rx
from redis.cluster import RedisCluster

if TYPE_CHECKING:  # the near cache's link types, built on these primitives
    from kvstatus.invalidation import LinkReader, LinkState

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
_Waiters = collections.deque[asyncio.Future[bool]]


def _settle(future: asyncio.Future[_T], value: _T) -> None:
    if not future.done():
        future.set_result(value)


def _running_loop() -> Optional[asyncio.AbstractEventLoop]:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _call_on(loop: asyncio.AbstractEventLoop, callback: Callable[..., object], *args: object) -> None:
    """``callback(*args)`` now if ``loop`` runs this thread, else soon on ``loop``'s thread (never on a closed loop)."""
    if _running_loop() is loop:
        callback(*args)
    elif not loop.is_closed():
        loop.call_soon_threadsafe(callback, *args)


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


async def async_wait_turn(waiters: _Waiters, seconds: float, pass_on: Callable[[], object]) -> bool:
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


def wake_first(waiters: _Waiters) -> bool:
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
        self._waiters: _Waiters = collections.deque()

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
    """Keyword arguments sending a pipelined script call to its node: none (redis.asyncio finds an EVALSHA's slot)."""
    return {}


def pipeline_route(client: RedisCluster, key: str) -> dict[str, object]:
    """redis-py's sync cluster pipeline would ask a node COMMAND GETKEYS for every script call."""
    return {"target_nodes": client.get_node_from_key(key)}  # type: ignore[no-untyped-call]


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


def close_link(connection: RedisConnection) -> None:
    with contextlib.suppress(Exception):
        connection.disconnect()  # type: ignore[no-untyped-call]


def async_data_fd(connection: object) -> Optional[int]:
    """The socket polled for a closed data connection: none for asyncio (:func:`async_closed_links` checks)."""
    return None


def data_fd(connection: RedisConnection) -> Optional[int]:
    return int(connection._sock.fileno())  # type: ignore[attr-defined]  # redis-py types _sock as None


def async_closed_links(links: Mapping[str, LinkState]) -> list[str]:
    """Names of the near cache's links whose asyncio data connection has ended (checked on every read)."""
    readers = {name: getattr(link.data, "_reader", None) for name, link in links.items()}
    return [name for name, reader in readers.items() if reader is None or reader.at_eof()]


def closed_links(links: Mapping[str, LinkState]) -> tuple[str, ...]:
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
        if future is not None and not future.done():  # perhaps from another thread: a sync caller's close
            _call_on(future.get_loop(), _settle, future, True)

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


def async_start_reader(source: LinkReader) -> None:
    """Call ``source.on_readable()`` from the running loop whenever ``source`` has something to read, until
    ``source.on_close`` is called (it is set here)."""
    loop = asyncio.get_running_loop()
    fd = source.fileno()
    loop.add_reader(fd, source.on_readable)
    source.on_close = lambda: _call_on(loop, loop.remove_reader, fd)  # perhaps from another thread: a sync close


def start_reader(source: LinkReader) -> None:
    """:func:`async_start_reader` for threads: a daemon thread polls ``source`` until ``on_close``."""
    stopped = threading.Event()
    source.on_close = stopped.set

    def run() -> None:
        while not stopped.is_set():
            try:
                poller = select.poll()  # not select.select(): a busy process has descriptors above 1024
                poller.register(source.fileno(), select.POLLIN | select.POLLPRI)
                if poller.poll(500) and not stopped.is_set():
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
