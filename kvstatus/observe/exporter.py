"""``kvstatus exporter``: Prometheus ``/metrics`` for one or more namespaces (needs ``kvstatus[metrics]``).

Each namespace has a :class:`~kvstatus.observe.scanner.PassLoop` that walks it
with a bounded, incremental SCAN every ``interval`` seconds; a scrape only
reads the last completed pass, so scraping never touches Redis. While Redis
does not answer, ``kvstatus_up`` is 0 and the room gauges are left out (a gap
in the graphs, not stale numbers); the exporter keeps running and recovers by
itself.
"""

from __future__ import annotations

import signal
import threading
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Callable, Optional

from prometheus_client import CollectorRegistry, ProcessCollector, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kvstatus.admin.stats import bucket_labels
from kvstatus.keys import KeySchema
from kvstatus.observe.scanner import LostParticipants, PassLoop
from kvstatus.operations import DEFAULT_TTL_SECONDS
from kvstatus.rule import KVPoll, Stage

DEFAULT_PORT = 9808
DEFAULT_MAX_PARTICIPANTS = 50
OTHER_PARTICIPANTS = "(other)"
"""The ``participant`` label of the entries of every participant past the cap (no participant name has
parentheses, so it cannot collide with one)."""

METRICS: dict[str, str] = {
    "kvstatus_up": "1 if Redis answered the exporter's last read of this namespace, else 0.",
    "kvstatus_rooms": "Live rooms in the namespace (last completed pass).",
    "kvstatus_entries": "Rooms in which a participant has a status: one entry per (room, participant). Only the "
    "participants with the most entries get their own label (--max-participants, default 50); the others are summed "
    'under participant="(other)", so a namespace has at most 5 x (max_participants + 1) of these series.',
    "kvstatus_keys_without_ttl": "Room keys without a TTL: a leak, kvstatus never writes one.",
    "kvstatus_corrupted_rooms": "Rooms holding a value kvstatus does not write (skipped by the counts).",
    "kvstatus_rooms_by_ttl_left": "Live rooms by TTL left, in buckets of seconds.",
    "kvstatus_rooms_by_failure_stage": "Live rooms whose first failure is recorded (room:fate), by the stage it "
    "failed at: bootstrap, waiting, transfer, lease-lost, superseded, cancelled. A room whose record kvstatus cannot read is "
    "counted in kvstatus_corrupted_rooms instead.",
    "kvstatus_oldest_non_terminal_age_seconds": "Seconds since the last write of the non-terminal room that went "
    "longest without progress (store TTL minus its TTL left); 0 if there is none.",
    "kvstatus_rooms_on_lost_participants": "Rooms holding an open entry of a participant whose lease is lost: "
    "what kvstatus sweep would fail (0 while no lease source is configured: see kvstatus_lease_tracking).",
    "kvstatus_lease_tracking": "1 if rooms on lost participants are computed from participant leases, else 0.",
    "kvstatus_exporter_scan_duration_seconds": "Seconds the last completed pass over the namespace took.",
    "kvstatus_exporter_scanned_keys": "Keys the last completed pass read.",
    "kvstatus_exporter_last_success_timestamp_seconds": "Unix time the last pass completed (0: none yet).",
    "kvstatus_exporter_scan_errors": "Passes that ended because Redis failed.",
}
"""Every metric the exporter serves (names without a counter's ``_total``), with its help text."""


