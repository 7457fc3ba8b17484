"""What the board's room endpoints read and answer: bounded pages over SCAN, a room as JSON, stuck rooms, pairs.

Every read here is one the read-only ACL user of :mod:`kvstatus.admin.acl` may send: SCAN, HGETALL, PTTL,
EXISTS (in the recipe for them) and TIME (Redis' clock, the one the timelines are written by).

- :func:`scan_page` walks the namespace from a cursor and keeps what a picker makes of each room, within a
  budget: at most :data:`MAX_SCAN_STEPS` SCAN calls and about :data:`MAX_PAGE_READS` rooms read per page.
- :func:`stuck_page` is such a page of :func:`kvstatus.stuck.stuck` rooms, judged at Redis' ``TIME``.
- :func:`room_json` and :func:`timelines_json` are a room as the board's JSON shows it.
- :func:`pairs_page` is such a page of the health pass of :mod:`kvstatus.admin.health` (the pair matrix).

**The pair matrix** (``/api/pairs``). A full health pass (:func:`kvstatus.admin.health.read_health`) reads every
room and tombstone of the namespace: unbounded (about 200k keys at 100k rooms). A board request must cost the same
at 100 or 100k rooms, as ``/api/rooms`` and ``/api/stuck`` do, so :func:`pairs_page` runs the same pass over at
most :data:`MAX_SCAN_STEPS` SCAN calls and about :data:`MAX_PAGE_READS` keys (rooms and tombstones; the SCAN reply
that reaches the bound is read whole) and hands back a cursor. Each page counts its rooms per pair with
:class:`~kvstatus.admin.health.HealthBuilder`: the counts of the pages of one walk add up to those of ``kvstatus
health`` (a room is counted by its room key, or by its tombstone when the room is gone, whichever page reads it),
and the verdict is judged on the sums. A page that covers the whole namespace (``0-0`` to the end) carries the
verdicts itself. A tombstone read without its room costs an EXISTS, as in ``kvstatus health``.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional, TypeVar

from kvstatus.admin.health import (
    DEFAULT_THRESHOLD,
    DEFAULT_WINDOW_SECONDS,
    HealthBuilder,
    HealthSettings,
    key_pattern,
    read_views,
    room_of_key,
)
from kvstatus.admin.reads import Deaths, nodes_of, read_rooms, scan_step, server_ms
from kvstatus.admin.views import read_names
from kvstatus.errors import InvalidArgumentError
from kvstatus.keys import TOMBSTONE_TTL_SECONDS, KeySchema
from kvstatus.model import OPEN, RoomView, Step
from kvstatus.stuck import DEFAULT_OLDER_THAN_SECONDS, Stuck, stuck

MAX_PAGE = 500
MAX_SCAN_STEPS = 200
"""SCAN calls per page (each examines about max(limit, 100) keys, one round trip): enough for a namespace
that shares its Redis with much larger ones to fill its first page, and still a bounded cost."""
MAX_PAGE_READS = 1_000
"""Rooms a page reads (HGETALL + PTTL) before it stops and hands back a cursor, so a page costs the same at 100
or 100k rooms (docs/observe.md, "A page reads a bounded number of rooms", has the times before and after)."""
MAX_OLDER_THAN_SECONDS = 7 * 86_400.0

T = TypeVar("T")


def parse_cursor(text: str, nodes: int) -> tuple[int, int]:
    node, _, cursor = text.partition("-")
    if not (node.isdigit() and cursor.isdigit()) or int(node) >= max(nodes, 1):
        raise InvalidArgumentError(f"invalid cursor {text!r}: expected the 'cursor' of a previous page, or 0-0")
    return int(node), int(cursor)


def scan_page(
    client: Any, schema: KeySchema, cursor: str, limit: int, pick: Callable[[RoomView], Optional[T]]
) -> tuple[list[T], dict[str, Any]]:
    """What ``pick`` makes of the rooms of one page from ``cursor`` ("<node>-<scan cursor>", "0-0" to start),
    leaving out its Nones, and the page's paging fields: ``scanned``, ``cursor`` (None at the end), ``done``,
    ``budget_spent``. The page ends with the SCAN reply that brings ``limit`` picks (it may bring a few more),
    at the end of the namespace, or when its budget is spent."""
    nodes = nodes_of(client)
    node_index, scan_cursor = parse_cursor(cursor, len(nodes))
    found: list[T] = []
    steps = scanned = 0
    while node_index < len(nodes) and len(found) < limit and steps < MAX_SCAN_STEPS and scanned < MAX_PAGE_READS:
        scan_cursor, keys = scan_step(client, nodes[node_index], scan_cursor, schema.scan_pattern, max(limit, 100))
        steps += 1
        texts = [k for k in keys if schema.room_of(k) is not None]
        scanned += len(texts)
        if texts:
            picked = (pick(v) for v in read_rooms(client, schema, texts, on_corrupt=lambda *_: None))
            found += [p for p in picked if p is not None]
        if int(scan_cursor) == 0:
            node_index, scan_cursor = node_index + 1, 0
    done = node_index >= len(nodes)
    paging = {
        "scanned": scanned,
        "cursor": None if done else f"{node_index}-{scan_cursor}",
        "done": done,
        "budget_spent": not done and len(found) < limit,
    }
    return found, paging


def parse_older_than(text: Optional[str]) -> float:
    """The ``older_than`` query parameter in seconds (default :data:`~kvstatus.stuck.DEFAULT_OLDER_THAN_SECONDS`)."""
    return query_seconds("older_than", text, DEFAULT_OLDER_THAN_SECONDS, MAX_OLDER_THAN_SECONDS, zero=True)


def query_seconds(name: str, text: Optional[str], default: float, most: float, zero: bool = False) -> float:
    """A query parameter of seconds: ``default`` when absent, else a number above 0 (from 0 with ``zero``) and at
    most ``most``; anything else (NaN, inf, text) raises InvalidArgumentError naming it (a 400)."""
    if text is None or text == "":
        return default
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not ((seconds >= 0 if zero else seconds > 0) and seconds <= most):  # NaN fails both
        bound = f"from 0 to {most:.0f}" if zero else f"above 0 and at most {most:.0f}"
        raise InvalidArgumentError(f"invalid {name} {text!r}: expected seconds {bound}")
    return seconds


def stuck_json(found: Stuck) -> dict[str, Any]:
    """:meth:`Stuck.to_json` (the room a JSON integer) and ``room_text``, the id as a decimal string for
    JavaScript, whose numbers do not hold 63-bit ids exactly."""
    return {**found.to_json(), "room_text": str(found.room)}


def stuck_page(
    client: Any, schema: KeySchema, cursor: str, limit: int, older_than: float, deaths: Deaths = Deaths()
) -> dict[str, Any]:
    """One page of the stuck rooms (:func:`kvstatus.stuck.stuck` at Redis' ``TIME``, read once per page), the
    longest stuck first, with ``judged``: how many of the rooms read carry a timeline at all (the others cannot
    be judged: their writers record none). ``deaths``: the leases (the board's last pass read them), so a room
    a dead participant left is stuck at once, held by it, as in ``kvstatus ls --stuck``."""
    now_ms = server_ms(client)
    judged = 0

    def pick(view: RoomView) -> Optional[Stuck]:
        nonlocal judged
        if any(view.timelines.values()):
            judged += 1
        return stuck(view, now_ms, older_than, deaths.left(view))

    found, paging = scan_page(client, schema, cursor, limit, pick)
    found.sort(key=lambda s: (-s.seconds, s.room))
    return {
        "now_ms": now_ms,
        "older_than": older_than,
        "stuck": [stuck_json(s) for s in found],
        "judged": judged,
        **paging,
    }


def room_json(view: RoomView) -> dict[str, Any]:
    """A room of ``/api/rooms`` (and the base of ``/api/rooms/{room}``): each entry's own ``status`` and what its
    reads answer, ``reads`` (:func:`kvstatus.rule.reads`: Failed in a room that failed), and the room's
    ``failure`` (its first failure, null if none), as ``kvstatus get`` shows them."""
    read = read_names(view)
    return {
        "room": view.room,
        "room_text": str(view.room),  # for JavaScript: its numbers do not hold 63-bit ids exactly
        "ttl_ms": view.ttl_ms,
        "participants": [
            {
                "name": name,
                "status": None if e.status is None else e.status.name,
                "status_value": None if e.status is None else int(e.status),
                "reads": read[name],
                "reason": e.reason,
            }
            for name, e in sorted(view.participants.items())
        ],
        "failure": None if view.failure is None else view.failure.to_json(),
    }


def timelines_json(view: RoomView, now_ms: int) -> dict[str, Any]:
    """The room's timelines for the detail's bars: ``start_ms`` (the room's first step, Unix ms), ``now_ms``
    (Redis' clock) and per participant its steps, ``at_ms`` relative to ``start_ms``, and whether its entry is
    still open (its last segment then runs on to now)."""
    timelines = {name: steps for name, steps in sorted(view.timelines.items()) if steps}
    if not timelines:
        return {"start_ms": None, "now_ms": now_ms, "participants": []}
    start = min(steps[0].at_ms for steps in timelines.values())
    return {
        "start_ms": start,
        "now_ms": now_ms,
        "participants": [
            {
                "name": name,
                "open": _open(view, name),
                "steps": [_step(step, start) for step in steps],
            }
            for name, steps in timelines.items()
        ],
    }


def _open(view: RoomView, name: str) -> bool:
    entry = view.participants.get(name)
    return entry is not None and entry.status in OPEN


def _step(step: Step, start: int) -> dict[str, Any]:
    return {"status": step.status.name, "at_ms": step.at_ms - start}


PAIRS_SCAN_COUNT = 200
"""COUNT of each SCAN of a pairs page: about 5 SCAN calls and 5 pipelined round trips per page."""
MAX_HEALTH_SECONDS = 30 * 86_400.0
MAX_THRESHOLD = 1_000_000


def _seconds(name: str, text: Optional[str], default: float) -> float:
    return query_seconds(name, text, default, MAX_HEALTH_SECONDS)


def parse_health_settings(query: Any) -> HealthSettings:
    """:class:`HealthSettings` from the query parameters ``window`` and ``older_than`` (seconds, ``window`` at most
    the tombstone TTL) and ``threshold``; each defaults as ``kvstatus health`` does. Bad values raise InvalidArgumentError (a 400)."""
    threshold_text = query.get("threshold") or str(DEFAULT_THRESHOLD)
    if not threshold_text.isdigit() or not 1 <= int(threshold_text) <= MAX_THRESHOLD:
        raise InvalidArgumentError(f"invalid threshold {threshold_text!r}: expected an integer 1..{MAX_THRESHOLD}")
    try:
        return HealthSettings(
            window=_seconds("window", query.get("window"), DEFAULT_WINDOW_SECONDS),
            older_than=_seconds("older_than", query.get("older_than"), DEFAULT_OLDER_THAN_SECONDS),
            threshold=int(threshold_text),
        )
    except ValueError as exc:  # window above the tombstone TTL
        raise InvalidArgumentError(str(exc)) from None


def pairs_page(
    client: Any, schema: KeySchema, cursor: str, settings: HealthSettings, deaths: Deaths = Deaths()
) -> dict[str, Any]:
    """One bounded page of the health pass from ``cursor`` ("<node>-<scan cursor>", "0-0" to start): the pairs
    of the rooms it read with their counts, the rooms, unpaired and corrupted rooms it read, and the paging
    fields ``scanned`` (keys read), ``cursor`` (None at the end), ``done`` and ``complete`` (the page covered the
    whole namespace: then each pair carries its ``verdict``, else ``verdict`` is null and the caller judges the
    sums: unhealthy when failed + stuck >= threshold and nothing succeeded, or when a participant of the pair
    died after its latest success). For those sums each pair also carries ``served_ms`` (its latest success in
    the page, Unix ms; 0: none) and ``died_ms`` (participant -> when it died, null while its lease is lost)."""
    nodes = nodes_of(client)
    node_index, scan_cursor = parse_cursor(cursor, len(nodes))
    from_start = (node_index, scan_cursor) == (0, 0)
    builder = HealthBuilder(settings, deaths)
    now_ms = server_ms(client)
    steps = scanned = 0
    while node_index < len(nodes) and steps < MAX_SCAN_STEPS and scanned < MAX_PAGE_READS:
        scan_cursor, keys = scan_step(client, nodes[node_index], scan_cursor, key_pattern(schema), PAIRS_SCAN_COUNT)
        steps += 1
        texts = [k for k in keys if room_of_key(schema, k)[0] is not None]
        scanned += len(texts)
        if texts:
            for view in read_views(client, schema, texts, builder.corrupt):
                builder.add(view, now_ms)
        if int(scan_cursor) == 0:
            node_index, scan_cursor = node_index + 1, 0
    done = node_index >= len(nodes)
    complete = done and from_start
    health = builder.finish(schema.namespace, now_ms)
    document = health.to_json()
    for pair, shown in zip(health.pairs, document["pairs"]):  # for the page's sums: who died when, when it served
        shown["served_ms"] = pair.served_ms
        shown["died_ms"] = {name: None if math.isinf(at) else at for name, at in sorted(pair.deaths.items())}
    if not complete:
        document["healthy"] = None
        for pair in document["pairs"]:
            pair["verdict"] = None
    return {
        **document,
        "now_ms": now_ms,
        "tombstone_ttl_seconds": TOMBSTONE_TTL_SECONDS,
        "complete": complete,
        "unhealthy": [pair.name for pair in health.unhealthy] if complete else None,
        "scanned": scanned,
        "cursor": None if done else f"{node_index}-{scan_cursor}",
        "done": done,
    }
