"""The per-call deadline, and the redis-py pieces that honour it.

A store call (``StatusStore`` or ``AsyncStatusStore``) sets :data:`DEADLINE`
to ``time.monotonic() + deadline`` for as long as it runs; the context
variable is per thread and per asyncio task, so concurrent calls never see
each other's. While it is set:

- every socket wait of a kvstatus connection (connect, handshake, health
  check, send, each reply) waits at most ``min(its own timeout, time left)``;
- the wait for a free pooled connection ends at the deadline, with
  :class:`ClientPoolExhausted`, never "Redis unavailable";
- no resend starts whose backoff would end past the deadline: the call gives
  up with the last error instead (:class:`DeadlineRetry`).

So a call returns within its deadline plus Python's own overhead, whatever the
server does. Outside a store call (admin tools, a raw client) nothing changes.
"""

from __future__ import annotations

import time
from contextvars import ContextVar
from typing import Any, Callable, Optional

import redis
import redis.asyncio
import redis.asyncio.retry
from redis.backoff import ExponentialBackoff
from redis.connection import SENTINEL
from redis.retry import Retry

DEADLINE: ContextVar[Optional[float]] = ContextVar("kvstatus_deadline", default=None)
"""``time.monotonic()`` at which the running store call gives up; None outside a store call."""

_SHORTEST_WAIT = 0.001  # seconds: a socket timeout of 0 would mean "non-blocking", not "expired"
_NO_CONNECTION = "No connection available."  # redis-py's BlockingConnectionPool, when its wait timed out


def time_left() -> Optional[float]:
    """Seconds left before the running store call's deadline (may be <= 0), or None outside a store call."""
    at = DEADLINE.get()
    return None if at is None else at - time.monotonic()


def may_wait(seconds: float) -> bool:
    """True if a wait of ``seconds`` still leaves time for another attempt before the deadline."""
    left = time_left()
    return left is None or seconds < left


class ClientPoolExhausted(redis.exceptions.RedisError):
    """No pooled connection came free before the call's deadline; nothing was sent.

    Not a ConnectionError, so that nothing resends it: Redis is fine, the client ran out of connections.
    """

    def __init__(self, max_connections: Any, waited: float) -> None:
        super().__init__(f"client connection pool exhausted (max_connections={max_connections}): no connection "
                         f"came free within {waited:.3g} s; nothing was sent. Raise max_connections (a "
                         "ConnectionOptions field and URL option) or the deadline, or make fewer concurrent calls")


def _capped(timeout: Optional[float], left: float) -> float:
    return max(_SHORTEST_WAIT, left if timeout is None else min(timeout, left))


class _Timeouts:
    """Lowers a connection's socket timeouts to the time left, and puts them back (one user per connection)."""

    __slots__ = ("connection", "saved")

    def __init__(self, connection: Any, left: float) -> None:
        self.connection = connection
        self.saved = (connection.socket_timeout, connection.socket_connect_timeout)
        connection.socket_timeout = _capped(self.saved[0], left)
        connection.socket_connect_timeout = _capped(self.saved[1], left)
        self._apply()

    def restore(self) -> None:
        self.connection.socket_timeout, self.connection.socket_connect_timeout = self.saved
        self._apply()

    def _apply(self) -> None:
        sock = getattr(self.connection, "_sock", None)  # sync connections only; asyncio reads the attribute
        if sock is not None:
            sock.settimeout(self.connection.socket_timeout)


def _expired() -> redis.exceptions.TimeoutError:
    return redis.exceptions.TimeoutError("the call's deadline passed before this command was sent "
                                         "(ConnectionOptions.deadline)")


class DeadlineConnection:
    """Mixin for redis-py's sync connections: every socket wait ends by the running store call's deadline."""

    def connect_check_health(self, *args: Any, **kwargs: Any) -> Any:
        left = time_left()
        if left is None:
            return super().connect_check_health(*args, **kwargs)  # type: ignore[misc]
        if left <= 0:
            raise _expired()
        timeouts = _Timeouts(self, left)
        try:
            return super().connect_check_health(*args, **kwargs)  # type: ignore[misc]
        finally:
            timeouts.restore()

    def send_packed_command(self, command: Any, check_health: bool = True) -> Any:
        left = time_left()
        if left is None:
            return super().send_packed_command(command, check_health)  # type: ignore[misc]
        if left <= 0:
            raise _expired()
        timeouts = _Timeouts(self, left)
        try:
            return super().send_packed_command(command, check_health)  # type: ignore[misc]
        finally:
            timeouts.restore()

    def read_response(self, disable_decoding: bool = False, *, timeout: Any = SENTINEL, **kwargs: Any) -> Any:
        left = time_left()
        if left is not None and timeout is SENTINEL:
            timeout = _capped(self.socket_timeout, left)  # type: ignore[attr-defined]
        return super().read_response(disable_decoding, timeout=timeout, **kwargs)  # type: ignore[misc]


