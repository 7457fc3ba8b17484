"""The per-call deadline (docs/guide.md, "Deadline"), and the redis-py pieces that honour it while a store call
sets :data:`DEADLINE`: socket waits cut to the time left, pools that queue until it, no resend past it."""

from __future__ import annotations

import asyncio
import collections
import sys
import threading
import time
from collections.abc import Awaitable
from contextvars import ContextVar, Token
from typing import TYPE_CHECKING, Callable, Optional, Protocol, TypeVar, cast

import redis
import redis.asyncio
import redis.asyncio.retry
import redis.connection
from redis.asyncio.connection import AbstractConnection as _AsyncConnection
from redis.backoff import ExponentialBackoff
from redis.connection import SENTINEL  # type: ignore[attr-defined]
from redis.retry import Retry

from kvstatus.concurrency import async_wait_turn, wake_first
from kvstatus.errors import EARLIER, ClientPoolExhausted

if sys.version_info >= (3, 11):
    from asyncio import timeout as _async_timeout
else:  # redis.asyncio's own dependency on Python 3.10
    from async_timeout import timeout as _async_timeout

DEADLINE: ContextVar[Optional[float]] = ContextVar("kvstatus_deadline", default=None)
"""``time.monotonic()`` at which the running store call gives up; None outside a store call."""
_get_deadline = DEADLINE.get
_monotonic = time.monotonic

_SHORTEST_WAIT = 0.001  # seconds: a socket timeout of 0 would mean "non-blocking", not "expired"
TOLERANCE = 0.1
"""Seconds a call may outlast its deadline: a socket wait that would end at most this much past it is left
as it is (see :func:`_capped`)."""
_WAIT_SLICE = 0.05  # seconds: a waiter for a connection looks again at least this often
_T = TypeVar("_T")


def time_left() -> Optional[float]:
    """Seconds left before the running store call's deadline (may be <= 0), or None outside a store call."""
    at = DEADLINE.get()
    return None if at is None else at - time.monotonic()


def enter_deadline(seconds: float) -> Token[Optional[float]]:
    """Give the running call ``seconds`` from now, or keep an earlier deadline already set (a wait's, a store
    call's); returns the token that ``DEADLINE.reset`` takes when the call ends."""
    ends = _monotonic() + seconds
    outer = _get_deadline()
    return DEADLINE.set(ends if outer is None or ends < outer else outer)


def may_wait(seconds: float) -> bool:
    """True if a wait of ``seconds`` still leaves time for another attempt before the deadline."""
    left = time_left()
    return left is None or seconds < left


def _capped(timeout: Optional[float], left: float) -> Optional[float]:
    """The timeout to use instead of ``timeout`` with ``left`` seconds to go, or None to keep ``timeout`` (it ends
    at most :data:`TOLERANCE` past the deadline: changing a socket's timeout costs system calls)."""
    if timeout is not None and left + TOLERANCE >= timeout:
        return None
    return max(_SHORTEST_WAIT, left)


class _SocketTimeouts(Protocol):
    """What :class:`_Timeouts` changes on a redis-py connection (sync or async)."""

    socket_timeout: Optional[float]
    socket_connect_timeout: Optional[float]


