"""Prometheus metrics of the library: what the update rule did, how long calls took, errors, resends, near cache,
and how long cleared entries spent in each stage.

Needs the ``kvstatus[metrics]`` extra (prometheus_client). A store is given one
:class:`StoreMetrics` observer; every label of its series (namespace,
participant, outcome, operation, error type) is resolved once when the
observer is built, so a call costs one or two pre-bound child updates and no
label lookup. No label ever carries a room id: cardinality is bounded by
namespaces x participants x the fixed outcome/operation/error sets. The stage
histogram is coarser still: namespace x role (:func:`kvstatus.keys.role_of`:
prefill, decode, other) x stage, never a participant.

The store calls, after each operation (the wiring lives in the store's send loop)::

    metrics.on_call("update_status", seconds)   # latency, every operation
    metrics.on_update(result)                   # one UpdateResult
    metrics.on_updates(results.values())        # update_many
    metrics.on_error(exc)                       # a kvstatus error raised to the caller
    metrics.on_resend()                         # a call sent again (NOSCRIPT heal, failover)
    metrics.on_cleared(steps)                   # optional: the timeline of an entry clear/pop removed

and the near cache calls :meth:`StoreMetrics.on_cache_hit`, ``on_cache_miss``,
``on_cache_invalidation`` and ``set_cache_size``.
"""

from __future__ import annotations

import threading
from collections import Counter as Tally
from collections.abc import Iterable
from operator import itemgetter
from typing import Optional
from weakref import WeakKeyDictionary

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

from kvstatus import errors
from kvstatus.keys import DEFAULT_PARTICIPANT, role_of
from kvstatus.model import Outcome, Step, UpdateResult
from kvstatus.timeline import STAGES, stage_seconds

OPERATIONS: tuple[str, ...] = (
    "update_status",
    "update_many",
    "check_status",
    "get",
    "get_many",
    "clear",
    "pop",
    "record_failure",
    "room",
)
"""The store operations whose latency is recorded; any other name is recorded as ``other``."""

# Seconds: from a loopback update (BENCHMARKS.md) up to a batch of 1000 or a failover resend, which reach seconds.
LATENCY_BUCKETS: tuple[float, ...] = (
    0.00005,
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    10.0,
)

# Seconds. A healthy stage takes milliseconds to seconds; SGLang's bootstrap and waiting timeouts are 300 s.
STAGE_BUCKETS: tuple[float, ...] = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
)

ERROR_TYPES: tuple[str, ...] = tuple(
    sorted(
        name
        for name, value in vars(errors).items()
        if isinstance(value, type) and issubclass(value, errors.KVStatusError)
    )
)
"""Every kvstatus exception class name; anything else is counted as ``other``."""

OTHER = "other"
_outcome_of = itemgetter(0)