class NamespaceCollector(Collector):
    """Turns the state of each namespace's :class:`PassLoop` into metric families at scrape time."""

    def __init__(
        self,
        loops: Sequence[PassLoop],
        ttl: float = DEFAULT_TTL_SECONDS,
        max_participants: int = DEFAULT_MAX_PARTICIPANTS,
    ) -> None:
        if isinstance(max_participants, bool) or not isinstance(max_participants, int) or max_participants < 0:
            raise ValueError(f"invalid max_participants {max_participants!r}: expected an int >= 0")
        self.loops = list(loops)
        self.ttl = ttl
        self.max_participants = max_participants

    def collect(self) -> Iterable[Metric]:
        def gauge(name: str, labels: Sequence[str] = ()) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, METRICS[name], labels=["namespace", *labels])

        up = gauge("kvstatus_up")
        rooms, entries = gauge("kvstatus_rooms"), gauge("kvstatus_entries", ["participant", "status"])
        no_ttl, corrupted = gauge("kvstatus_keys_without_ttl"), gauge("kvstatus_corrupted_rooms")
        by_ttl = gauge("kvstatus_rooms_by_ttl_left", ["bucket"])
        by_stage = gauge("kvstatus_rooms_by_failure_stage", ["stage"])  # a closed enum: 6 series per namespace
        oldest, lost = gauge("kvstatus_oldest_non_terminal_age_seconds"), gauge("kvstatus_rooms_on_lost_participants")
        leases = gauge("kvstatus_lease_tracking")
        duration, scanned = gauge("kvstatus_exporter_scan_duration_seconds"), gauge("kvstatus_exporter_scanned_keys")
        success = gauge("kvstatus_exporter_last_success_timestamp_seconds")
        errors = CounterMetricFamily(
            "kvstatus_exporter_scan_errors", METRICS["kvstatus_exporter_scan_errors"], labels=["namespace"]
        )
        for loop in self.loops:
            state = loop.state
            ns = state.namespace
            up.add_metric([ns], 1.0 if state.up else 0.0)
            errors.add_metric([ns], state.errors)
            latest = state.latest
            success.add_metric([ns], latest.finished_at if latest else 0.0)
            if latest is None:
                continue
            duration.add_metric([ns], latest.duration)
            scanned.add_metric([ns], latest.keys_scanned)
            if not state.up:
                continue
            stats = latest.stats
            rooms.add_metric([ns], stats.rooms)
            for participant, counts in capped(stats.by_participant, self.max_participants):
                for status in KVPoll:
                    entries.add_metric([ns, participant, status.name], counts.get(status, 0))
            no_ttl.add_metric([ns], stats.keys_without_ttl)
            corrupted.add_metric([ns], stats.corrupted_rooms)
            for label in bucket_labels():
                by_ttl.add_metric([ns, label], stats.ttl_left.get(label, 0))
            for stage in Stage:
                by_stage.add_metric([ns, stage.value], latest.failures_by_stage.get(stage, 0))
            age = 0.0
            if stats.oldest and stats.oldest[0].ttl_ms is not None:
                age = max(self.ttl - stats.oldest[0].ttl_ms / 1000, 0.0)
            oldest.add_metric([ns], age)
            lost.add_metric([ns], latest.rooms_on_lost_participants)
            leases.add_metric([ns], 1.0 if latest.lease_tracking else 0.0)
        return [
            up,
            rooms,
            entries,
            no_ttl,
            corrupted,
            by_ttl,
            by_stage,
            oldest,
            lost,
            leases,
            duration,
            scanned,
            success,
            errors,
        ]


def capped(by_participant: Mapping[str, Counter], most: int) -> list[tuple[str, Counter]]:
    """The ``most`` participants with the most entries (ties by name), sorted by name, then the rest summed as
    :data:`OTHER_PARTICIPANTS` (only if there is a rest)."""
    ranked = sorted(by_participant.items(), key=lambda item: (-sum(item[1].values()), item[0]))
    kept = sorted(ranked[:most])
    if len(ranked) > most:
        rest: Counter = Counter()
        for _, counts in ranked[most:]:
            rest.update(counts)
        kept.append((OTHER_PARTICIPANTS, rest))
    return kept


def build_registry(
    loops: Sequence[PassLoop], ttl: float = DEFAULT_TTL_SECONDS, max_participants: int = DEFAULT_MAX_PARTICIPANTS
) -> CollectorRegistry:
    """A registry with the namespaces' collector and the exporter's own process metrics."""
    registry = CollectorRegistry()
    registry.register(NamespaceCollector(loops, ttl, max_participants))
    ProcessCollector(registry=registry)
    return registry


def make_loops(
    client: Any,
    schemas: Sequence[KeySchema],
    *,
    interval: float,
    batch: int,
    pause: float,
    lost_participants: Optional[LostParticipants] = None,
) -> list[PassLoop]:
    return [
        PassLoop(client, schema, interval=interval, batch=batch, pause=pause, lost_participants=lost_participants)
        for schema in schemas
    ]


def run_exporter(
    client: Any,
    schemas: Sequence[KeySchema],
    *,
    port: int = DEFAULT_PORT,
    host: str = "0.0.0.0",
    interval: float = 15.0,
    batch: int = 500,
    pause: float = 0.0,
    ttl: float = DEFAULT_TTL_SECONDS,
    max_participants: int = DEFAULT_MAX_PARTICIPANTS,
    lost_participants: Optional[LostParticipants] = None,
    ready: Optional[Callable[[str, int], None]] = None,
    stop: Optional[threading.Event] = None,
) -> int:
    """Serve ``/metrics`` until SIGTERM or SIGINT (or ``stop`` is set); returns 0 (the exit code).

    ``max_participants`` caps the ``participant`` label of ``kvstatus_entries`` (see :data:`METRICS`).

    ``ready(host, port)`` is called once the port is bound (``port=0`` picks a free one).
    Signal handlers are installed only when called from the main thread.
    """
    stop = stop or threading.Event()
    loops = make_loops(
        client, schemas, interval=interval, batch=batch, pause=pause, lost_participants=lost_participants
    )
    server, thread = start_http_server(port, addr=host, registry=build_registry(loops, ttl, max_participants))
    previous: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, lambda *_: stop.set())
    try:
        for loop in loops:
            loop.start()
        if ready is not None:
            bound_host, bound_port = server.server_address[:2]
            ready(str(bound_host), int(bound_port))
        while not stop.wait(0.5):
            pass
    finally:
        for loop in loops:
            loop.stop()
        server.shutdown()
        server.server_close()
        thread.join(5)
        for number, handler in previous.items():
            signal.signal(number, handler)
    return 0
