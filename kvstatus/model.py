"""kvstatus' data (no rules, no I/O; the integers are what the Lua scripts return) and the hooks a store calls on
its observer (:class:`StoreObserver`; docs/observe.md ("Library metrics"))."""

from __future__ import annotations

import enum
import time
from collections.abc import Iterable
from typing import NamedTuple, Optional, Protocol, TypeGuard, runtime_checkable

from kvstatus.errors import InvalidArgumentError, InvalidStatusError


class KVPoll(enum.IntEnum):
    """Room status, numbered as in SGLang's ``KVPoll``."""

    Failed = 0
    Bootstrapping = 1
    WaitingForInput = 2
    Transferring = 3
    Success = 4


class Outcome(enum.IntEnum):
    """Which row of the update rule fired; the integer is what the Lua script returns."""

    CREATED = 1
    ADVANCED = 2
    FAILED = 3
    UNCHANGED = 4
    IGNORED_MISSING = 5
    REFUSED_TERMINAL = 6
    REFUSED_CREATE = 7
    REFUSED_SUPERSEDED = 15  # the entry is stamped by a later incarnation of the participant: nothing written

    @property
    def refreshes_ttl(self) -> bool:
        """True for the outcomes after which the entry exists and the room's TTL was refreshed."""
        return self in _TTL_REFRESHING


class ReasonOutcome(enum.IntEnum):
    """What ``lua/record_failure.lua`` did; codes continue :class:`Outcome`'s (one number, one meaning)."""

    IGNORED_MISSING = 5  # Outcome.IGNORED_MISSING: no entry, nothing written
    RECORDED = 8  # the reason was stored and the room's TTL refreshed
    KEPT_EARLIER = 9  # an earlier reason stays; nothing written


class LeaseOutcome(enum.IntEnum):
    """What ``lua/lease.lua`` did; codes continue :class:`ReasonOutcome`'s."""

    HELD = 10  # acquired or renewed: the deadline moved to Redis' time + the lease TTL
    LOST = 11  # another incarnation holds the record, it was released, or its deadline passed: nothing written
    RELEASED = 12


class CancelOutcome(enum.IntEnum):
    """What ``lua/cancel.lua`` did to a room; codes continue :class:`LeaseOutcome`'s."""

    CANCELLED = 13  # the cancel is the room's first failure
    ALREADY_FAILED = 14  # the room had failed before: its first failure stays (open entries are failed all the same)
    ALREADY_SERVED = 16  # every entry of the room is Success (and it never failed): nothing was written


class CancelResult(NamedTuple):
    """A cancel of one room: what it did, and how many participants' open entries it turned Failed."""

    outcome: CancelOutcome
    failed: int


_TTL_REFRESHING = frozenset({Outcome.CREATED, Outcome.ADVANCED, Outcome.FAILED, Outcome.UNCHANGED})


class Policy(str, enum.Enum):
    """``seed``: the upstream rule (default). ``strict``: Failed is terminal and late creates are refused."""

    SEED = "seed"
    STRICT = "strict"


class UpdateResult(NamedTuple):
    """What an update did: the rule that fired and the participant's status afterwards (None: no entry)."""

    outcome: Outcome
    status: Optional[KVPoll]


OPEN = frozenset({KVPoll.Bootstrapping, KVPoll.WaitingForInput, KVPoll.Transferring})
"""The statuses of an entry that has not concluded: what a peer's failure, a cancel or a sweep fails."""

STRICT_CREATORS = frozenset({KVPoll.Bootstrapping, KVPoll.WaitingForInput})
"""The statuses that may create a missing entry under the strict policy."""


def to_status(value: object) -> KVPoll:
    """``value`` as a :class:`KVPoll`; raises :class:`InvalidStatusError` for anything but a member or an int 0..4."""
    if isinstance(value, KVPoll):
        return value
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidStatusError(
            f"invalid status {value!r} ({type(value).__name__}): expected a KVPoll member or an int 0..4"
        )
    try:
        return KVPoll(value)
    except ValueError:
        raise InvalidStatusError(f"invalid status {value!r}: expected an int 0..4 (Failed..Success)") from None


def to_policy(value: object) -> Policy:
    """Return ``value`` as a :class:`Policy`; raise :class:`InvalidArgumentError` otherwise."""
    try:
        return Policy(value)
    except ValueError:
        raise InvalidArgumentError(f"invalid policy {value!r}: expected 'seed' or 'strict'") from None


class Step(NamedTuple):
    """An entry reached ``status`` at ``at_ms``: Unix milliseconds, by Redis' clock (:mod:`kvstatus.timeline`)."""

    status: KVPoll
    at_ms: int


