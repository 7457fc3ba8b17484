"""A bounded, incremental pass over a namespace, repeated on an interval in a background thread.

Shared by ``kvstatus exporter`` and ``kvstatus serve``. A pass is the SCAN of
:func:`kvstatus.admin.reads.iter_room_keys` advanced one batch per step (one
SCAN call plus one pipelined HGETALL+PTTL round trip of at most ``batch``
keys), with an optional pause between steps, so Redis never runs a long
command on our behalf and the load is capped at ``batch / pause`` keys per
second. Readers only ever see the last *completed* pass.

Counting is :class:`kvstatus.admin.stats.StatsBuilder`, the code behind
``kvstatus stats``, plus the rooms whose first failure is recorded, by stage
(:attr:`PassResult.failures_by_stage`); the optional per-room snapshot is
:class:`kvstatus.admin.watch.Snapshot`, the state ``kvstatus watch`` diffs.

With ``health`` settings (the exporter's passes), the SCAN also matches the rooms' tombstones and each batch
reads them beside the rooms in the same round trip, plus one ``TIME``: the pass then also counts the health
of each prefill-decode pair (:mod:`kvstatus.admin.health`) and the open rooms' waiting times
(:mod:`kvstatus.observe.timings`), at Redis' clock.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional

from kvstatus.admin import health as pair_health
from kvstatus.admin.health import Health, HealthBuilder, HealthSettings
from kvstatus.admin.reads import DEFAULT_BATCH, Deaths, iter_room_keys, read_rooms, server_ms
from kvstatus.admin.stats import TERMINAL, Stats, StatsBuilder
from kvstatus.admin.watch import RoomState, Snapshot, room_state
from kvstatus.errors import KVStatusError, mask_url
from kvstatus.keys import KeySchema
from kvstatus.model import KVPoll, RoomView, Stage
from kvstatus.observe.timings import OpenTimes

log = logging.getLogger("kvstatus.observe")

LostParticipants = Callable[[Any, KeySchema], Collection[str]]
"""(client, schema) -> the participants whose lease is lost, asked once at the start of each pass.

:func:`kvstatus.admin.reads.read_deaths` is the one the exporter and the board
pass (a :class:`~kvstatus.admin.reads.Deaths`, a collection of the lost names
that knows every lease): rooms holding an open (neither Success nor Failed)
entry of a returned participant, or one a restarted participant left, are
counted as rooms on lost participants, and the pass's health judges the pairs
with them (:class:`~kvstatus.admin.health.HealthBuilder`).
:func:`kvstatus.admin.reads.lost_participants` (names only) still serves. Without a hook, that count is
reported as 0 and :attr:`PassResult.lease_tracking` is False.
"""


@dataclass(frozen=True)
class PassResult:
    """What one completed pass found. Times: ``finished_at`` Unix seconds, ``duration`` seconds.

    ``failures_by_stage``: the rooms whose first failure is recorded, by its stage (stages without one are
    left out). A room whose record kvstatus cannot read is counted in ``stats.corrupted_rooms`` instead, as
    every room holding a value kvstatus does not write. ``health`` and ``open_times``: None unless the pass
    was given health settings."""

    namespace: str
    stats: Stats
    snapshot: Optional[Snapshot]
    rooms_on_lost_participants: int
    lease_tracking: bool
    keys_scanned: int
    finished_at: float
    duration: float
    failures_by_stage: Mapping[Stage, int] = field(default_factory=dict)
    health: Optional[Health] = None
    open_times: Optional[OpenTimes] = None
    deaths: Deaths = field(default_factory=Deaths)
    """The leases read at the pass's start (empty unless its hook was :func:`kvstatus.admin.reads.read_deaths`)."""