class AsyncDeadlineConnection:
    """Mixin for redis.asyncio's connections: every socket wait ends by the running store call's deadline."""

    async def connect_check_health(self, *args: Any, **kwargs: Any) -> Any:
        left = time_left()
        if left is None:
            return await super().connect_check_health(*args, **kwargs)  # type: ignore[misc]
        if left <= 0:
            raise _expired()
        timeouts = _Timeouts(self, left)
        try:
            return await super().connect_check_health(*args, **kwargs)  # type: ignore[misc]
        finally:
            timeouts.restore()

    async def send_packed_command(self, command: Any, check_health: bool = True) -> Any:
        left = time_left()
        if left is None:
            return await super().send_packed_command(command, check_health)  # type: ignore[misc]
        if left <= 0:
            raise _expired()
        timeouts = _Timeouts(self, left)
        try:
            return await super().send_packed_command(command, check_health)  # type: ignore[misc]
        finally:
            timeouts.restore()

    async def read_response(self, disable_decoding: bool = False, timeout: Optional[float] = None,
                            **kwargs: Any) -> Any:
        left = time_left()
        if left is None or timeout is not None:
            return await super().read_response(disable_decoding, timeout, **kwargs)  # type: ignore[misc]
        # Not the timeout argument: redis.asyncio answers None, not TimeoutError, when that one expires.
        timeouts = _Timeouts(self, left)
        try:
            return await super().read_response(disable_decoding, None, **kwargs)  # type: ignore[misc]
        finally:
            timeouts.restore()


class _PoolWait:
    """The wait for a free connection of redis-py's blocking pools (sync and asyncio): it ends at the running
    store call's deadline, else after ``timeout`` seconds."""

    _wait: Optional[float]

    @property
    def timeout(self) -> Optional[float]:
        left = time_left()
        if left is None:
            return self._wait
        return max(0.0, left if self._wait is None else min(self._wait, left))

    @timeout.setter
    def timeout(self, value: Optional[float]) -> None:
        self._wait = value

    def _exhausted(self, exc: redis.exceptions.ConnectionError, started: float) -> Optional[ClientPoolExhausted]:
        if str(exc) == _NO_CONNECTION:
            return ClientPoolExhausted(self.max_connections, time.monotonic() - started)  # type: ignore[attr-defined]
        return None


class DeadlinePool(_PoolWait):
    """Mixin for a sync blocking pool: the wait ends by the deadline and raises :class:`ClientPoolExhausted`."""

    def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        started = time.monotonic()
        try:
            return super().get_connection(*args, **kwargs)  # type: ignore[misc]
        except redis.exceptions.ConnectionError as exc:
            error = self._exhausted(exc, started)
            if error is None:
                raise
            raise error from None


class AsyncDeadlinePool(_PoolWait):
    """:class:`DeadlinePool` for redis.asyncio."""

    async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        started = time.monotonic()
        try:
            return await super().get_connection(*args, **kwargs)  # type: ignore[misc]
        except redis.exceptions.ConnectionError as exc:
            error = self._exhausted(exc, started)
            if error is None:
                raise
            raise error from None


class BlockingPool(DeadlinePool, redis.BlockingConnectionPool):
    """redis-py's sync BlockingConnectionPool, deadline-aware."""


class AsyncBlockingPool(AsyncDeadlinePool, redis.asyncio.BlockingConnectionPool):
    """redis.asyncio's BlockingConnectionPool, deadline-aware."""


class DeadlineRetry(Retry):
    """redis-py's Retry that gives up, with the last error, when the next backoff would end past the deadline.

    The backoff must be a pure function of the failure count (ExponentialBackoff is): it is asked ahead.

    ``is_final`` names errors that are never resent (refused credentials, a failed TLS handshake).
    """

    def __init__(self, backoff: ExponentialBackoff, retries: int, is_final: Callable[[Exception], bool]) -> None:
        super().__init__(backoff, retries)
        self._is_final = is_final

    def call_with_retry(self, do: Any, fail: Any, is_retryable: Any = None, with_failure_count: bool = False) -> Any:
        def failed(error: Exception, failures: int) -> None:
            fail(error, failures) if with_failure_count else fail(error)
            if failures <= self._retries and not may_wait(self._backoff.compute(failures)):
                raise error

        def retryable(error: Exception) -> bool:
            return not self._is_final(error) and (is_retryable is None or is_retryable(error))

        return super().call_with_retry(do, failed, retryable, True)


class AsyncDeadlineRetry(redis.asyncio.retry.Retry):
    """:class:`DeadlineRetry` for redis.asyncio."""

    def __init__(self, backoff: ExponentialBackoff, retries: int, is_final: Callable[[Exception], bool]) -> None:
        super().__init__(backoff, retries)
        self._is_final = is_final

    async def call_with_retry(
        self, do: Any, fail: Any, is_retryable: Any = None, with_failure_count: bool = False
    ) -> Any:
        async def failed(error: Exception, failures: int) -> None:
            await (fail(error, failures) if with_failure_count else fail(error))
            if failures <= self._retries and not may_wait(self._backoff.compute(failures)):
                raise error

        def retryable(error: Exception) -> bool:
            return not self._is_final(error) and (is_retryable is None or is_retryable(error))

        return await super().call_with_retry(do, failed, retryable, True)
