"""``kvstatus exporter``: Prometheus ``/metrics`` for one or more namespaces (needs ``kvstatus[metrics]``).

Each namespace has a :class:`~kvstatus.observe.scanner.PassLoop` that walks it
with a bounded, incremental SCAN every ``interval`` seconds; a scrape only
reads the last completed pass, so scraping never touches Redis. While Redis
does not answer, ``kvstatus_up`` is 0 and the room gauges are left out (a gap
in the graphs, not stale numbers); the exporter keeps running and recovers by
itself.

Each pass also reads the rooms' tombstones and Redis' clock (:mod:`kvstatus.admin.health`): the open rooms'
waiting times (:mod:`kvstatus.observe.timings`), the health of each prefill-decode pair in the window (at
most ``max_pairs`` pairs keep their own labels, the rest are summed under ``(other)``), and ``/ready`` on
the same HTTP server: 200 when every pair is healthy, else 503 naming the unhealthy ones;
``/ready?pair=<prefill>,<decode>`` for one pair (404 when no room of it is in the window).
"""

from __future__ import annotations

import signal
import threading
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Callable, Optional
from urllib.parse import parse_qs

from prometheus_client import CollectorRegistry, ProcessCollector, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from kvstatus.admin.health import HealthSettings, PairHealth
from kvstatus.admin.stats import bucket_labels
from kvstatus.keys import DEFAULT_TTL_SECONDS, KeySchema
from kvstatus.model import KVPoll, Stage
from kvstatus.observe.scanner import LostParticipants, PassLoop
from kvstatus.observe.timings import OPEN_STATUSES

DEFAULT_PORT = 9808
DEFAULT_MAX_PARTICIPANTS = 50
DEFAULT_MAX_PAIRS = 50
OTHER_PARTICIPANTS = "(other)"
"""The ``participant`` label of the entries of every participant past the cap (no participant name has
parentheses, so it cannot collide with one); also the ``prefill`` and ``decode`` labels of the pairs past theirs."""
FIXED_SERIES = 23 + len(OPEN_STATUSES) * (1 + 12) + 1
"""Series per namespace that depend on no participant or pair: 23, the 3 oldest-open gauges, the histogram's
12 series (10 buckets, sum, count) per open status, and ``kvstatus_unhealthy_pairs``: 63."""
PAIR_SERIES = 4
"""Series per pair (succeeded, failed, stuck, unhealthy)."""


def series_bound(max_participants: int = DEFAULT_MAX_PARTICIPANTS, max_pairs: int = DEFAULT_MAX_PAIRS) -> int:
    """The most series one namespace has (without the process metrics): 522 with the defaults."""
    return FIXED_SERIES + 5 * (max_participants + 1) + PAIR_SERIES * (max_pairs + 1)


METRICS: dict[str, str] = {
    "kvstatus_up": "1 if Redis answered the exporter's last read of this namespace, else 0.",
    "kvstatus_rooms": "Live rooms in the namespace (last completed pass).",
    "kvstatus_entries": "Rooms in which a participant has a status: one entry per (room, participant), by the "
    "status its reads answer (an open entry in a room that failed is Failed: shared fate). Only the "
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
    "kvstatus_rooms_on_lost_participants": "Rooms holding an open entry of a participant whose lease is lost "
    "(what kvstatus sweep would fail), or one a participant that restarted under its name left (kvstatus ls "
    "--lost lists both; 0 while no lease source is configured: see kvstatus_lease_tracking).",
    "kvstatus_lease_tracking": "1 if rooms on lost participants are computed from participant leases, else 0.",
    "kvstatus_exporter_scan_duration_seconds": "Seconds the last completed pass over the namespace took.",
    "kvstatus_exporter_scanned_keys": "Keys the last completed pass read.",
    "kvstatus_exporter_last_success_timestamp_seconds": "Unix time the last pass completed (0: none yet).",
    "kvstatus_exporter_scan_errors": "Passes that ended because Redis failed.",
    "kvstatus_oldest_open_room_age_seconds": "Seconds since the first timeline step of the oldest open room "
    "(an open entry, no failure) with an entry in this status; 0 if there is none. Rooms without timelines "
    "are not seen.",
    "kvstatus_open_entry_status_seconds": "Seconds each open entry of an open room has sat in its current status "
    "(since its last timeline step), at the last pass.",
    "kvstatus_pair_succeeded_rooms": "Rooms of the prefill-decode pair that succeeded in the window (both sides "
    'cleared at Success). Past --max-pairs pairs (unhealthy ones first, then the busiest) the rest are summed under "(other)".',
    "kvstatus_pair_failed_rooms": "Rooms of the pair whose first failure (or a side's Failed clear) is in the window.",
    "kvstatus_pair_stuck_rooms": "Rooms of the pair open and not moving for --older-than.",
    "kvstatus_pair_unhealthy": "1 if the pair is unhealthy (failed + stuck >= threshold, nothing succeeded in the "
    "window; or, with lease tracking, a participant of it died or restarted and no room of it succeeded since); "
    'for "(other)", the number of unhealthy pairs summed in it.',
    "kvstatus_unhealthy_pairs": "Prefill-decode pairs that are unhealthy, all of them (not capped).",
}
"""Every metric the exporter serves (names without a counter's ``_total``), with its help text."""


