"""``wait_for``: wake up when a participant's entry reaches one of some statuses, pushed by Redis.

The update script publishes ``<status>:<participant>`` on the room's channel whenever it changes an
entry (CREATED, ADVANCED, FAILED). The channel is named like the room key and is a shard channel
(``SPUBLISH``/``SSUBSCRIBE``, Redis >= 7), so on a cluster it lives on the room's node and costs no
cluster-bus traffic; on Redis 6 it is a plain channel (``PUBLISH``/``SUBSCRIBE``).

A waiter subscribes *before* it reads the entry, so a change between its read and its subscription
cannot be missed. Pub/Sub is at-most-once (a message is lost if the subscription connection drops, and
the script does not publish for a user the ACL refuses the channel), so the waiter also re-reads the
entry every ``recheck`` seconds, and when the subscription breaks it polls every ``poll_interval``
seconds (re-subscribing as it goes). The loop is written once (:func:`wait_plan`); the sync and async
stores perform its I/O actions.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Generator, Iterable
from typing import Any, Optional

from redis import exceptions as rx

from kvstatus.errors import InvalidArgumentError
from kvstatus.nearcache import Topology
from kvstatus.rule import KVPoll, to_status

RECHECK_SECONDS = 1.0
POLL_INTERVAL_SECONDS = 0.05
_BROKEN = (rx.ConnectionError, rx.TimeoutError, OSError, EOFError)

# The I/O actions of a wait plan: (kind, argument).
SUBSCRIBE = "subscribe"  # argument None; reply: True if subscribed, False if not possible now
READ = "read"  # argument None; reply: the entry's status now (Optional[KVPoll])
RECEIVE = "receive"  # argument: seconds to wait; reply: payloads received (maybe []), or None if it broke
SLEEP = "sleep"  # argument: seconds
CLOCK = "clock"  # argument None; reply: time.monotonic()
Action = tuple[str, Any]


def target_statuses(statuses: KVPoll | int | Iterable[KVPoll | int]) -> frozenset[KVPoll]:
    """The statuses to wait for, validated (one status or an iterable of them)."""
    if isinstance(statuses, (KVPoll, int)) and not isinstance(statuses, bool):
        return frozenset({to_status(statuses)})
    if isinstance(statuses, (str, bytes)) or not isinstance(statuses, Iterable):
        raise InvalidArgumentError(f"invalid statuses {statuses!r}: expected a KVPoll, an int 0..4 or an iterable")
    targets = frozenset(to_status(s) for s in statuses)
    if not targets:
        raise InvalidArgumentError("wait_for needs at least one status to wait for")
    return targets


def check_timeout(timeout: Optional[float]) -> float:
    """``timeout`` in seconds (None: no limit) as a finite or infinite float."""
    if timeout is None:
        return math.inf
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or math.isnan(timeout) or timeout < 0:
        raise InvalidArgumentError(f"invalid timeout {timeout!r}: expected seconds >= 0 or None")
    return float(timeout)


def parse_payload(payload: Any) -> tuple[str, Optional[KVPoll]]:
    """(participant, status) of a published ``<status>:<participant>``; status None if malformed."""
    text = payload.decode("utf-8", "replace") if isinstance(payload, bytes) else str(payload)
    head, _, participant = text.partition(":")
    if len(head) == 1 and head in "01234":
        return participant, KVPoll(int(head))
    return participant, None


def wait_plan(participant: str, targets: frozenset[KVPoll], timeout: float, recheck: float = RECHECK_SECONDS,
              poll_interval: float = POLL_INTERVAL_SECONDS) -> Generator[Action, Any, Optional[KVPoll]]:
    """The waiting loop: returns the status reached, or None when ``timeout`` seconds passed first."""
    start = yield CLOCK, None
    deadline = start + timeout
    subscribed = yield SUBSCRIBE, None
    status = yield READ, None
    next_read = start + (recheck if subscribed else poll_interval)
    while True:
        if status in targets:
            return status
        now = yield CLOCK, None
        if now >= deadline:
            return None
        if now >= next_read:
            if not subscribed:
                subscribed = yield SUBSCRIBE, None  # subscribe first, then read: nothing falls in between
            status = yield READ, None
            next_read = now + (recheck if subscribed else poll_interval)
            continue
        wait = min(deadline, next_read) - now
        if not subscribed:
            yield SLEEP, wait
            continue
        payloads = yield RECEIVE, wait
        if payloads is None:
            subscribed = False
            next_read = now  # read (and try to re-subscribe) at once
            continue
        for payload in payloads:
            who, new = parse_payload(payload)
            if who == participant and new is not None:
                status = new
                if status in targets:
                    break


def _is_message(reply: Any) -> bool:
    return isinstance(reply, list) and len(reply) == 3 and reply[0] in (b"smessage", b"message")


class Subscription:
    """One channel on a dedicated blocking connection (SSUBSCRIBE, or SUBSCRIBE on Redis 6)."""

    def __init__(self, connection: Any, channel: str) -> None:
        self.connection = connection
        self.channel = channel
        self.error = ""

    def open(self) -> bool:
        """Subscribe; False (reason in ``error``) if the connection or the ACL refused."""
        conn = self.connection
        try:
            conn.connect()
            for command in ("SSUBSCRIBE", "SUBSCRIBE"):
                conn.send_command(command, self.channel)
                try:
                    conn.read_response(push_request=True)
                    return True
                except rx.ResponseError as exc:
                    if "unknown command" not in str(exc).lower():
                        raise
        except (*_BROKEN, rx.ResponseError) as exc:
            self.error = str(exc)
            self.close()
        return False

    def receive(self, seconds: float) -> Optional[list[Any]]:
        """Payloads that arrive within ``seconds`` (all that are ready once one is); None if broken."""
        conn = self.connection
        payloads: list[Any] = []
        try:
            wait = seconds
            while conn.can_read(timeout=wait):
                reply = conn.read_response(push_request=True)
                if _is_message(reply):
                    payloads.append(reply[2])
                wait = 0
        except _BROKEN:
            self.close()
            return None
        return payloads

    def close(self) -> None:
        try:
            self.connection.disconnect()
        except Exception:  # noqa: BLE001
            pass


class AsyncSubscription:
    """:class:`Subscription` on a ``redis.asyncio`` connection."""

    def __init__(self, connection: Any, channel: str) -> None:
        self.connection = connection
        self.channel = channel

    async def open(self) -> bool:
        conn = self.connection
        try:
            await conn.connect()
            for command in ("SSUBSCRIBE", "SUBSCRIBE"):
                await conn.send_command(command, self.channel)
                try:
                    await conn.read_response(push_request=True)
                    return True
                except rx.ResponseError as exc:
                    if "unknown command" not in str(exc).lower():
                        raise
        except (*_BROKEN, rx.ResponseError):
            await self.close()
        return False

    async def receive(self, seconds: float) -> Optional[list[Any]]:
        conn = self.connection
        payloads: list[Any] = []
        try:
            reply = await conn.read_response(timeout=max(seconds, 0.0), push_request=True)
            while reply is not None:
                if _is_message(reply):
                    payloads.append(reply[2])
                reply = await conn.read_response(timeout=1.0, push_request=True) if await _buffered(conn) else None
        except _BROKEN:
            await self.close()
            return None
        return payloads

    async def close(self) -> None:
        try:
            await self.connection.disconnect()
        except Exception:  # noqa: BLE001
            pass


def subscription_for(client: Any, key: str) -> Subscription:
    """An unopened :class:`Subscription` to the channel of room ``key`` on its node (sync client)."""
    return _open(client, key, Subscription)


def _open(client: Any, key: str, cls: Any) -> Any:
    topology = Topology(client)
    return cls(topology.new_data_connection(topology.node_name(key)), key)


def wait_for(client: Any, key: str, participant: str, statuses: Any, timeout: Optional[float],
             read: Callable[[], Optional[KVPoll]], recheck: float = RECHECK_SECONDS,
             poll_interval: float = POLL_INTERVAL_SECONDS) -> Optional[KVPoll]:
    """Block until ``participant``'s entry in room ``key`` is one of ``statuses``; return it, or None after
    ``timeout`` seconds (None: no limit). ``read()`` returns the entry's status from Redis (uncached)."""
    plan = wait_plan(participant, target_statuses(statuses), check_timeout(timeout), recheck, poll_interval)
    subscription: Optional[Subscription] = None
    reply: Any = None
    try:
        while True:
            try:
                kind, argument = plan.send(reply)
            except StopIteration as done:
                return done.value
            if kind == CLOCK:
                reply = time.monotonic()
            elif kind == SUBSCRIBE:
                if subscription is not None:
                    subscription.close()
                subscription = _open(client, key, Subscription)
                reply = subscription.open()
            elif kind == READ:
                reply = read()
            elif kind == RECEIVE:
                assert subscription is not None
                reply = subscription.receive(argument)
            else:
                time.sleep(argument)
                reply = None
    finally:
        plan.close()
        if subscription is not None:
            subscription.close()


