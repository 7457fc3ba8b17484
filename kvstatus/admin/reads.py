"""How the operator tools read Redis: the stores' send path for a link, SCAN walks of rooms and of lease records.

Every admin read (``ls``, ``stats``, ``health``, ``participants``, the board's pages, the exporter's passes) is a
:class:`~kvstatus.requests.Request` sent by the stores' one send path (:class:`kvstatus._sync.sender.Sender`) on its
:data:`Link`'s backend, so it keeps what a store call keeps: the backend's ``deadline`` (a hung server fails the
read, it does not hang the tool; a bare client: the default 5 s; clients :mod:`kvstatus.connection` did not build,
fakeredis or a plain redis-py client, ignore it, as in store calls), the cluster client's gate, and errors
translated to kvstatus errors. The deadline bounds each round trip, not a whole walk of a namespace. A command that
names no key (``SCAN``, ``TIME``, ``FUNCTION``) goes to one node of a cluster, through a :class:`NodeTransport`; on
a single server or behind Sentinel it takes the sender's own transport, which resends it across a Sentinel
failover. A pipelined read of many keys keeps each key's error in place (``strict=0``: a tenant's string at a
room's name is skipped, not fatal), so a lost connection reaches it as an error in place, which it raises as
BackendUnavailableError without that resend; the client's own retries still apply. The doctor's probes alone send
raw commands, to learn what the user may send, each under :func:`round_trip` (the same deadline).

SCAN walks every primary of a cluster in turn (SCAN is per node), in batches of at most ``batch`` keys: rooms are
read with one pipelined round trip of HGETALL + PTTL per batch, so memory stays constant at any number of rooms.
The entries of :data:`~kvstatus.keys.PROBE_PARTICIPANT` (written by ``kvstatus doctor``) are left out of every
view, and a room holding nothing else is skipped.

Lease records are found with SCAN ``<prefix>:<namespace>:lease:*`` on every primary (a listing costs about one SCAN
pass, not one read per room) and read with one pipelined ``HGETALL`` per record plus that node's ``TIME``, so alive
and expired are judged by the clock of the Redis that holds the record, as the scripts do.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Optional, TypeVar, Union

from redis.cluster import RedisCluster

from kvstatus._sync.sender import Sender
from kvstatus.backend import Backend, Client, client_kind, is_blocking
from kvstatus.concurrency import Gate
from kvstatus.deadline import DEADLINE, enter_deadline
from kvstatus.errors import CorruptedValueError, InvalidArgumentError
from kvstatus.keys import PROBE_PARTICIPANT, KeySchema
from kvstatus.model import OPEN, LeaseState, ParticipantEntry, RoomView
from kvstatus.replies import decode_room, stored_int, text
from kvstatus.requests import Call, Request
from kvstatus.rule import reads
from kvstatus.translate import REDIS_ERRORS, translate_error
from kvstatus.url import ConnectionOptions

T = TypeVar("T")

DEFAULT_BATCH = 500
"""Keys per step of the admin tools' walks (:func:`iter_matching`): the COUNT of each SCAN, and the rooms read
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
    return int(next_cursor), [
        key.decode(errors="backslashreplace") if isinstance(key, bytes) else str(key) for key in keys
    ]


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


Progress = Callable[[int], None]
"""Called after each batch with the number of keys scanned so far."""
OnCorrupt = Callable[[int, str], None]
"""Called with (room, message) for a room holding a value kvstatus does not write."""


def redis_ms(seconds: Any, micros: Any) -> int:
    """A ``TIME`` reply as whole Unix ms, truncated exactly as the Lua scripts compute ``now``."""
    return int(seconds) * 1000 + int(micros) // 1000


def server_ms(client: Link) -> int:
    """Redis' clock in whole Unix ms (``TIME`` of the server, or of the first primary of a cluster), truncated as
    the Lua scripts compute ``now``: what timelines and failure records are written in, never the local clock."""
    ((seconds, micros),) = send(client, replies([Call(("TIME",))]), nodes_of(client)[0])
    return redis_ms(seconds, micros)


