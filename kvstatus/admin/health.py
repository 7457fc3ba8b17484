"""Health per prefill-decode pair over a sliding window: "both Ready, nothing served", named.

Participants that share rooms form *pairs*: a prefill instance and a decode instance
(:func:`kvstatus.keys.naming`: ranks folded, ``prefill-a`` for ``prefill-a-tp3-pp0``). One pass over the
namespace reads every room hash **and** its tombstone (:func:`iter_keys` SCANs ``<prefix>:<ns>:{*``, which
matches both ``{<room>}`` and ``{<room>}:t``; a room whose participants all cleared at Success exists only as
its tombstone), and classifies each room id once, at Redis' clock (``TIME``, read once per batch):

- **succeeded**: no failure, every entry (live, or cleared as its tombstone says) at Success, the latest
  clear or Success step within the window;
- **failed**: the room's first failure (:mod:`kvstatus.rule`) within the window, by its stage; or, without a
  record, an entry Failed, or a room cleared by every side with an entry cleared at Failed or before Success
  (the record leaves with the room's last entry): stage :data:`UNKNOWN_STAGE`, at the clear or the Failed step;
- **stuck**: :func:`kvstatus.stuck.stuck` with ``older_than`` (a current state, not windowed);
- **open**: still in flight, not stuck. Older outcomes are not counted.

A room counts for every (prefill instance, decode instance) of its participants; a side with no entry and no
tombstone note is :data:`NONE` (``("prefill-a", "(none)")``: the decode never wrote). Rooms with neither a
prefill nor a decode participant (``other`` names, a cancel before any write) count in
:attr:`Health.unpaired` only. A room id reused within the window counts once, by what it holds now.

**The window is bounded by the tombstone TTL** (:data:`~kvstatus.keys.TOMBSTONE_TTL_SECONDS`, 60 s): a
success is seen only through its tombstone, so a longer window would miss successes that failures, kept by the
room itself up to its TTL, outlive. :class:`HealthSettings` refuses a longer window.

A pair is **unhealthy** when ``failed + stuck >= threshold`` (default 1) and it has no success in the window.
Memory: one counter per pair seen, never per room.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from itertools import product
from typing import Any, Optional

from kvstatus.admin.reads import (
    DEFAULT_BATCH,
    Deaths,
    OnCorrupt,
    iter_matching,
    read_deaths,
    replies,
    send,
    server_ms,
    without_probe,
)
from kvstatus.errors import CorruptedValueError
from kvstatus.keys import ROLES, TOMBSTONE_SUFFIX, TOMBSTONE_TTL_SECONDS, KeySchema, naming
from kvstatus.model import KVPoll, RoomView, Stage, Tombstone
from kvstatus.replies import decode_room, decode_tombstone
from kvstatus.requests import Call
from kvstatus.stuck import DEFAULT_OLDER_THAN_SECONDS, stuck
from kvstatus.timeline import current_steps
from kvstatus.translate import translate_error

DEFAULT_WINDOW_SECONDS = 60.0
DEFAULT_THRESHOLD = 1
NONE = "(none)"
"""The instance of a side with no entry and no tombstone note in a room (no name has parentheses)."""
UNKNOWN_STAGE = "unknown"
"""The stage of a failure without a record: a Failed entry, or a room cleared at Failed or before Success."""
FAILURE_STAGES: tuple[str, ...] = (*(stage.value for stage in Stage), UNKNOWN_STAGE)
OUTCOMES: tuple[str, ...] = ("succeeded", "failed", "stuck", "open")
DEATHS = frozenset({Stage.LEASE_LOST, Stage.SUPERSEDED})
"""The stages of a room's first failure that say its origin died (its lease lost) or restarted."""
SAMPLE = 5
"""How many skipped keys a pass names (``corrupted_sample``)."""


@dataclass(frozen=True)
class HealthSettings:
    """``window`` and ``older_than`` in seconds; ``window`` at most the tombstone TTL (see the module)."""

    window: float = DEFAULT_WINDOW_SECONDS
    older_than: float = DEFAULT_OLDER_THAN_SECONDS
    threshold: int = DEFAULT_THRESHOLD

    def __post_init__(self) -> None:
        if not 0 < self.window <= TOMBSTONE_TTL_SECONDS:
            raise ValueError(
                f"invalid window {self.window:g}s: expected more than 0 and at most the tombstone TTL "
                f"({TOMBSTONE_TTL_SECONDS:g}s): successes are seen through tombstones only"
            )
        if not 0 < self.older_than:
            raise ValueError(f"invalid older_than {self.older_than!r}: expected seconds > 0")
        if isinstance(self.threshold, bool) or not isinstance(self.threshold, int) or self.threshold < 1:
            raise ValueError(f"invalid threshold {self.threshold!r}: expected an int >= 1")