class NamespaceCollector(Collector):
    """Turns the state of each namespace's :class:`PassLoop` into metric families at scrape time."""

    def __init__(
        self,
        loops: Sequence[PassLoop],
        ttl: float = DEFAULT_TTL_SECONDS,
        max_participants: int = DEFAULT_MAX_PARTICIPANTS,
        max_pairs: int = DEFAULT_MAX_PAIRS,
    ) -> None:
        for name, value in (("max_participants", max_participants), ("max_pairs", max_pairs)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"invalid {name} {value!r}: expected an int >= 0")
        self.loops = list(loops)
        self.ttl = ttl
        self.max_participants = max_participants
        self.max_pairs = max_pairs

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
        open_age = gauge("kvstatus_oldest_open_room_age_seconds", ["status"])
        in_status = HistogramMetricFamily(
            "kvstatus_open_entry_status_seconds",
            METRICS["kvstatus_open_entry_status_seconds"],
            labels=["namespace", "status"],
        )
        pair_labels = ["prefill", "decode"]
        pair_gauges = [
            gauge(f"kvstatus_pair_{what}", pair_labels)
            for what in ("succeeded_rooms", "failed_rooms", "stuck_rooms", "unhealthy")
        ]
        unhealthy = gauge("kvstatus_unhealthy_pairs")
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
            if latest.open_times is not None:
                for status in OPEN_STATUSES:
                    open_age.add_metric([ns, status.name], latest.open_times.oldest[status])
                    buckets = latest.open_times.cumulative(status)
                    in_status.add_metric([ns, status.name], buckets, latest.open_times.sums[status])
            if latest.health is not None:
                unhealthy.add_metric([ns], len(latest.health.unhealthy))
                for prefill, decode, values in capped_pairs(latest.health.pairs, self.max_pairs):
                    for family, value in zip(pair_gauges, values):
                        family.add_metric([ns, prefill, decode], value)
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
            open_age,
            in_status,
            *pair_gauges,
            unhealthy,
        ]


def capped_pairs(pairs: Sequence[PairHealth], most: int) -> list[tuple[str, str, tuple[int, int, int, int]]]:
    """(prefill, decode, (succeeded, failed, stuck, unhealthy)) of the ``most`` pairs that matter most
    (unhealthy first, then the most rooms, ties by name), sorted by name, then the rest summed under
    (``(other)``, ``(other)``), only if there is a rest; the rest's ``unhealthy`` counts its unhealthy pairs."""
    ranked = sorted(
        pairs, key=lambda p: (not p.unhealthy, -(p.succeeded + p.failed_total + p.stuck + p.open), p.prefill, p.decode)
    )

    def values(p: PairHealth) -> tuple[int, int, int, int]:
        return (p.succeeded, p.failed_total, p.stuck, int(p.unhealthy))

    kept = sorted((p.prefill, p.decode, values(p)) for p in ranked[:most])
    if len(ranked) > most:
        rest = [values(p) for p in ranked[most:]]
        summed = tuple(sum(column) for column in zip(*rest))
        kept.append((OTHER_PARTICIPANTS, OTHER_PARTICIPANTS, summed))  # type: ignore[arg-type]
    return kept