class Cleared(NamedTuple):
    """What a ``clear`` or ``pop`` removed: whether anything, the entry's status (None: none or junk), its timeline."""

    removed: bool
    status: Optional[KVPoll]
    timeline: tuple[Step, ...]


class ParticipantEntry(NamedTuple):
    """One participant's entry in a room: its status (None if only a reason is left) and failure reason."""

    status: Optional[KVPoll]
    reason: Optional[str]


class ClearedEntry(NamedTuple):
    """One participant's ``clear()`` in its room's tombstone. Unix seconds by Redis' clock: ``cleared_at``, and
    ``late_failed_at`` of the first (ignored) Failed after it, or None; ``status``: the last one (None: junk)."""

    cleared_at: float
    status: Optional[KVPoll]
    late_failed_at: Optional[float] = None

    def describe(self, participant: str, now: float) -> str:
        """E.g. "cleared 3 s ago by prefill-0 at Success; a late abort arrived 1 s after the clear"."""
        status = "an unknown status" if self.status is None else self.status.name
        text = f"cleared {elapsed_text(now - self.cleared_at)} ago by {participant} at {status}"
        if self.late_failed_at is not None:
            text += f"; a late abort arrived {elapsed_text(self.late_failed_at - self.cleared_at)} after the clear (ignored)"
        return text


def elapsed_text(delta: float) -> str:
    """A span in seconds as "3.0 s" (under 10 s) or "42 s"; a negative span (clock skew) reads 0."""
    return f"{max(delta, 0.0):.0f} s" if delta >= 10 else f"{max(delta, 0.0):.1f} s"


class Tombstone(NamedTuple):
    """A room's short-lived record of its clears: participant -> :class:`ClearedEntry`; ``ttl_ms`` left (ms)."""

    cleared: dict[str, ClearedEntry]
    ttl_ms: Optional[int]

    def describe(self, now: Optional[float] = None) -> list[str]:
        """One sentence per cleared participant, latest clear first (``now``: Unix seconds, default the local clock)."""
        now = time.time() if now is None else now
        ordered = sorted(self.cleared.items(), key=lambda item: item[1].cleared_at, reverse=True)
        return [entry.describe(name, now) for name, entry in ordered]


class Stage(str, enum.Enum):
    """Where a room failed first: the failing entry's status before it failed, or what failed it."""

    BOOTSTRAP = "bootstrap"  # the entry was Bootstrapping
    WAITING = "waiting"  # WaitingForInput
    TRANSFER = "transfer"  # Transferring (or Success: failed after its transfer)
    LEASE_LOST = "lease-lost"  # a sweep or a peer's watch failed the entry of a participant that lost its lease
    SUPERSEDED = "superseded"  # a peer's watch failed the entry of a participant that restarted under its name
    CANCELLED = "cancelled"  # a router or an operator cancelled the room (store.cancel, kvstatus cancel)


class FailureRecord(NamedTuple):
    """A room's first failure. ``at_ms``: Redis' clock, Unix milliseconds; ``origin``: the participant whose
    entry failed, or who cancelled; ``reason``: its recorded failure reason ("" when none was given)."""

    at_ms: int
    stage: Stage
    origin: str
    reason: str

    @property
    def at(self) -> float:
        """``at_ms`` in Unix seconds."""
        return self.at_ms / 1000

    def to_json(self) -> dict[str, object]:
        """As JSON (``kvstatus get --json``, the board): ``at`` in Unix seconds, as a tombstone's ``cleared_at``."""
        return {"stage": self.stage.value, "origin": self.origin, "reason": self.reason, "at": self.at}

    def describe(self) -> str:
        """E.g. "cancelled by router-1: client went away", "failed at transfer by prefill-0 (no reason given)" or
        "failed: participant prefill-0 lost its lease" (a lost lease or a restart: the reason names the peer)."""
        if self.stage in (Stage.LEASE_LOST, Stage.SUPERSEDED):
            what = "lost its lease" if self.stage is Stage.LEASE_LOST else "restarted"
            return f"failed: {self.reason}" if self.reason else f"failed: participant {self.origin} {what}"
        what = "cancelled" if self.stage is Stage.CANCELLED else f"failed at {self.stage.value}"
        by = f"{what} by {self.origin}"
        return f"{by}: {self.reason}" if self.reason else f"{by} (no reason given)"