def iter_room_keys(client: Link, schema: KeySchema, batch: int = DEFAULT_BATCH) -> Iterator[list[str]]:
    """Yield the room keys of ``schema``'s namespace in lists of at most ``batch`` keys.

    SCAN may return a key twice while the keyspace is rehashed; callers that
    count should expect that rare duplicate, as every SCAN user must.
    """
    return iter_matching(client, schema.scan_pattern, lambda key: schema.room_of(key) is not None, batch)


def iter_matching(
    client: Link, pattern: str, accept: Callable[[str], bool], batch: int = DEFAULT_BATCH
) -> Iterator[list[str]]:
    """Yield the keys SCAN ``MATCH pattern`` finds (every primary of a cluster in turn) that ``accept`` takes, in
    lists of at most ``batch`` keys; Redis errors raise as kvstatus errors."""
    if batch < 1:
        raise ValueError("batch must be at least 1")
    client = backend_of(client)  # one backend (and its sender) for the whole walk, also on a bare client
    for node in nodes_of(client):
        cursor, pending = 0, []
        while True:
            cursor, keys = scan_step(client, node, cursor, pattern, batch)
            pending += [key for key in keys if accept(key)]
            while len(pending) >= batch:
                yield pending[:batch]
                pending = pending[batch:]
            if cursor == 0:
                break
        if pending:
            yield pending


def read_rooms(
    client: Link, schema: KeySchema, keys: list[str], on_corrupt: Optional[OnCorrupt] = None, with_ttl: bool = True
) -> list[RoomView]:
    """The views of ``keys`` in one pipelined round trip; rooms gone meanwhile are left out.

    ``with_ttl=False`` skips the PTTL reads (half the commands); ``ttl_ms`` is then None.

    A room holding a value kvstatus does not write raises
    :class:`~kvstatus.errors.CorruptedValueError`, or, with ``on_corrupt``, is
    passed to it (room, message) and skipped.
    """
    calls = [Call((command, key)) for key in keys for command in (("HGETALL", "PTTL") if with_ttl else ("HGETALL",))]
    found = send(client, replies(calls, strict=0))
    step = 2 if with_ttl else 1
    views = []
    for i, key in enumerate(keys):
        fields, pttl = found[step * i], found[step * i + 1] if with_ttl else -1
        room = schema.room_of(key)
        if room is None or not fields:
            continue
        try:
            for reply in (fields, pttl):
                if isinstance(reply, Exception):
                    raise translate_error(reply, Call(("HGETALL", key))) from reply
            view = without_probe(decode_room(room, key, fields, pttl))
        except CorruptedValueError as exc:
            if on_corrupt is None:
                raise
            on_corrupt(room, str(exc))
            continue
        if view.exists:
            views.append(view)
    return views


def without_probe(view: RoomView) -> RoomView:
    """``view`` without the doctor's probe entry."""
    if PROBE_PARTICIPANT not in view.participants:
        return view
    kept = {name: entry for name, entry in view.participants.items() if name != PROBE_PARTICIPANT}
    steps = {name: found for name, found in view.timelines.items() if name != PROBE_PARTICIPANT}
    return view._replace(participants=kept, timelines=steps)  # its tombstone and first failure stay


def iter_rooms(
    client: Link,
    schema: KeySchema,
    batch: int = DEFAULT_BATCH,
    progress: Optional[Progress] = None,
    on_corrupt: Optional[OnCorrupt] = None,
    with_ttl: bool = True,
) -> Iterator[RoomView]:
    """Yield every room of the namespace (see the module docstring for memory, cluster and ``read_rooms``)."""
    scanned = 0
    client = backend_of(client)
    for keys in iter_room_keys(client, schema, batch):
        yield from read_rooms(client, schema, keys, on_corrupt, with_ttl)
        scanned += len(keys)
        if progress is not None:
            progress(scanned)


def room_matches(view: RoomView, status: Any = None, participant: Optional[str] = None) -> bool:
    """True if some entry of ``view`` has ``participant`` (if given) and reads ``status`` (if given: the status
    :func:`kvstatus.rule.reads` answers, Failed in a room that failed); with neither, every room, a room
    cancelled before anyone wrote it (its first failure alone) included."""
    if status is None and participant is None:
        return True
    return any(
        (participant is None or name == participant) and (status is None or read == status)
        for name, read in reads(view).items()
    )


