"""What the sync and async stores share around their I/O: settings, ``from_url``, properties, and ``wait_for``'s
loop as a plan of actions (:func:`wait_plan`), which :func:`kvstatus._async.store.async_wait_for` performs."""

from __future__ import annotations

import math
import time
from collections.abc import Generator, Iterable, Mapping
from functools import partial
from typing import Any, Callable, ClassVar, Final, Literal, Optional, Protocol, TypeVar, Union

from kvstatus.backend import Backend, RedisClient, client_kind, is_blocking
from kvstatus.cachestate import Freshness, NearCacheBase, NearCacheOptions, make_near_cache, writes_sent
from kvstatus.concurrency import AsyncGate, Gate
from kvstatus.errors import InvalidArgumentError
from kvstatus.keys import (
    DEFAULT_PREFIX,
    DEFAULT_TTL_SECONDS,
    KeySchema,
    validate_address,
    validate_lease_ttl,
    validate_name,
    validate_room,
    validate_script_mode,
)
from kvstatus.leasestate import LeaseCore
from kvstatus.model import KVPoll, Policy, StoreObserver, UpdateResult, check_observer, to_status
from kvstatus.operations import FunctionsCore, StoreCore
from kvstatus.peerwatch import PeerWatch
from kvstatus.url import CONNECTION_FIELDS, DEFAULT_URL, ConnectionOptions, options_for, parse_url

S = TypeVar("S", bound="StoreBase")


class _Sender(Protocol):
    """What the shared code uses of a store's sender (:class:`~kvstatus._async.sender.AsyncSender`, ``Sender``)."""

    @property
    def send(self) -> Callable[..., object]: ...


class _Keeper(Protocol):
    """What the shared code uses of a store's lease keeper (:class:`~kvstatus._async.leases.AsyncLeaseKeeper`)."""

    core: LeaseCore