class _Timeouts:
    """Lowers a connection's socket timeouts to the time left, and puts them back (one user per connection)."""

    __slots__ = ("connection", "saved")

    def __init__(self, connection: _SocketTimeouts, timeout: Optional[float], connect_timeout: Optional[float]) -> None:
        self.connection = connection
        self.saved = (connection.socket_timeout, connection.socket_connect_timeout)
        if timeout is not None:
            connection.socket_timeout = timeout
        if connect_timeout is not None:
            connection.socket_connect_timeout = connect_timeout
        self._apply()

    @classmethod
    def lowered(cls, connection: _SocketTimeouts) -> Optional[_Timeouts]:
        """The connection's timeouts lowered to the time left (None: nothing to lower); once expired, raises
        redis-py's TimeoutError (unknown whether an earlier send was applied, like any timeout)."""
        at = _get_deadline()
        if at is None:
            return None
        left = at - _monotonic()
        if left <= 0:
            raise redis.exceptions.TimeoutError("the call's deadline passed (ConnectionOptions.deadline)")
        timeout = _capped(connection.socket_timeout, left)
        connect_timeout = _capped(connection.socket_connect_timeout, left)
        if timeout is None and connect_timeout is None:
            return None
        return cls(connection, timeout, connect_timeout)

    def restore(self) -> None:
        self.connection.socket_timeout, self.connection.socket_connect_timeout = self.saved
        self._apply()

    def _apply(self) -> None:
        sock = getattr(self.connection, "_sock", None)  # sync connections only; asyncio reads the attribute
        if sock is not None:
            sock.settimeout(self.connection.socket_timeout)


class DeadlineConnection:
    """Mixin for redis-py's sync connections: every socket wait ends by the running store call's deadline."""

    socket_timeout: Optional[float]  # the connection's own (declared here, set by redis-py)
    socket_connect_timeout: Optional[float]

    def connect_check_health(self, *args: object, **kwargs: object) -> object:
        timeouts = None if self._sock else _Timeouts.lowered(self)  # type: ignore[attr-defined]
        try:
            return super().connect_check_health(*args, **kwargs)  # type: ignore[misc]
        finally:
            if timeouts is not None:
                timeouts.restore()

    def send_packed_command(self, command: object, check_health: bool = True) -> object:
        timeouts = _Timeouts.lowered(self)
        try:
            return super().send_packed_command(command, check_health)  # type: ignore[misc]
        finally:
            if timeouts is not None:
                timeouts.restore()

    def read_response(self, disable_decoding: bool = False, *, timeout: object = SENTINEL, **kwargs: object) -> object:
        at = _get_deadline()
        if at is not None and timeout is SENTINEL:
            capped = _capped(self.socket_timeout, at - _monotonic())
            if capped is not None:
                timeout = capped
        return super().read_response(disable_decoding, timeout=timeout, **kwargs)  # type: ignore[misc]


class AsyncDeadlineConnection:
    """Mixin for redis.asyncio's connections: every socket wait ends by the running store call's deadline."""

    socket_timeout: Optional[float]  # the connection's own (declared here, set by redis.asyncio)
    socket_connect_timeout: Optional[float]
    if TYPE_CHECKING:  # redis.asyncio's method; declared for the type checker only (a real one would override it)

        async def disconnect(self, nowait: bool = False) -> None: ...

    async def connect_check_health(self, *args: object, **kwargs: object) -> object:
        timeouts = None if self.is_connected else _Timeouts.lowered(self)  # type: ignore[attr-defined]
        try:
            return await super().connect_check_health(*args, **kwargs)  # type: ignore[misc]
        finally:
            if timeouts is not None:
                timeouts.restore()

    async def send_packed_command(self, command: object, check_health: bool = True) -> object:
        timeouts = _Timeouts.lowered(self)
        try:
            return await self._send_bounded(command, check_health)
        finally:
            if timeouts is not None:
                timeouts.restore()

    async def _send_bounded(self, command: object, check_health: bool) -> object:
        """redis-py's send, its socket timeout kept by a timeout context instead of its ``asyncio.wait_for`` (which
        runs the write as a task and, up to Python 3.11, swallows a cancel that meets the write's end)."""
        timeout = self.socket_timeout
        if not timeout:
            return await super().send_packed_command(command, check_health)  # type: ignore[misc]
        self.socket_timeout = None
        try:
            async with _async_timeout(timeout):
                return await super().send_packed_command(command, check_health)  # type: ignore[misc]
        except asyncio.TimeoutError:
            await self.disconnect(nowait=True)
            raise redis.exceptions.TimeoutError("Timeout writing to socket") from None
        finally:
            self.socket_timeout = timeout

    async def read_response(
        self, disable_decoding: bool = False, timeout: Optional[float] = None, **kwargs: object
    ) -> object:
        # Not the timeout argument: redis.asyncio answers None, not TimeoutError, when that one expires.
        timeouts = _Timeouts.lowered(self) if timeout is None else None
        try:
            return await super().read_response(disable_decoding, timeout, **kwargs)  # type: ignore[misc]
        finally:
            if timeouts is not None:
                timeouts.restore()