class RoomView(NamedTuple):
    """Everything stored for one room. ``ttl_ms``: the time left (ms); None when the room does not exist or has no
    TTL (a leak). ``tombstone``: its record of recent clears, None when none (and in views built by SCAN).
    ``failure``: its first failure, or None. ``timelines``: participant -> the :class:`Step` of each status its
    entry reached (empty in a near cache's views). ``ignored``: the message of each junk value left out
    (docs/security.md ("Junk values: what each reader does")). ``stamps``: participant -> the epoch of the lease
    incarnation that wrote its entry (``lua/update.lua``'s fence)."""

    room: int
    participants: dict[str, ParticipantEntry]
    ttl_ms: Optional[int]
    tombstone: Optional[Tombstone] = None
    failure: Optional[FailureRecord] = None
    timelines: dict[str, tuple[Step, ...]] = {}
    ignored: tuple[str, ...] = ()
    stamps: dict[str, int] = {}

    @property
    def exists(self) -> bool:
        """True when the room key holds anything: an entry, or a cancel's failure record alone."""
        return bool(self.participants) or self.failure is not None

    @property
    def cleared(self) -> bool:
        """True when the room does not exist but its tombstone says it was cleared (not expired, not never created)."""
        return not self.participants and self.tombstone is not None and bool(self.tombstone.cleared)


class LeaseState(enum.IntEnum):
    """A participant's lease as a reader sees it; the integer is what ``lua/room_statuses.lua`` returns."""

    NONE = 0  # never held a lease (or its record expired): never "lost"
    ALIVE = 1
    LOST = 2  # expired (by Redis' clock) or released


class RoomConsensus(NamedTuple):
    """A room's status over its expected participants: ``reason`` why it is Failed (if recorded), ``lost`` those
    whose lease is lost, ``missing`` those with no entry yet."""

    status: KVPoll
    reason: Optional[str] = None
    lost: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()


@runtime_checkable
class StoreObserver(Protocol):
    """The hooks a store calls. Every method must be cheap and must not raise."""

    def on_call(self, operation: str, seconds: float) -> None:
        """One store call sent to Redis took ``seconds`` (failed ones too); ``operation`` is the method's name."""

    def on_update(self, result: UpdateResult) -> None:
        """``update_status`` returned ``result``."""

    def on_updates(self, results: Iterable[UpdateResult]) -> None:
        """``update_many`` returned these results."""

    def on_error(self, exc: BaseException) -> None:
        """A store call sent to Redis raised ``exc`` to its caller (``check_status``'s KeyError is no error)."""

    def on_resend(self) -> None:
        """A store call was sent again: NOSCRIPT healed, or a resend while a failover moves the topology."""

    def on_cache_hit(self, count: int = 1) -> None:
        """``count`` room reads were answered by the near cache."""

    def on_cache_miss(self, count: int = 1) -> None:
        """``count`` rooms were read from Redis by the near cache."""

    def on_cache_invalidation(self, count: int = 1) -> None:
        """``count`` cached rooms were dropped by Redis invalidation messages (a null one drops every room)."""

    def set_cache_size(self, entries: int) -> None:
        """The near cache holds ``entries`` rooms now."""

    def for_participant(self, participant: Optional[str]) -> StoreObserver:
        """The observer of ``store.for_participant(participant)``."""


@runtime_checkable
class ClearedObserver(Protocol):
    """The optional hook: an observer that has it hears of each timeline a ``clear`` or ``pop`` removed."""

    def on_cleared(self, steps: tuple[Step, ...]) -> None:
        """``clear`` or ``pop`` removed an entry whose timeline was ``steps`` (never empty). Cheap, must not raise."""


HOOKS: tuple[str, ...] = tuple(name for name, hook in vars(StoreObserver).items() if callable(hook) and name[0] != "_")
"""The names of :class:`StoreObserver`'s methods, in its order: what a ``metrics`` object must have."""


def _missing_hooks(metrics: object) -> list[str]:
    """The hooks of :data:`HOOKS` that ``metrics`` lacks (or holds as something not callable)."""
    return [name for name in HOOKS if not callable(getattr(metrics, name, None))]


def _is_observer(metrics: object) -> TypeGuard[StoreObserver]:
    """Whether ``metrics`` has every hook of :data:`HOOKS` (the whole :class:`StoreObserver` protocol)."""
    return not _missing_hooks(metrics)


def check_observer(metrics: object) -> Optional[StoreObserver]:
    """``metrics`` if it is None or has every hook; raise :class:`InvalidArgumentError` naming what it lacks."""
    if metrics is None or _is_observer(metrics):
        return metrics
    raise InvalidArgumentError(
        f"invalid metrics {type(metrics).__name__}: an observer needs the methods {', '.join(_missing_hooks(metrics))} "
        "(kvstatus.observe.metrics.StoreMetrics is one)"
    )