class StoreBase:
    """Attributes common to :class:`~kvstatus.StatusStore` and :class:`~kvstatus.AsyncStatusStore`."""

    _connect: ClassVar[Callable[..., RedisClient]]  # connect or connect_async
    _sender_class: ClassVar[Callable[..., _Sender]]
    _gate_class: ClassVar[Union[type[Gate], type[AsyncGate]]]
    _near_class: ClassVar[Callable[..., NearCacheBase]]
    _keeper_class: ClassVar[Callable[..., _Keeper]]
    _presence_class: ClassVar[Callable[..., object]]

    def __init__(
        self,
        client: Union[RedisClient, Backend],
        *,
        namespace: str,
        participant: Optional[str] = None,
        prefix: str = DEFAULT_PREFIX,
        ttl: float = DEFAULT_TTL_SECONDS,
        policy: Union[str, Policy] = Policy.SEED,
        options: Optional[ConnectionOptions] = None,
        scripts: str = "eval",
        near_cache: Union[bool, NearCacheOptions, NearCacheBase, None] = None,
        metrics: Optional[StoreObserver] = None,
        lease_ttl: Optional[float] = None,
        shared_fate: bool = True,
        timeline: bool = False,
        address: Optional[str] = None,
    ) -> None:
        """Each argument, its unit and default: docs/guide.md ("Configuration"). ``client``: a redis-py client, or
        another store's :class:`~kvstatus.backend.Backend` to share (``options`` must then be None); ``near_cache``
        may also be another store's cache to share."""
        if isinstance(client, Backend) and options is not None:
            raise InvalidArgumentError("options belong to the backend: build the Backend with them instead")
        self.backend = client if isinstance(client, Backend) else Backend(client, options)
        self.client = self.backend.client
        is_async = self._gate_class is AsyncGate
        if is_blocking(self.client) == is_async:
            wanted, other = ("a redis.asyncio", "StatusStore") if is_async else ("a blocking", "AsyncStatusStore")
            raise InvalidArgumentError(
                f"{type(self).__name__} needs {wanted} redis-py client, not {client_kind(self.client)}: "
                f"use {other} with that one"
            )
        options = self.options = self.backend.options
        core = self._core = (FunctionsCore if validate_script_mode(scripts) == "functions" else StoreCore)(
            namespace=namespace,
            participant=participant,
            prefix=prefix,
            ttl=ttl,
            policy=policy,
            cluster=self.backend.cluster,
            shared_fate=shared_fate,
            timeline=timeline,
        )
        self._reader = (core.participant, shared_fate)  # who reads the near cache, and how
        self._metrics = check_observer(metrics)
        self._sender = self._sender_class(
            self.client,
            options,
            cluster=core.cluster,
            functions=isinstance(core, FunctionsCore),
            metrics=self._metrics,
            gate=self.backend.gate(self._gate_class),
        )
        self._near = make_near_cache(near_cache, self._near_class, self.client, core.schema, self._sender)
        self._keeper = None
        self._watch: Optional[PeerWatch] = None
        if address is not None and lease_ttl is None:
            raise InvalidArgumentError(f"address {address!r} needs a lease: build the store with lease_ttl=SECONDS too")
        if lease_ttl is not None:
            # The record outlives the lease by the room TTL: a dead participant stays "lost" while its entries live.
            lease_ttl = validate_lease_ttl(lease_ttl)
            keep_ms = core.ttl_ms + round(lease_ttl * 1000)
            lease = LeaseCore(core.schema, core.participant, lease_ttl, keep_ms=keep_ms, address=address)
            lease.on_epoch = core.fence
            watch = self._watch = PeerWatch(core, lease_ttl, keep_ms / 1000, partial(writes_sent, core.schema))
            presence = self._presence_class(self.client, watch.channel, cluster=core.cluster, deadline=options.deadline)
            self._keeper = self._keeper_class(lease, self._sender.send, watch, presence)

    @classmethod
    def from_url(
        cls: type[S], url: str = DEFAULT_URL, *, options: Optional[ConnectionOptions] = None, **settings: Any
    ) -> S:
        """Connect to ``url`` (connection settings only, :mod:`kvstatus.url`) and wrap the client. ``settings``: this
        class's keyword arguments and any :class:`ConnectionOptions` field (overrides ``options``; the URL's win)."""
        parsed = parse_url(url)
        overrides = {name: settings.pop(name) for name in list(settings) if name in CONNECTION_FIELDS}
        opts = options_for(parsed, options, **overrides)
        return cls(cls._connect(parsed, opts), options=opts, **settings)

    @property
    def namespace(self) -> str:
        return self._core.schema.namespace

    @property
    def prefix(self) -> str:
        return self._core.schema.prefix

    @property
    def participant(self) -> str:
        return self._core.participant

    @property
    def ttl(self) -> float:
        """Seconds: the least TTL each write of this store leaves on a room key (a longer one stays)."""
        return self._core.ttl_ms / 1000

    @property
    def policy(self) -> Policy:
        return self._core.policy

    @property
    def shared_fate(self) -> bool:
        """Whether reads judge the room's fate (:mod:`kvstatus.rule`), not this participant's entry alone."""
        return self._core.shared_fate

    @property
    def timeline(self) -> bool:
        """Whether this store's writes record each entry's timeline (:mod:`kvstatus.timeline`)."""
        return self._core.timeline

    @property
    def lease(self) -> Optional[LeaseCore]:
        """This store's lease (participant, ttl, incarnation, generation, held, lost), or None without one."""
        return None if self._keeper is None else self._keeper.core

    @property
    def scripts(self) -> str:
        """How this store runs its Lua: "eval" (EVALSHA) or "functions" (FCALL)."""
        return "functions" if isinstance(self._core, FunctionsCore) else "eval"

    @property
    def schema(self) -> KeySchema:
        """The :class:`~kvstatus.keys.KeySchema` of this store's namespace: how its keys are built and parsed."""
        return self._core.schema

    def for_participant(self: S, participant: str) -> S:
        """A store on the same backend and settings, writing as ``participant`` (its own lease if this one has one)."""
        metrics = None if self._metrics is None else self._metrics.for_participant(participant)
        lease_ttl = None if self._keeper is None else self._keeper.core.ttl
        settings = self._core.settings()
        settings["participant"] = participant
        return type(self)(
            self.backend, **settings, scripts=self.scripts, near_cache=self._near, metrics=metrics, lease_ttl=lease_ttl
        )

    @property
    def metrics(self) -> Optional[StoreObserver]:
        """The observer told of every call (:class:`~kvstatus.model.StoreObserver`), or None."""
        return self._metrics

    @property
    def near_cache(self) -> Any:
        """The near cache (:class:`~kvstatus.cachestate.NearCacheBase`) serving this store's reads, or None."""
        return self._near

    def fresh_reads(self, participant: Optional[str] = None) -> Optional[tuple[Freshness, dict[int, Optional[KVPoll]]]]:
        """The near cache's read door (:class:`~kvstatus.cachestate.Freshness`) and ``participant``'s (default: this
        store's) room -> status map (None: no entry; no key: not cached), served while the door says fresh, else
        by :meth:`get` (docs/design.md, "How the near cache stays coherent"); None without a near cache."""
        if self._near is None:
            return None
        reader = self._reader if participant is None else (validate_name(participant, "participant"), self._reader[1])
        return self._near.state.fresh, self._near.status_map(reader)

    def awaits(self, room: int, address: str) -> None:
        """``room`` waits on the peer at ``address`` (``host:port``, as that peer's store was given it): if it loses its
        lease or restarts before it writes the room, this store's open entry there fails within the peer's lease TTL
        plus a second. No I/O; forgotten when this store's entry leaves the open statuses. Needs ``lease_ttl``."""
        if self._watch is None:
            raise InvalidArgumentError("this store has no lease, so no peer watch: build it with lease_ttl=SECONDS")
        self._watch.awaits(validate_room(room), validate_address(address))

    def _lose_to_successor(self) -> None:
        """A write was refused as superseded: the lease is lost for good."""
        if self._keeper is not None:
            self._keeper.core.superseded()

    def _refused(self, results: Mapping[int, UpdateResult]) -> None:
        """Raise :class:`SupersededError` (and lose the lease) if ``results`` hold a room refused as superseded."""
        error = self._core.refused(results)
        if error is not None:
            self._lose_to_successor()
            raise error

    def _opened(self, results: Mapping[int, UpdateResult]) -> None:
        """Tell the peer watch (if any) this store's entries after updates."""
        if self._watch is not None:
            for room, result in results.items():
                self._watch.wrote(room, result.status)

    def _closed(self, rooms: Iterable[int]) -> None:
        """Tell the peer watch (if any) these rooms' entries were cleared, popped or cancelled."""
        if self._watch is not None:
            for room in rooms:
                self._watch.closed(room)

    def _wrote(self, rooms: Iterable[int]) -> None:
        """Drop the rooms this store wrote (or may have written) from the process's near caches: read-your-writes."""
        try:
            writes_sent(self._core.schema, rooms)
        except TypeError:
            pass  # not an iterable of rooms: the operation itself raised about it

    def uncached(self: S, participant: Optional[str] = None) -> S:
        """A store on the same backend and settings reading ``participant``'s entries (default: this store's) from
        Redis every time: no near cache, no lease, no peer watch."""
        settings = self._core.settings()
        settings["participant"] = self.participant if participant is None else participant
        return type(self)(self.backend, **settings, scripts=self.scripts)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(namespace={self.namespace!r}, participant={self.participant!r}, "
            f"prefix={self.prefix!r}, ttl={self.ttl:g}, policy={self.policy.value!r})"
        )