def _wait_end(timeout: Optional[float]) -> tuple[float, Optional[float]]:
    """``(now, end)`` (``time.monotonic()``) of a wait for a free connection: it ends at the call's deadline, else
    ``timeout`` seconds on (None: never)."""
    started = _monotonic()
    left = time_left()
    if left is not None:
        timeout = max(0.0, left if timeout is None else min(timeout, left))
    return started, None if timeout is None else started + timeout


def _next_slice(end: Optional[float]) -> float:
    """Seconds a waiter for a connection sleeps before it looks again."""
    return _WAIT_SLICE if end is None else max(0.0, min(_WAIT_SLICE, end - _monotonic()))


def _give_up(end: Optional[float], started: float, max_connections: int) -> None:
    """Raise :class:`ClientPoolExhausted` if the wait that began at ``started`` reached ``end``."""
    if end is not None and _monotonic() >= end:
        raise ClientPoolExhausted(max_connections, _monotonic() - started) from None


class WaitingPool:
    """Mixin for redis-py's sync ConnectionPool (and its Sentinel subclass): a call that finds all
    ``max_connections`` in use waits for one until its deadline (outside a store call: ``timeout`` seconds), then
    raises :class:`ClientPoolExhausted`. The path with a free connection is redis-py's own, untouched."""

    def __init__(self, *args: object, timeout: Optional[float] = None, **kwargs: object) -> None:
        self._wait = timeout
        self._released = threading.Condition(threading.Lock())
        self._waiting = 0
        super().__init__(*args, **kwargs)

    def get_connection(self, *args: object, **kwargs: object) -> redis.connection.Connection:
        try:  # a mixin's super() is untyped: cast to what the pool's get_connection returns
            return cast(redis.connection.Connection, super().get_connection(*args, **kwargs))  # type: ignore[misc]
        except redis.exceptions.MaxConnectionsError:
            pass
        started, end = _wait_end(self._wait)
        while True:
            with self._released:
                self._waiting += 1
                try:
                    # A release between the failed attempt and this wait is caught by the next slice.
                    self._released.wait(_next_slice(end))
                finally:
                    self._waiting -= 1
            try:
                return cast(redis.connection.Connection, super().get_connection(*args, **kwargs))  # type: ignore[misc]
            except redis.exceptions.MaxConnectionsError:
                _give_up(end, started, self.max_connections)  # type: ignore[attr-defined]

    def release(self, connection: redis.connection.ConnectionInterface) -> None:
        super().release(connection)  # type: ignore[misc]
        if self._waiting:
            with self._released:
                self._released.notify()


class AsyncWaitingPool:
    """:class:`WaitingPool` for redis.asyncio's ConnectionPool: waiters queue first come, first served."""

    def __init__(self, *args: object, timeout: Optional[float] = None, **kwargs: object) -> None:
        self._wait = timeout
        self._waiters: collections.deque[asyncio.Future[bool]] = collections.deque()
        super().__init__(*args, **kwargs)

    async def get_connection(self, *args: object, **kwargs: object) -> _AsyncConnection:
        try:  # a mixin's super() is untyped: cast to what the pool's get_connection returns
            return cast(_AsyncConnection, await super().get_connection(*args, **kwargs))  # type: ignore[misc]
        except redis.exceptions.MaxConnectionsError:
            pass
        started, end = _wait_end(self._wait)
        while True:
            await async_wait_turn(self._waiters, _next_slice(end), lambda: wake_first(self._waiters))
            try:
                return cast(_AsyncConnection, await super().get_connection(*args, **kwargs))  # type: ignore[misc]
            except redis.exceptions.MaxConnectionsError:
                _give_up(end, started, self.max_connections)  # type: ignore[attr-defined]

    async def release(self, connection: _AsyncConnection) -> None:
        await super().release(connection)  # type: ignore[misc]
        wake_first(self._waiters)