def entries(view: RoomView, participant: Optional[str] = None) -> list[tuple[str, ParticipantEntry]]:
    return [(n, e) for n, e in view.participants.items() if participant is None or n == participant]


@dataclass(frozen=True)
class LeaseInfo:
    """One participant's lease record. Times are Unix seconds by the Redis clock; ``ttl`` in seconds.

    ``state``: "alive", "expired" (its deadline passed: the holder stopped
    renewing) or "released" (closed by its store). ``generation`` counts the
    name's incarnations; ``incarnation`` is the current holder's token.
    """

    participant: str
    state: str
    incarnation: str
    generation: int
    since: float
    last_seen: float
    deadline: float
    ttl: float
    now: float
    epoch: int = 0
    """The incarnation's fence (``lua/lease.lua``): the epoch its writes stamp on its entries (0: none read)."""

    @property
    def lost(self) -> bool:
        return self.state != "alive"

    @property
    def lease_state(self) -> LeaseState:
        return LeaseState.LOST if self.lost else LeaseState.ALIVE

    def to_json(self) -> dict[str, Any]:
        return {
            "participant": self.participant,
            "state": self.state,
            "incarnation": self.incarnation,
            "generation": self.generation,
            "since": self.since,
            "last_seen": self.last_seen,
            "last_seen_ago_s": round(self.now - self.last_seen, 3),
            "deadline": self.deadline,
            "ttl_s": self.ttl,
        }


def _decode(participant: str, fields: dict[Any, Any], now_ms: int) -> Optional[LeaseInfo]:
    """``now_ms``: the Redis clock in whole ms (:func:`redis_ms`). The lease is judged as lua/room_statuses.lua
    judges it (the consensus view, the sweeper): a fractional ms here called a lease lost up to 1 ms before it did."""
    record = {text(k): text(v) for k, v in fields.items()}
    now = now_ms / 1000
    try:
        deadline_ms = stored_int(record["deadline"]) or 0  # as lua/room_statuses.lua: a junk deadline is past
        deadline = deadline_ms / 1000
        held = record.get("state") == "held"
        # "expired" as stored: a peer watch expired a lease that stopped renewing (lua/lease.lua's "expire")
        state = (
            "alive"
            if held and now_ms <= deadline_ms
            else "expired"
            if held or record.get("state") == "expired"
            else "released"
        )
        return LeaseInfo(
            participant,
            state,
            record.get("inc", ""),
            int(record.get("gen", 0)),
            int(record.get("since", 0)) / 1000,
            int(record.get("seen", 0)) / 1000,
            deadline,
            int(record.get("ttl", 0)) / 1000,
            now,
            stored_int(record.get("epoch")) or 0,
        )
    except (KeyError, ValueError):
        return None  # not a record kvstatus writes (or half-expired): not a lease


def iter_leases(
    client: Link, schema: KeySchema, batch: int = DEFAULT_BATCH, on_corrupt: Optional[Callable[[str], None]] = None
) -> Iterator[LeaseInfo]:
    """Yield every lease record of the namespace (alive, expired or released), one SCAN pass per primary.

    A key at a lease record's name that is not a hash, or a record kvstatus does not write, is skipped, and
    ``on_corrupt`` (if given) is called with a message naming it."""
    client = backend_of(client)
    for node in nodes_of(client):
        cursor = 0
        while True:
            cursor, keys = scan_step(client, node, cursor, schema.lease_pattern, batch)
            names = [(key, name) for key in keys if (name := schema.participant_of_lease(key)) is not None]
            if names:
                calls = [Call(("TIME",)), *(Call(("HGETALL", key)) for key, _ in names)]
                found = send(client, replies(calls, strict=1), node)  # the clock must answer; a bad key is skipped
                now_ms = redis_ms(*found[0])
                for (key, name), fields in zip(names, found[1:]):
                    bad = isinstance(fields, Exception)
                    info = None if bad or not fields else _decode(name, fields, now_ms)
                    if info is not None:
                        yield info
                    elif (bad or fields) and on_corrupt is not None:
                        on_corrupt(f"key {text(key)} is not a lease record kvstatus writes; skipped")
            if cursor == 0:
                break


