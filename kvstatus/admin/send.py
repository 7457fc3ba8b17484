"""How the admin tools reach Redis: through the stores' one send path (:class:`kvstatus._sync.sender.Sender`).

Every admin read (``ls``, ``stats``, ``health``, ``leases``, the board's pages, the exporter's passes) is a
:class:`~kvstatus.requests.Request` sent by a sender on its :data:`Link`'s backend, so it keeps what a store
call keeps: the backend's ``deadline`` (a hung server fails the read, it does not hang the tool), the cluster
client's gate, and errors translated to kvstatus errors. A command that names no key (``SCAN``, ``TIME``,
``FUNCTION``) goes to one node of a cluster, through a :class:`NodeTransport`; on a single server or behind
Sentinel it takes the sender's own transport, which resends it across a Sentinel failover. A pipelined read of
many keys keeps each key's error in place (``strict=0``: a tenant's string at a room's name is skipped, not
fatal), so a lost connection reaches it as an error in place, which it raises as BackendUnavailableError
without that resend; the client's own retries still apply.

The doctor's probes are the one exception: they send raw commands to learn what the user may send, each under
:func:`round_trip` (the same deadline).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Optional, TypeVar, Union

from redis.cluster import RedisCluster

from kvstatus._sync.sender import Sender
from kvstatus.backend import Backend, Client, client_kind, is_blocking
from kvstatus.concurrency import Gate
from kvstatus.deadline import DEADLINE, enter_deadline
from kvstatus.errors import InvalidArgumentError
from kvstatus.requests import Call, Request
from kvstatus.translate import REDIS_ERRORS
from kvstatus.url import ConnectionOptions

T = TypeVar("T")

DEFAULT_BATCH = 500
"""Keys per step of the admin tools' walks (:mod:`kvstatus.admin.scan`): the COUNT of each SCAN, and the rooms read
per pipelined round trip."""
DEFAULT_DEADLINE = ConnectionOptions().deadline

Link = Union[Backend, Client]
"""What the admin reads take: a redis-py client, or a :class:`~kvstatus.Backend` holding one and the
:class:`ConnectionOptions` whose ``deadline`` each round trip keeps (the CLI passes the one it built from
``--url``). A bare client gets the default options (a 5 s deadline), as a store built on it would."""


def client_of(link: Link) -> Client:
    """The redis-py client of ``link``; InvalidArgumentError for an asyncio one (the admin reads block)."""
    client = link.client if isinstance(link, Backend) else link
    if is_blocking(client):
        return client
    raise InvalidArgumentError(
        f"the admin reads take a blocking redis-py client or its Backend, not an asyncio one ({client_kind(client)})"
    )


def backend_of(link: Link) -> Backend:
    """``link`` itself, or a backend with the default options on the bare client ``link`` (checked as by
    :func:`client_of`)."""
    client = client_of(link)
    return link if isinstance(link, Backend) else Backend(client)


def deadline_of(link: Link) -> float:
    """Seconds each admin round trip on ``link`` may take: its backend's ``deadline``, else the default's."""
    return link.options.deadline if isinstance(link, Backend) else DEFAULT_DEADLINE


class NodeTransport:
    """One node of a cluster as a sender's transport, for a command that names no key: its replies, errors in
    place. No resend of its own: a walk goes on from its cursor at the next read."""

    resend_delays: tuple[float, ...] = ()

    def __init__(self, node: Any) -> None:
        self.node = node

    def io(self, calls: list[Call]) -> list[Any]:
        try:
            if len(calls) == 1:
                return [self.node.execute_command(*calls[0].args)]
            with self.node.pipeline(transaction=False) as pipe:
                for call in calls:
                    pipe.execute_command(*call.args)
                replies: list[Any] = pipe.execute(raise_on_error=False)
                return replies
        except REDIS_ERRORS as exc:
            return [exc] * len(calls)

    def reset(self) -> None:
        """Nothing to reload: the next read asks the cluster client for the node again."""

    def load(self, source: str) -> None:
        """Admin reads run no script."""


def nodes_of(link: Link) -> list[Optional[NodeTransport]]:
    """Where a command that names no key goes: each primary of a cluster, else ``[None]`` (the sender's own
    transport)."""
    if isinstance(client_of(link), RedisCluster):
        return [NodeTransport(node) for node in scan_clients(link)]
    return [None]


def sender_of(backend: Backend) -> Sender:
    """The admin tools' sender on ``backend``: built once, on first use, and shared by every admin read on it."""

    def make() -> Sender:
        gate = backend.gate(Gate)
        return Sender(
            backend.client, backend.options, cluster=backend.cluster, functions=False, metrics=None, gate=gate
        )

    return backend.shared("admin sender", Sender, make)


def send(link: Link, request: Request[T], node: Optional[NodeTransport] = None) -> T:
    """Send ``request`` on ``link``'s backend through the send path (to ``node`` if given); kvstatus errors raise."""
    return sender_of(backend_of(link)).send(request, "admin", via=node)


def replies(calls: list[Call], strict: Optional[int] = None) -> Request[list[Any]]:
    """A request for the raw replies of ``calls``: the errors of the first ``strict`` (None: all) raise, the
    others stay in place for the caller to judge (a key of the wrong type among the rooms of a page)."""
    return Request(calls, list, strict=strict)


def scan_step(
    link: Link, node: Optional[NodeTransport], cursor: int, pattern: str, count: int
) -> tuple[int, list[str]]:
    """One ``SCAN cursor MATCH pattern COUNT count`` on ``node`` (see :func:`nodes_of`): the next cursor (0: that
    node is done) and the keys, as text."""
    call = Call(("SCAN", cursor, "MATCH", pattern, "COUNT", count))
    ((next_cursor, keys),) = send(link, replies([call]), node)
    return int(next_cursor), [key.decode() if isinstance(key, bytes) else str(key) for key in keys]


def scan_clients(link: Link) -> list[Any]:
    """The node clients of ``link`` for the doctor's raw probes: each primary of a cluster, else the client."""
    client = client_of(link)
    if isinstance(client, RedisCluster):
        return [client.get_redis_connection(node) for node in client.get_primaries()]
    return [client]


@contextlib.contextmanager
def round_trip(link: Link) -> Iterator[None]:
    """Run the block, one raw round trip on ``link``'s client (or one of its cluster nodes), under its deadline
    (:func:`deadline_of`); an outer deadline that ends earlier (a store call's) is kept. For the doctor's probes."""
    token = enter_deadline(deadline_of(link))
    try:
        yield
    finally:
        DEADLINE.reset(token)
