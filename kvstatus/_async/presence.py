"""A lease holder's presence: one connection subscribed to its participant's channel, which Redis drops the
moment the process dies (the kernel closes its socket on SIGKILL, an OOM kill, a crash) and keeps through a
pause (SIGSTOP, GC, a native call holding the GIL). Peers count it with ``PUBSUB NUMSUB`` (``SHARDNUMSUB`` on
a cluster, where the channel is a shard channel); :mod:`kvstatus.peerwatch` judges what the counts mean.

The lease keeper calls :meth:`AsyncPresence.check` at each of its ticks: it drains the connection without
blocking and subscribes again once the connection is gone (a Redis restart, ``CLIENT KILL``, a failover). It
never publishes, and nothing is expected on the channel: a tenant recipe grants no ``PUBLISH``.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Optional

from redis import exceptions as rx

from kvstatus.concurrency import AsyncRedisConnection, async_close_link, async_pending
from kvstatus.connection import Topology
from kvstatus.deadline import DEADLINE, enter_deadline
from kvstatus.leasestate import log

if TYPE_CHECKING:
    from kvstatus.backend import AsyncClient

RETRY_SECONDS = 0.2
"""Seconds between two tries to subscribe again while the server cannot be reached."""
SUBSCRIBE_SECONDS = 2.0
"""At most this many seconds (or the store's deadline, if shorter) for one subscribe against a hung server: the
keeper's renewals wait behind it."""
_MESSAGES = (b"message", b"smessage", "message", "smessage")


class AsyncPresence:
    """The presence of one participant on ``channel``; ``deadline``: seconds a (re)subscribe may take.

    ``generation`` counts the subscriptions that took: a peer's watch trusts only what it saw since this
    holder's current one (a new one may be on another server). ``refused`` is the server's or the ACL's
    refusal (then no presence: peers judge this participant by its lease alone)."""

    def __init__(self, client: AsyncClient, channel: str, *, cluster: bool, deadline: float) -> None:
        self.topology = Topology(client)
        self.channel = channel
        self.command = "SSUBSCRIBE" if cluster else "SUBSCRIBE"
        self.deadline = deadline
        self.generation = 0
        self.refused: Optional[str] = None
        self._conn: Optional[AsyncRedisConnection] = None
        self._retry_at = -float("inf")
        self._stopped = True

    @property
    def subscribed(self) -> bool:
        """True while the subscription is believed to stand (the last :meth:`check` found it open)."""
        return self._conn is not None

    async def check(self) -> None:
        """Drain what arrived, without blocking; subscribe again if the connection is gone (at most every
        :data:`RETRY_SECONDS`). Never raises: a failure is retried at the next check."""
        if self.refused is not None or self._stopped:
            return
        conn = self._conn
        if conn is not None:
            try:
                while await async_pending(conn):
                    reply = await conn.read_response(push_request=True)
                    if not isinstance(reply, list) or not reply or reply[0] not in _MESSAGES:
                        raise rx.ConnectionError(f"the subscription ended ({reply!r})")  # e.g. sunsubscribe
                return
            except rx.TimeoutError:
                return  # nothing to read within a capped wait: the subscription stands (only a closed one is lost)
            except Exception:  # noqa: BLE001 - the connection failed or closed: subscribe again
                await self.drop()
        if time.monotonic() >= self._retry_at:
            await self._subscribe()

    async def renew(self) -> None:
        """The peers' server does not count this subscription (a failover moved the primary): subscribe again."""
        if self._conn is not None and time.monotonic() >= self._retry_at:
            await self.drop()
            await self._subscribe()

    async def _subscribe(self) -> None:
        self._retry_at = time.monotonic() + RETRY_SECONDS
        token = enter_deadline(min(self.deadline, SUBSCRIBE_SECONDS))
        conn: Optional[AsyncRedisConnection] = None
        try:
            conn = self.topology.new_data_connection(self.topology.node_name(self.channel))
            await conn.connect()
            await conn.send_command(self.command, self.channel)
            reply = await conn.read_response(push_request=True)  # a push on RESP3
        except rx.ResponseError as exc:  # NOPERM, an unknown command: this server or user has no presence
            await self.refuse(str(exc))
            reply = None
        except Exception as exc:  # noqa: BLE001 - unreachable or hung: tried again at a later check
            log.debug("presence on %s: subscribe failed: %s", self.channel, exc)
            reply = None
        finally:
            DEADLINE.reset(token)
        if isinstance(reply, list) and len(reply) == 3:
            self._conn = conn
            self.generation += 1
        elif conn is not None:
            async_close_link(conn)

    async def refuse(self, why: str) -> None:
        """The server or the ACL refuses presence (its subscribe, or the peers' count): none from now on."""
        self.refused = why
        await self.drop()
        log.warning(
            "presence on %s refused (%s): peers judge this participant by its lease alone, and it judges them so; "
            "grant the recipe's subscribe and pubsub commands and its presence channel to see a death within a second",
            self.channel,
            why,
        )

    async def drop(self) -> None:
        """Close the subscription (Redis forgets this presence at once)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            async_close_link(conn)

    async def start(self) -> None:
        """Subscribe now (an acquire: the holder is present from its first write on)."""
        self._stopped = False
        self._retry_at = -float("inf")
        await self.check()

    async def stop(self) -> None:
        """Unsubscribe until :meth:`start`: a released or lost lease has no presence."""
        self._stopped = True
        await self.drop()