def index_problem(client: Link, schema: KeySchema) -> Optional[str]:
    """A message naming the namespace's lease index (:mod:`kvstatus.peerwatch`) when its key holds something other
    than a hash (a tenant's string): the peer watches then judge peers by presence and leases alone. None: fine."""
    key = schema.lease_index_key
    # an HGET, which every recipe grants (TYPE is not): WRONGTYPE for a non-hash
    (reply,) = send(client, replies([Call(("HGET", key, ""))], strict=0))
    if isinstance(reply, Exception):
        if "WRONGTYPE" not in str(reply):
            raise translate_error(reply, Call(("HGET", key, "")))
        return (
            f"key {key} holds a value that is not the lease index kvstatus writes (a hash); skipped: the peer "
            "watches judge peers by their presence and leases alone until it is removed"
        )
    return None


def list_leases(client: Link, schema: KeySchema, on_corrupt: Optional[Callable[[str], None]] = None) -> list[LeaseInfo]:
    """Every lease record of the namespace, sorted by participant (``on_corrupt``: see :func:`iter_leases`)."""
    return sorted(iter_leases(client, schema, on_corrupt=on_corrupt), key=lambda info: info.participant)


def lost_participants(client: Link, schema: KeySchema) -> frozenset[str]:
    """The participants whose lease is lost (expired or released); the exporter's hook has this signature."""
    return frozenset(info.participant for info in iter_leases(client, schema) if info.lost)


@dataclass(frozen=True)
class Deaths:
    """The namespace's lease records by participant: which open entries a dead or restarted participant left.

    An open entry is *left* (its writer is gone, and nothing will move it) when its participant's lease is lost
    (expired: the process died; or released), or when the entry carries the epoch of an older incarnation than
    the lease now held under its name (``lua/update.lua`` stamps each entry with its writer's epoch): the
    process restarted under the same name, and the new one does not serve the old one's rooms. A participant
    without a lease record (a store built without ``lease_ttl``) is never judged dead.

    As a collection it holds the names of the participants whose lease is lost, as :func:`lost_participants`
    answers: :func:`read_deaths` serves as the exporter's and the board's hook, one SCAN of the leases a pass."""

    leases: Mapping[str, LeaseInfo] = field(default_factory=dict)

    @property
    def lost(self) -> list[str]:
        """The participants whose lease is lost, sorted."""
        return sorted(name for name, info in self.leases.items() if info.lost)

    def __iter__(self) -> Iterator[str]:
        return iter(self.lost)

    def __len__(self) -> int:
        return len(self.lost)

    def __contains__(self, name: object) -> bool:
        info = self.leases.get(name) if isinstance(name, str) else None
        return info is not None and info.lost

    def left(self, view: RoomView) -> dict[str, int]:
        """Participant -> when its writer died (Unix ms, Redis' clock) for each open entry of ``view`` that a dead
        or restarted participant left: its last renewal when its lease is lost, else when the incarnation now
        holding its name took the lease (the previous one died before it)."""
        found: dict[str, int] = {}
        for name, entry in view.participants.items():
            info = self.leases.get(name)
            if info is None or entry.status not in OPEN:
                continue
            stamp = view.stamps.get(name)
            if info.lost:
                found[name] = round(info.last_seen * 1000)
            elif stamp is not None and stamp < info.epoch:
                found[name] = round(info.since * 1000)
        return found

    def until_served(self, participant: str, died_ms: float) -> float:
        """When ``participant``, which died at ``died_ms``, can have served again: never while its lease is lost
        (infinity: nothing its pairs serve meanwhile is its own), else from ``died_ms`` (it restarted)."""
        info = self.leases.get(participant)
        return math.inf if info is not None and info.lost else died_ms


def read_deaths(client: Link, schema: KeySchema, on_corrupt: Optional[Callable[[str], None]] = None) -> Deaths:
    """The :class:`Deaths` of ``schema``'s namespace: its lease records, one SCAN pass (:func:`iter_leases`)."""
    return Deaths({info.participant: info for info in iter_leases(client, schema, on_corrupt=on_corrupt)})