class Instruments:
    """The metric families, registered once per registry (see :func:`instruments`)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        store = ["namespace", "participant"]
        self.updates = Counter(
            "kvstatus_updates",
            "Status updates by the row of the update rule that fired.",
            store + ["outcome"],
            registry=registry,
        )
        self.calls = Histogram(
            "kvstatus_call_duration_seconds",
            "Latency of store calls in seconds, by operation.",
            store + ["operation"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.errors = Counter(
            "kvstatus_errors",
            "Errors raised to callers, by kvstatus exception type.",
            store + ["type"],
            registry=registry,
        )
        self.resends = Counter(
            "kvstatus_resends", "Calls sent again after NOSCRIPT or during a failover.", store, registry=registry
        )
        self.cache_hits = Counter(
            "kvstatus_nearcache_hits", "Reads answered by the near cache.", store, registry=registry
        )
        self.cache_misses = Counter(
            "kvstatus_nearcache_misses", "Reads the near cache sent to Redis.", store, registry=registry
        )
        self.cache_invalidations = Counter(
            "kvstatus_nearcache_invalidations",
            "Near-cache entries dropped by a Redis invalidation message.",
            store,
            registry=registry,
        )
        self.cache_size = Gauge("kvstatus_nearcache_entries", "Rooms held by the near cache.", store, registry=registry)
        self.stages = Histogram(
            "kvstatus_stage_duration_seconds",
            "Seconds a cleared entry spent in each stage of its timeline, by the participant's role.",
            ["namespace", "role", "stage"],
            buckets=STAGE_BUCKETS,
            registry=registry,
        )


_by_registry: WeakKeyDictionary[CollectorRegistry, Instruments] = WeakKeyDictionary()
_lock = threading.Lock()


def instruments(registry: Optional[CollectorRegistry] = None) -> Instruments:
    """The kvstatus metric families in ``registry`` (default: prometheus_client's global one), created on first use."""
    registry = REGISTRY if registry is None else registry
    with _lock:
        found = _by_registry.get(registry)
        if found is None:
            found = _by_registry[registry] = Instruments(registry)
        return found


def _nothing() -> None:
    """What an outcome code no script returns counts (none: codes start at 1)."""


class StoreMetrics:
    """The observer of one store (one namespace, one participant): every child pre-bound at construction.

    Methods are safe to call from several threads (prometheus_client children lock).
    """

    __slots__ = (
        "namespace",
        "participant",
        "_registry",
        "_updates",
        "_calls",
        "_other_call",
        "_errors",
        "_error_of_type",
        "_resends",
        "_hits",
        "_misses",
        "_invalidations",
        "_size",
        "_stages",
    )

    def __init__(
        self, namespace: str, participant: Optional[str] = None, registry: Optional[CollectorRegistry] = None
    ) -> None:
        self.namespace = namespace
        self.participant = participant or DEFAULT_PARTICIPANT
        self._registry = registry
        family = instruments(registry)
        labels = (self.namespace, self.participant)
        # Indexed by the outcome's integer (1..7), so on_update is one tuple index.
        by_code = {o.value: family.updates.labels(*labels, o.name).inc for o in Outcome}
        self._updates = tuple(by_code.get(code, _nothing) for code in range(max(by_code) + 1))
        self._calls = {op: family.calls.labels(*labels, op).observe for op in OPERATIONS}
        self._other_call = family.calls.labels(*labels, OTHER).observe
        self._errors = {name: family.errors.labels(*labels, name).inc for name in ERROR_TYPES + (OTHER,)}
        self._error_of_type: dict[type, object] = {}
        self._resends = family.resends.labels(*labels).inc
        self._hits = family.cache_hits.labels(*labels).inc
        self._misses = family.cache_misses.labels(*labels).inc
        self._invalidations = family.cache_invalidations.labels(*labels).inc
        self._size = family.cache_size.labels(*labels).set
        role = role_of(self.participant)
        self._stages = {stage: family.stages.labels(self.namespace, role, stage).observe for stage in STAGES}

    def for_participant(self, participant: Optional[str]) -> StoreMetrics:
        """The observer of the same namespace for another participant (as ``store.for_participant``)."""
        return StoreMetrics(self.namespace, participant, self._registry)

    def on_update(self, result: UpdateResult) -> None:
        """Count one update by the outcome that fired."""
        self._updates[result[0]]()

    def on_updates(self, results: Iterable[UpdateResult]) -> None:
        """Count a batch of updates (``update_many(...).values()``): one increment per distinct outcome."""
        updates = self._updates
        for outcome, count in Tally(map(_outcome_of, results)).items():
            updates[outcome](count)

    def on_call(self, operation: str, seconds: float) -> None:
        """Record the latency in seconds of one store call named ``operation`` (see :data:`OPERATIONS`)."""
        self._calls.get(operation, self._other_call)(seconds)

    def on_error(self, exc: BaseException) -> None:
        """Count an error raised to the caller by its kvstatus exception type (``other`` for anything else)."""
        cls = type(exc)
        inc = self._error_of_type.get(cls)
        if inc is None:
            name = next(
                (
                    c.__name__
                    for c in cls.__mro__
                    if getattr(errors, c.__name__, None) is c and c.__name__ in self._errors
                ),
                OTHER,
            )
            inc = self._error_of_type[cls] = self._errors[name]
        inc()  # type: ignore[operator]

    def on_resend(self) -> None:
        """Count one call sent again (NOSCRIPT healed, or a resend while the topology moves)."""
        self._resends()

    def on_cache_hit(self, count: int = 1) -> None:
        """Count reads answered from the near cache."""
        self._hits(count)

    def on_cache_miss(self, count: int = 1) -> None:
        """Count reads the near cache had to send to Redis."""
        self._misses(count)

    def on_cache_invalidation(self, count: int = 1) -> None:
        """Count near-cache entries dropped by invalidation messages."""
        self._invalidations(count)

    def set_cache_size(self, entries: int) -> None:
        """Set the number of rooms the near cache holds now."""
        self._size(entries)

    def on_cleared(self, steps: tuple[Step, ...]) -> None:
        """Observe the seconds of each stage (:func:`kvstatus.timeline.stage_seconds`) of an entry that ``clear``
        or ``pop`` removed, ``steps`` being its timeline, under this participant's role."""
        stages = self._stages
        for stage, seconds in stage_seconds(steps).items():
            stages[stage](seconds)

    def __repr__(self) -> str:
        return f"StoreMetrics(namespace={self.namespace!r}, participant={self.participant!r})"