@dataclass
class PairHealth:
    """One pair's rooms in the window; ``unhealthy`` is set by :meth:`HealthBuilder.finish`."""

    prefill: str
    decode: str
    succeeded: int = 0
    failed: Counter = field(default_factory=Counter)
    stuck: int = 0
    open: int = 0
    unhealthy: bool = False
    served_ms: float = 0.0
    """When its latest room in the window succeeded (Unix ms; 0: none, or at a time no timeline says)."""
    deaths: dict[str, float] = field(default_factory=dict)
    """Participant of the pair -> when it died (Unix ms; infinity while its lease is lost): its room failed on its
    lost lease or restart, or it left an open entry (:meth:`kvstatus.admin.reads.Deaths.left`)."""

    @property
    def dead(self) -> list[str]:
        """The participants of the pair that died and after whose death none of its rooms succeeded."""
        return sorted(name for name, at in self.deaths.items() if at >= self.served_ms)

    @property
    def name(self) -> str:
        """``<prefill>,<decode>``, as ``/ready?pair=`` takes it."""
        return f"{self.prefill},{self.decode}"

    @property
    def failed_total(self) -> int:
        return sum(self.failed.values())

    def judge(self, threshold: int) -> bool:
        """True (unhealthy) when failures plus stuck rooms reach ``threshold`` and nothing succeeded, or when a
        participant of the pair died and no room of the pair succeeded since (:attr:`dead`)."""
        return bool(self.dead) or (self.failed_total + self.stuck >= threshold and self.succeeded == 0)

    def to_json(self) -> dict[str, Any]:
        return {
            "prefill": self.prefill,
            "decode": self.decode,
            "succeeded": self.succeeded,
            "failed": self.failed_total,
            "failed_by_stage": {stage: self.failed[stage] for stage in FAILURE_STAGES if self.failed[stage]},
            "stuck": self.stuck,
            "open": self.open,
            "dead": self.dead,
            "verdict": "UNHEALTHY" if self.unhealthy else "healthy",
        }


@dataclass(frozen=True)
class Health:
    """What one pass found: ``pairs`` sorted by (prefill, decode); ``now_ms`` Redis' clock at the end."""

    namespace: str
    settings: HealthSettings
    now_ms: int
    pairs: tuple[PairHealth, ...]
    rooms: int
    unpaired: int
    corrupted: int
    corrupted_sample: tuple[str, ...] = ()
    """Up to :data:`SAMPLE` messages, each naming a key the pass skipped (docs/security.md)."""

    @property
    def unhealthy(self) -> list[PairHealth]:
        return [pair for pair in self.pairs if pair.unhealthy]

    @property
    def healthy(self) -> bool:
        """True when no pair is unhealthy (no pair at all included)."""
        return not self.unhealthy

    def pair(self, prefill: str, decode: str) -> Optional[PairHealth]:
        return next((p for p in self.pairs if (p.prefill, p.decode) == (prefill, decode)), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "now": self.now_ms / 1000,
            "window_seconds": self.settings.window,
            "older_than_seconds": self.settings.older_than,
            "threshold": self.settings.threshold,
            "healthy": self.healthy,
            "rooms": self.rooms,
            "unpaired_rooms": self.unpaired,
            "corrupted_rooms": self.corrupted,
            "corrupted_sample": list(self.corrupted_sample),
            "pairs": [pair.to_json() for pair in self.pairs],
        }


def pairs_of(view: RoomView) -> list[tuple[str, str]]:
    """The (prefill instance, decode instance) pairs of ``view``'s live and cleared participants; [] if none."""
    names = set(view.participants)
    if view.tombstone is not None:
        names.update(view.tombstone.cleared)
    sides: dict[str, set[str]] = {"prefill": set(), "decode": set()}
    for name in names:
        role, instance = naming(name)
        if role in sides:
            sides[role].add(instance)
    if not sides["prefill"] and not sides["decode"]:
        return []
    return sorted(product(sides["prefill"] or {NONE}, sides["decode"] or {NONE}))


def classify(
    view: RoomView, now_ms: int, settings: HealthSettings, dead: Mapping[str, int] = {}
) -> Optional[tuple[str, Optional[str]]]:
    """(outcome, failure stage or None) of one room (see the module), or None: an outcome before the window.
    ``dead``: the open entries dead participants left (:func:`kvstatus.stuck.stuck`: the room is stuck)."""
    found = judge_room(view, now_ms, settings, dead)
    return None if found is None else found[:2]