# ---- wait_for

RECHECK_SECONDS = 1.0
POLL_INTERVAL_SECONDS = 0.05

# The I/O actions of a wait plan: (kind, argument).
WATCH: Final = "watch"  # argument None; reply: True if the room is watched, else False
READ: Final = "read"  # argument None; reply: the entry's status now (Optional[KVPoll])
RECEIVE: Final = "receive"  # argument: seconds to wait at most; returns early when the room changed
SLEEP: Final = "sleep"  # argument: seconds
CLOCK: Final = "clock"  # argument None; reply: time.monotonic()
Action = Union[tuple[Literal["watch", "read", "clock"], None], tuple[Literal["receive", "sleep"], float]]


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


def wait_plan(
    targets: frozenset[KVPoll],
    timeout: float,
    recheck: float = RECHECK_SECONDS,
    poll_interval: float = POLL_INTERVAL_SECONDS,
) -> Generator[Action, Any, Optional[KVPoll]]:  # each reply's type follows its action's kind
    """The waiting loop: returns the status reached, or None when ``timeout`` seconds passed first. It watches the room
    before each read, reads again every ``recheck`` seconds while it watches, and polls every ``poll_interval`` seconds
    when it cannot (docs/guide.md, "Waiting for a status: `wait_for`")."""
    start = yield CLOCK, None
    deadline = start + timeout
    while True:
        watching = yield WATCH, None  # watch first, then read: no change falls in between
        status: Optional[KVPoll] = yield READ, None
        if status in targets:
            return status
        now = yield CLOCK, None
        if now >= deadline:
            return None
        wait = min(deadline - now, recheck if watching else poll_interval)
        yield (RECEIVE, wait) if watching else (SLEEP, wait)


MIN_STEP_SECONDS = 0.5
"""The least time one step of a wait (a watch, a read) is given, even at the wait's very end."""


def step_deadline(ends: float, deadline: float) -> float:
    """The monotonic time by which a step starting now must end: the store's ``deadline`` (seconds) from now,
    and no later than the wait's end ``ends``, unless that leaves less than :data:`MIN_STEP_SECONDS`."""
    now = time.monotonic()
    return min(now + deadline, max(ends, now + MIN_STEP_SECONDS))