class NamespacePass:
    """One pass over ``schema``'s namespace; :meth:`step` reads one batch and returns True once the pass is done."""

    def __init__(
        self,
        client: Any,
        schema: KeySchema,
        *,
        batch: int = DEFAULT_BATCH,
        oldest: int = 1,
        keep_rooms: bool = False,
        lost_participants: Optional[LostParticipants] = None,
        health: Optional[HealthSettings] = None,
    ) -> None:
        self.client = client
        self.schema = schema
        lost = lost_participants(client, schema) if lost_participants is not None else frozenset()
        # With read_deaths as the hook, the pass knows the leases: the rooms a dead or restarted server left are
        # counted as on lost participants and keep its pairs unhealthy until they serve again, as in the CLI.
        self.deaths = lost if isinstance(lost, Deaths) else Deaths()
        self._health = None if health is None else HealthBuilder(health, self.deaths)
        self._times = None if health is None else OpenTimes()
        self._now_ms = 0
        self._keys: Iterator[list[str]] = (
            iter_room_keys(client, schema, batch) if health is None else pair_health.iter_keys(client, schema, batch)
        )
        self._builder = StatsBuilder(oldest=oldest)
        self._rooms: Optional[dict[int, RoomState]] = {} if keep_rooms else None
        self._by_status: Counter = Counter()
        self._lost = frozenset(lost)
        self._lease_tracking = lost_participants is not None
        self._on_lost = 0
        self._failures: Counter = Counter()
        self._scanned = 0
        self._started = time.monotonic()
        self.result: Optional[PassResult] = None

    def step(self) -> bool:
        """Read the next batch; True when the pass is complete (``result`` is then set). Raises KVStatusError."""
        if self.result is not None:
            return True
        keys = next(self._keys, None)
        if keys is None:
            self._finish()
            return True
        self._scanned += len(keys)
        if self._health is None:
            for view in read_rooms(self.client, self.schema, keys, self._builder.corrupt):
                self._add(view)
            return False
        self._now_ms = server_ms(self.client)
        for view in pair_health.read_views(self.client, self.schema, keys, self._corrupt):
            if view.exists:
                self._add(view)
                assert self._times is not None
                self._times.add(view, self._now_ms)
            self._health.add(view, self._now_ms)
        return False

    def _corrupt(self, room: int, message: str) -> None:
        self._builder.corrupt(room, message)
        if self._health is not None:
            self._health.corrupt(room, message)

    def _add(self, view: RoomView) -> None:
        self._builder.add(view)
        if view.failure is not None:
            self._failures[view.failure.stage] += 1
        if self.deaths.left(view) or any(
            name in self._lost and entry.status is not None and entry.status not in TERMINAL
            for name, entry in view.participants.items()
        ):
            self._on_lost += 1
        if self._rooms is not None:
            state = room_state(view)
            previous = self._rooms.get(view.room)
            if previous is not None:  # SCAN returned the key twice
                self._by_status.subtract(KVPoll(s) for _, s in previous if s is not None)
            self._rooms[view.room] = state
            self._by_status.update(KVPoll(s) for _, s in state if s is not None)

    def _finish(self) -> None:
        stats = self._builder.finish()
        snapshot = None
        if self._rooms is not None:
            snapshot = Snapshot(self._rooms, +self._by_status, stats.corrupted_rooms)
        self.result = PassResult(
            self.schema.namespace,
            stats,
            snapshot,
            self._on_lost,
            self._lease_tracking,
            self._scanned,
            time.time(),
            time.monotonic() - self._started,
            dict(self._failures),
            None
            if self._health is None
            else self._health.finish(self.schema.namespace, self._now_ms or server_ms(self.client)),
            self._times,
            self.deaths,
        )


@dataclass(frozen=True)
class LoopState:
    """What readers see: the last completed pass, and whether Redis answered the last step (``up``)."""

    namespace: str
    up: bool
    latest: Optional[PassResult]
    last_error: Optional[str]
    errors: int
    passes: int


class PassLoop:
    """Runs passes over one namespace every ``interval`` seconds in a daemon thread; never raises out of it.

    ``pause`` seconds are slept between batches (0: none). A Redis error ends
    the pass, sets ``up`` False and the next pass is tried after ``interval``
    (the previous completed pass stays in ``latest``). ``on_result`` is called
    in the loop's thread after each completed pass.
    """

    def __init__(
        self,
        client: Any,
        schema: KeySchema,
        *,
        interval: float = 15.0,
        batch: int = DEFAULT_BATCH,
        pause: float = 0.0,
        keep_rooms: bool = False,
        oldest: int = 1,
        lost_participants: Optional[LostParticipants] = None,
        on_result: Optional[Callable[[PassResult], None]] = None,
        health: Optional[HealthSettings] = None,
    ) -> None:
        self.client = client
        self.health = health
        self.schema = schema
        self.interval = interval
        self.batch = batch
        self.pause = pause
        self.keep_rooms = keep_rooms
        self.oldest = oldest
        self.lost_participants = lost_participants
        self.on_result = on_result
        self._state = LoopState(schema.namespace, False, None, None, 0, 0)
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    @property
    def state(self) -> LoopState:
        return self._state

    def start(self) -> PassLoop:
        self._thread = threading.Thread(target=self._run, name=f"kvstatus-pass-{self.schema.namespace}", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Ask the loop to stop and wait up to ``timeout`` seconds (it stops between batches)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def run_once(self) -> Optional[PassResult]:
        """Run one pass in the calling thread; None if Redis failed or the loop was stopped."""
        try:
            current = NamespacePass(
                self.client,
                self.schema,
                batch=self.batch,
                oldest=self.oldest,
                keep_rooms=self.keep_rooms,
                lost_participants=self.lost_participants,
                health=self.health,
            )
            while not current.step():
                self._set(up=True)
                if self._stop.is_set() or (self.pause and self._stop.wait(self.pause)):
                    return None
        except Exception as exc:  # noqa: BLE001 - the loop must outlive any failure; it is logged, masked
            message = mask_url(str(exc)) if isinstance(exc, KVStatusError) else mask_url(f"{type(exc).__name__}: {exc}")
            if not self._state.last_error:
                log.warning("namespace %s: pass failed: %s", self.schema.namespace, message)
            self._set(up=False, last_error=message, errors=self._state.errors + 1)
            return None
        result = current.result
        assert result is not None
        if self._state.last_error:
            log.warning("namespace %s: Redis answers again", self.schema.namespace)
        self._set(up=True, latest=result, last_error=None, passes=self._state.passes + 1)
        if self.on_result is not None:
            try:
                self.on_result(result)
            except Exception:  # noqa: BLE001 - a reader's bug must not stop the passes
                log.exception("namespace %s: on_result failed", self.schema.namespace)
        return result

    def _set(self, **changes: Any) -> None:
        old = self._state
        self._state = LoopState(**{**old.__dict__, **changes})

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            self.run_once()
            self._stop.wait(max(self.interval - (time.monotonic() - started), 0.05))