def judge_room(
    view: RoomView, now_ms: int, settings: HealthSettings, dead: Mapping[str, int] = {}
) -> Optional[tuple[str, Optional[str], float]]:
    """:func:`classify`, and when the room succeeded (Unix ms; 0 for any other outcome, or no time known)."""
    since = now_ms - settings.window * 1000
    live = {name: entry.status for name, entry in view.participants.items() if entry.status is not None}
    cleared = {} if view.tombstone is None else view.tombstone.cleared
    gone = {name: note for name, note in cleared.items() if name not in live}
    if view.failure is not None:
        return ("failed", view.failure.stage.value, 0.0) if view.failure.at_ms >= since else None
    failed_at = [_last_ms(view, name) for name, status in live.items() if status is KVPoll.Failed]
    if not live:
        failed_at += [note.cleared_at * 1000 for note in gone.values() if note.status is not KVPoll.Success]
    if failed_at:
        known = [at for at in failed_at if at is not None]
        return ("failed", UNKNOWN_STAGE, 0.0) if not known or max(known) >= since else None
    if (
        (live or gone)
        and all(s is KVPoll.Success for s in live.values())
        and all(n.status is KVPoll.Success for n in gone.values())
    ):
        times = [note.cleared_at * 1000 for note in gone.values()] + [_last_ms(view, name) for name in live]
        known = [at for at in times if at is not None]
        if known and max(known) < since:
            return None
        return ("succeeded", None, max(known, default=0.0))
    if not live:
        return None
    return ("stuck" if stuck(view, now_ms, settings.older_than, dead) is not None else "open", None, 0.0)


def _last_ms(view: RoomView, name: str) -> Optional[float]:
    """When ``name``'s entry reached its status, or None: no timeline, or one out of step with it (capped)."""
    entry = view.participants.get(name)
    steps = current_steps(view.timelines.get(name, ()), None if entry is None else entry.status)
    return float(steps[-1].at_ms) if steps else None


class HealthBuilder:
    """Counts rooms per pair, one :meth:`add` per room id; :meth:`finish` judges the pairs."""

    def __init__(self, settings: HealthSettings = HealthSettings(), deaths: Deaths = Deaths()) -> None:
        """``deaths``: the leases, to judge the rooms dead or restarted participants left (none: no lease read)."""
        self.settings = settings
        self.deaths = deaths
        self._pairs: dict[tuple[str, str], PairHealth] = {}
        self.rooms = 0
        self.unpaired = 0
        self.corrupted = 0
        self.corrupted_sample: list[str] = []

    def add(self, view: RoomView, now_ms: int) -> None:
        self.rooms += 1
        pairs = pairs_of(view)
        if not pairs:
            self.unpaired += 1
            return
        left = self.deaths.left(view)
        found = judge_room(view, now_ms, self.settings, left)
        if found is None:
            return
        outcome, stage, served = found
        died: dict[str, float] = dict(left)
        if outcome == "failed" and view.failure is not None and view.failure.stage in DEATHS:
            died[view.failure.origin] = view.failure.at_ms
        for key in pairs:
            pair = self._pairs.get(key)
            if pair is None:
                pair = self._pairs[key] = PairHealth(*key)
            for name, at in died.items():
                if naming(name).role not in ROLES or naming(name).instance in key:  # the pair's own side died
                    at = self.deaths.until_served(name, at)
                    pair.deaths[name] = max(pair.deaths.get(name, 0.0), at)
            if outcome == "failed":
                pair.failed[stage] += 1
            elif outcome == "succeeded":
                pair.succeeded += 1
                pair.served_ms = max(pair.served_ms, served)
            elif outcome == "stuck":
                pair.stuck += 1
            else:
                pair.open += 1

    def corrupt(self, room: int, message: str) -> None:
        """An :data:`~kvstatus.admin.reads.OnCorrupt` hook: the key is skipped, and counted (a sample named)."""
        self.corrupted += 1
        if len(self.corrupted_sample) < SAMPLE:
            self.corrupted_sample.append(message)

    def finish(self, namespace: str, now_ms: int) -> Health:
        for pair in self._pairs.values():
            pair.unhealthy = pair.judge(self.settings.threshold)
        pairs = tuple(self._pairs[key] for key in sorted(self._pairs))
        return Health(
            namespace,
            self.settings,
            now_ms,
            pairs,
            self.rooms,
            self.unpaired,
            self.corrupted,
            tuple(self.corrupted_sample),
        )


def key_pattern(schema: KeySchema) -> str:
    """SCAN MATCH pattern for every room key and every tombstone key of the namespace."""
    return f"{schema.base}{{*"


def room_of_key(schema: KeySchema, key: str) -> tuple[Optional[int], bool]:
    """(room, is a tombstone key) of a key matched by :func:`key_pattern`; (None, False) for any other key."""
    if key.endswith(TOMBSTONE_SUFFIX):
        return schema.room_of(key[: -len(TOMBSTONE_SUFFIX)]), True
    return schema.room_of(key), False


