"""``wait_for``'s driver: performs the actions of :func:`kvstatus.waitplan.wait_plan`.

Every step keeps a deadline (:func:`kvstatus.waitplan.step_deadline`): the subscription's connect and
handshake, and each read (sent through the store's send path), end by the store's deadline, and by the
wait's own end (a step always gets at least ``MIN_STEP_SECONDS``), so a wait against a hung server raises
:class:`~kvstatus.errors.BackendUnavailableError` about when its timeout ends instead of blocking for the
server's pause.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any, Optional

from redis import exceptions as rx

from kvstatus.concurrency import BROKEN, async_receive, async_sleep
from kvstatus.deadline import DEADLINE
from kvstatus.rule import KVPoll
from kvstatus.topology import Topology
from kvstatus.waitplan import (
    CLOCK,
    POLL_INTERVAL_SECONDS,
    READ,
    RECEIVE,
    RECHECK_SECONDS,
    SUBSCRIBE,
    check_timeout,
    is_message,
    step_deadline,
    target_statuses,
    wait_plan,
)


class AsyncSubscription:
    """One channel on a dedicated connection (SSUBSCRIBE, or SUBSCRIBE on Redis 6)."""

    def __init__(self, connection: Any, channel: str) -> None:
        self.connection = connection
        self.channel = channel
        self.error = ""

    async def open(self) -> bool:
        """Subscribe; False (reason in ``error``) if the connection, the deadline or the ACL refused."""
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
        except (*BROKEN, rx.ResponseError) as exc:
            self.error = str(exc)
            await self.close()
        return False

    async def receive(self, seconds: float) -> Optional[list[Any]]:
        """Payloads that arrive within ``seconds`` (all that are ready once one is); None if broken."""
        replies = await async_receive(self.connection, seconds)
        if replies is None:
            await self.close()
            return None
        return [reply[2] for reply in replies if is_message(reply)]

    async def close(self) -> None:
        try:
            await self.connection.disconnect()
        except Exception:  # noqa: BLE001 - closing a broken connection must not raise
            pass


async def async_wait_for(
    client: Any,
    key: str,
    participant: str,
    statuses: Any,
    timeout: Optional[float],
    read: Callable[[], Awaitable[Optional[KVPoll]]],
    deadline: float,
    recheck: float = RECHECK_SECONDS,
    poll_interval: float = POLL_INTERVAL_SECONDS,
) -> Optional[KVPoll]:
    """Wait until ``participant``'s entry in room ``key`` is one of ``statuses``; return it, or None after
    ``timeout`` seconds (None: no limit). ``read()`` returns the entry's status through the store's send
    path; ``deadline`` (seconds) bounds each subscription attempt as it bounds a store call."""
    plan = wait_plan(participant, target_statuses(statuses), check_timeout(timeout), recheck, poll_interval)
    ends = time.monotonic() + check_timeout(timeout)
    subscription: Optional[AsyncSubscription] = None
    reply: Any = None
    try:
        while True:
            try:
                kind, argument = plan.send(reply)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            if kind == CLOCK:
                reply = time.monotonic()
            elif kind == SUBSCRIBE:
                if subscription is not None:
                    await subscription.close()
                subscription = AsyncSubscription(_connection_for(client, key), key)
                step = DEADLINE.set(step_deadline(ends, deadline))
                try:
                    reply = await subscription.open()
                finally:
                    DEADLINE.reset(step)
            elif kind == READ:
                step = DEADLINE.set(step_deadline(ends, deadline))  # the send path keeps the earlier one
                try:
                    reply = await read()
                finally:
                    DEADLINE.reset(step)
            elif kind == RECEIVE:
                assert subscription is not None
                reply = await subscription.receive(argument)
            else:
                await async_sleep(argument)
                reply = None
    finally:
        plan.close()
        if subscription is not None:
            await subscription.close()


def subscription_for(client: Any, key: str) -> AsyncSubscription:
    """An unopened subscription to the channel of room ``key``, on a new connection to its node."""
    return AsyncSubscription(_connection_for(client, key), key)


def _connection_for(client: Any, key: str) -> Any:
    topology = Topology(client)
    return topology.new_data_connection(topology.node_name(key))