class WaitingConnectionPool(WaitingPool, redis.ConnectionPool):
    """redis-py's sync ConnectionPool that queues for a connection (see :class:`WaitingPool`)."""


class AsyncWaitingConnectionPool(AsyncWaitingPool, redis.asyncio.ConnectionPool):
    """redis.asyncio's ConnectionPool that queues for a connection (see :class:`AsyncWaitingPool`)."""


def _keep_why(error: Exception, earlier: list[str]) -> None:
    """A timeout says nothing of why the attempts before it failed: it carries the last of those errors
    (:data:`~kvstatus.errors.EARLIER`); ``earlier`` keeps it between attempts."""
    if not isinstance(error, redis.exceptions.TimeoutError):
        earlier[:] = [str(error) or type(error).__name__]
    elif earlier:
        setattr(error, EARLIER, earlier[0])


class DeadlineRetry(Retry):
    """redis-py's Retry that gives up, with the last error, when the next backoff would end past the deadline (the
    backoff, asked ahead, must be a pure function of the failure count). ``is_final(error, failures)`` names errors
    never resent (refused credentials, a failed TLS handshake ...); ``failures`` counts the attempts that failed."""

    def __init__(self, backoff: ExponentialBackoff, retries: int, is_final: Callable[[Exception, int], bool]) -> None:
        super().__init__(backoff, retries)
        self._is_final = is_final

    def call_with_retry(
        self,
        do: Callable[[], _T],
        fail: Callable[..., object],  # fail(error), or fail(error, failures) with with_failure_count
        is_retryable: Optional[Callable[[Exception], bool]] = None,
        with_failure_count: bool = False,
    ) -> _T:
        seen = [0]
        earlier: list[str] = []

        def failed(error: Exception, failures: int) -> None:
            seen[0] = failures
            _keep_why(error, earlier)
            fail(error, failures) if with_failure_count else fail(error)
            if failures <= self._retries and not may_wait(self._backoff.compute(failures)):
                raise error

        def retryable(error: Exception) -> bool:
            return not self._is_final(error, seen[0]) and (is_retryable is None or is_retryable(error))

        return super().call_with_retry(do, failed, retryable, True)


class AsyncDeadlineRetry(redis.asyncio.retry.Retry):
    """:class:`DeadlineRetry` for redis.asyncio."""

    def __init__(self, backoff: ExponentialBackoff, retries: int, is_final: Callable[[Exception, int], bool]) -> None:
        super().__init__(backoff, retries)
        self._is_final = is_final

    async def call_with_retry(
        self,
        do: Callable[[], Awaitable[_T]],
        fail: Callable[..., Awaitable[object]],  # as in DeadlineRetry, awaited
        is_retryable: Optional[Callable[[Exception], bool]] = None,
        with_failure_count: bool = False,
    ) -> _T:
        seen = [0]
        earlier: list[str] = []

        async def failed(error: Exception, failures: int) -> None:
            seen[0] = failures
            _keep_why(error, earlier)
            await (fail(error, failures) if with_failure_count else fail(error))
            if failures <= self._retries and not may_wait(self._backoff.compute(failures)):
                raise error

        def retryable(error: Exception) -> bool:
            return not self._is_final(error, seen[0]) and (is_retryable is None or is_retryable(error))

        return await super().call_with_retry(do, failed, retryable, True)