def iter_keys(client: Any, schema: KeySchema, batch: int = DEFAULT_BATCH) -> Iterator[list[str]]:
    """Room and tombstone keys of the namespace, in lists of at most ``batch`` (one SCAN per primary)."""
    return iter_matching(client, key_pattern(schema), lambda key: room_of_key(schema, key)[0] is not None, batch)


def read_views(
    client: Any, schema: KeySchema, keys: list[str], on_corrupt: Optional[OnCorrupt] = None
) -> list[RoomView]:
    """Each room of ``keys`` once, with its tombstone, in one pipelined round trip.

    A room key is read with HGETALL + PTTL and its tombstone's HGETALL; a tombstone key whose room key is not
    in ``keys`` only when its room hash does not exist (EXISTS), as a view that does not exist (``exists``
    False) holding the tombstone, so that a room is counted by its room key, or by its tombstone when the
    room is gone. A room holding a value kvstatus does not write raises, or goes to ``on_corrupt`` and is
    skipped; a key at a tombstone's name that is not a tombstone hash goes to ``on_corrupt`` too, and its room
    is read without it (a tenant's string there stopped ``health``, the exporter and the board: issue 36).
    """
    rooms: dict[int, str] = {}
    orphans: dict[int, str] = {}
    for key in keys:
        room, tomb = room_of_key(schema, key)
        if room is not None:
            (orphans if tomb else rooms)[room] = key
    orphans = {room: key for room, key in orphans.items() if room not in rooms}
    calls: list[Call] = []
    for key in rooms.values():
        calls += [Call(("HGETALL", key)), Call(("PTTL", key)), Call(("HGETALL", key + TOMBSTONE_SUFFIX))]
    for key in orphans.values():
        calls += [Call(("EXISTS", key[: -len(TOMBSTONE_SUFFIX)])), Call(("HGETALL", key))]
    found = send(client, replies(calls, strict=0))
    views: list[RoomView] = []
    for i, (room, key) in enumerate(rooms.items()):
        fields, pttl, tomb = found[3 * i : 3 * i + 3]
        try:
            tombstone = _tombstone(tomb, key + TOMBSTONE_SUFFIX, room, on_corrupt)
            for reply in (fields, pttl):
                if isinstance(reply, Exception):
                    raise translate_error(reply, Call(("HGETALL", key))) from reply
            view = decode_room(room, key, fields, pttl, tombstone)
            if view.exists or tombstone is not None:  # a room left with its stamps alone is gone (lua/clear.lua)
                views.append(without_probe(view))
        except CorruptedValueError as exc:
            if on_corrupt is None:
                raise
            on_corrupt(room, str(exc))
    base = 3 * len(rooms)
    for i, (room, key) in enumerate(orphans.items()):
        exists, tomb = found[base + 2 * i : base + 2 * i + 2]
        try:
            if isinstance(exists, Exception):
                raise translate_error(exists, Call(("EXISTS", key[: -len(TOMBSTONE_SUFFIX)]))) from exists
            tombstone = _tombstone(tomb, key, room, on_corrupt)
        except CorruptedValueError as exc:
            if on_corrupt is None:
                raise
            on_corrupt(room, str(exc))
            continue
        if not exists and tombstone is not None:
            views.append(RoomView(room, {}, None, tombstone))
    return views


def _tombstone(reply: Any, key: str, room: int, on_corrupt: Optional[OnCorrupt]) -> Optional[Tombstone]:
    """The tombstone of an HGETALL ``reply`` of ``key``. A key there that is not a hash raises
    :class:`CorruptedValueError` naming it; with ``on_corrupt``, it is passed to it and read as none."""
    if not isinstance(reply, Exception):
        return decode_tombstone(reply, -1)
    error = translate_error(reply, Call(("HGETALL", key)))
    if on_corrupt is None or not isinstance(error, CorruptedValueError):
        raise error from reply
    on_corrupt(room, f"key {key} is not a tombstone hash; ignored")
    return None


def read_health(
    client: Any,
    schema: KeySchema,
    settings: HealthSettings = HealthSettings(),
    batch: int = DEFAULT_BATCH,
    on_corrupt: Optional[OnCorrupt] = None,
) -> Health:
    """One pass over ``schema``'s namespace (see the module); corrupted rooms are counted and skipped."""
    builder = HealthBuilder(settings, read_deaths(client, schema))

    def corrupt(room: int, message: str) -> None:
        builder.corrupt(room, message)
        if on_corrupt is not None:
            on_corrupt(room, message)

    now_ms = server_ms(client)
    for keys in iter_keys(client, schema, batch):
        now_ms = server_ms(client)
        for view in read_views(client, schema, keys, corrupt):
            builder.add(view, now_ms)
    return builder.finish(schema.namespace, now_ms)