def readiness(loops: Sequence[PassLoop], pair: Optional[str] = None) -> tuple[int, str]:
    """The ``/ready`` answer (HTTP status, text): 200 when every pair (or ``pair``, ``<prefill>,<decode>``) is
    healthy at the last completed pass of every namespace; 503 naming the unhealthy pairs, or when a namespace
    has no completed pass or Redis did not answer its last read; 404 for a pair with no room in the window;
    400 for a ``pair`` that is not ``<prefill>,<decode>``."""
    wanted: Optional[tuple[str, str]] = None
    if pair is not None:
        prefill, comma, decode = pair.partition(",")
        if not comma or not prefill or not decode or "," in decode:
            return 400, f"bad pair {pair[:100]!r}: expected pair=<prefill instance>,<decode instance>\n"
        wanted = (prefill, decode)
    blocked, bad, known = [], [], False
    for loop in loops:
        state = loop.state
        health = state.latest.health if state.latest is not None else None
        if health is None:
            blocked.append(f"namespace {state.namespace}: no completed pass yet")
            continue
        if not state.up:
            blocked.append(f"namespace {state.namespace}: Redis did not answer the last read")
        for found in health.pairs:
            if wanted is None or (found.prefill, found.decode) == wanted:
                known = True
                if found.unhealthy:
                    bad.append(f"{found.name} ({state.namespace})")
    if blocked:
        return 503, "not ready: " + "; ".join(blocked) + "\n"
    if wanted is not None and not known:
        return 404, f"unknown pair {','.join(wanted)[:100]!r}: no room of it in the window\n"
    if bad:
        shown = ", ".join(bad[:20]) + (f" and {len(bad) - 20} more" if len(bad) > 20 else "")
        return 503, f"unhealthy: {shown}\n"
    return 200, "ready\n"


_REASONS = {200: "200 OK", 400: "400 Bad Request", 404: "404 Not Found", 503: "503 Service Unavailable"}


def with_ready(app: Callable[..., Any], loops: Sequence[PassLoop]) -> Callable[..., Any]:
    """The WSGI ``app`` (prometheus_client's) with ``/ready`` (see :func:`readiness`) in front of it."""

    def serve(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") != "/ready":
            return app(environ, start_response)  # type: ignore[no-any-return]
        pair = parse_qs(environ.get("QUERY_STRING", "")).get("pair", [None])[0]
        code, text = readiness(loops, pair)
        start_response(_REASONS[code], [("Content-Type", "text/plain; charset=utf-8"), ("Cache-Control", "no-store")])
        return [text.encode()]

    return serve


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
    loops: Sequence[PassLoop],
    ttl: float = DEFAULT_TTL_SECONDS,
    max_participants: int = DEFAULT_MAX_PARTICIPANTS,
    max_pairs: int = DEFAULT_MAX_PAIRS,
) -> CollectorRegistry:
    """A registry with the namespaces' collector and the exporter's own process metrics."""
    registry = CollectorRegistry()
    registry.register(NamespaceCollector(loops, ttl, max_participants, max_pairs))
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
    health: Optional[HealthSettings] = None,
) -> list[PassLoop]:
    """A pass loop per namespace; ``health`` (default :class:`HealthSettings`'s defaults) judges the pairs."""
    settings = health or HealthSettings()
    return [
        PassLoop(
            client,
            schema,
            interval=interval,
            batch=batch,
            pause=pause,
            lost_participants=lost_participants,
            health=settings,
        )
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
    max_pairs: int = DEFAULT_MAX_PAIRS,
    health: Optional[HealthSettings] = None,
    lost_participants: Optional[LostParticipants] = None,
    ready: Optional[Callable[[str, int], None]] = None,
    stop: Optional[threading.Event] = None,
) -> int:
    """Serve ``/metrics`` and ``/ready`` until SIGTERM or SIGINT (or ``stop`` is set); returns 0 (the exit code).

    ``max_participants`` caps the ``participant`` label of ``kvstatus_entries``, ``max_pairs`` the pairs of the
    ``kvstatus_pair_*`` gauges (see :data:`METRICS`, :func:`series_bound`); ``health`` sets the pairs' window,
    stuck bound and threshold (default :class:`HealthSettings`: 60 s, 30 s, 1).

    ``ready(host, port)`` is called once the port is bound (``port=0`` picks a free one).
    Signal handlers are installed only when called from the main thread.
    """
    stop = stop or threading.Event()
    loops = make_loops(
        client, schemas, interval=interval, batch=batch, pause=pause, lost_participants=lost_participants, health=health
    )
    registry = build_registry(loops, ttl, max_participants, max_pairs)
    server, thread = start_http_server(port, addr=host, registry=registry)
    metrics_app = server.get_app()
    assert metrics_app is not None
    server.set_app(with_ready(metrics_app, loops))
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