async def async_wait_for(client: Any, key: str, participant: str, statuses: Any, timeout: Optional[float],
                         read: Callable[[], Awaitable[Optional[KVPoll]]], recheck: float = RECHECK_SECONDS,
                         poll_interval: float = POLL_INTERVAL_SECONDS) -> Optional[KVPoll]:
    """:func:`wait_for` on ``redis.asyncio``; ``read()`` is awaited."""
    plan = wait_plan(participant, target_statuses(statuses), check_timeout(timeout), recheck, poll_interval)
    subscription: Optional[AsyncSubscription] = None
    reply: Any = None
    try:
        while True:
            try:
                kind, argument = plan.send(reply)
            except StopIteration as done:
                return done.value
            if kind == CLOCK:
                reply = time.monotonic()
            elif kind == SUBSCRIBE:
                if subscription is not None:
                    await subscription.close()
                subscription = _open(client, key, AsyncSubscription)
                reply = await subscription.open()
            elif kind == READ:
                reply = await read()
            elif kind == RECEIVE:
                assert subscription is not None
                reply = await subscription.receive(argument)
            else:
                await asyncio.sleep(argument)
                reply = None
    finally:
        plan.close()
        if subscription is not None:
            await subscription.close()


async def _buffered(conn: Any) -> bool:
    """True if another reply is already waiting (redis-py 8 renamed ``can_read_destructive`` to ``can_read``)."""
    check = getattr(conn, "can_read", None) or conn.can_read_destructive
    return bool(await check())
