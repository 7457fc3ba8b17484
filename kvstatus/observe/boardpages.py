"""What the board's room endpoints read and answer: bounded pages over SCAN, a room as JSON, stuck rooms.

Every read here is one the read-only ACL user of :mod:`kvstatus.admin.acl` may send: SCAN, HGETALL, PTTL and
TIME (Redis' clock, the one the timelines are written by).

- :func:`scan_page` walks the namespace from a cursor and keeps what a picker makes of each room, within a
  budget: at most :data:`MAX_SCAN_STEPS` SCAN calls and about :data:`MAX_PAGE_READS` rooms read per page.
- :func:`stuck_page` is such a page of :func:`kvstatus.stuck.stuck` rooms, judged at Redis' ``TIME``.
- :func:`room_json` and :func:`timelines_json` are a room as the board's JSON shows it.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional, TypeVar

from kvstatus.admin.leases import redis_ms
from kvstatus.admin.scan import read_rooms, scan_clients
from kvstatus.errors import InvalidArgumentError
from kvstatus.keys import KeySchema
from kvstatus.rule import OPEN, RoomView, Step
from kvstatus.stuck import DEFAULT_OLDER_THAN_SECONDS, Stuck, stuck
from kvstatus.translate import REDIS_ERRORS, translate_error

MAX_PAGE = 500
MAX_SCAN_STEPS = 200
"""SCAN calls per page (each examines about max(limit, 100) keys, one round trip): enough for a namespace
that shares its Redis with much larger ones to fill its first page, bounded at about 20 ms."""
MAX_PAGE_READS = 1_000
"""Rooms a page reads (HGETALL + PTTL) before it stops and hands back a cursor: about 0.1 s on a loaded 2-core
box (a filter that matched nothing read all of 100k rooms, 6.7-19 s, before this bound)."""
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
    nodes = scan_clients(client)
    node_index, scan_cursor = parse_cursor(cursor, len(nodes))
    found: list[T] = []
    steps = scanned = 0
    while node_index < len(nodes) and len(found) < limit and steps < MAX_SCAN_STEPS and scanned < MAX_PAGE_READS:
        try:
            scan_cursor, keys = nodes[node_index].scan(
                cursor=scan_cursor, match=schema.scan_pattern, count=max(limit, 100)
            )
        except REDIS_ERRORS as exc:
            raise translate_error(exc) from exc
        steps += 1
        texts = [k.decode() if isinstance(k, bytes) else k for k in keys]
        texts = [k for k in texts if schema.room_of(k) is not None]
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


def redis_now_ms(client: Any) -> int:
    """Redis' clock (``TIME``) in whole Unix ms, as the scripts stamp the timelines; a cluster's first primary."""
    try:
        return redis_ms(*scan_clients(client)[0].time())
    except REDIS_ERRORS as exc:
        raise translate_error(exc) from exc


def parse_older_than(text: Optional[str]) -> float:
    """The ``older_than`` query parameter in seconds (default :data:`~kvstatus.stuck.DEFAULT_OLDER_THAN_SECONDS`)."""
    if text is None or text == "":
        return DEFAULT_OLDER_THAN_SECONDS
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not 0 <= seconds <= MAX_OLDER_THAN_SECONDS:
        raise InvalidArgumentError(
            f"invalid older_than {text!r}: expected seconds from 0 to {MAX_OLDER_THAN_SECONDS:.0f}"
        )
    return seconds


def stuck_json(found: Stuck) -> dict[str, Any]:
    return {
        "room": str(found.room),  # 63-bit ids do not fit a JavaScript number
        "holder": found.holder,
        "status": None if found.status is None else found.status.name,
        "seconds": found.seconds,
    }


def stuck_page(client: Any, schema: KeySchema, cursor: str, limit: int, older_than: float) -> dict[str, Any]:
    """One page of the stuck rooms (:func:`kvstatus.stuck.stuck` at Redis' ``TIME``, read once per page), the
    longest stuck first, with ``judged``: how many of the rooms read carry a timeline at all (the others cannot
    be judged: their writers record none)."""
    now_ms = redis_now_ms(client)
    judged = 0

    def pick(view: RoomView) -> Optional[Stuck]:
        nonlocal judged
        if any(view.timelines.values()):
            judged += 1
        return stuck(view, now_ms, older_than)

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
    return {
        "room": str(view.room),  # 63-bit ids do not fit a JavaScript number
        "ttl_ms": view.ttl_ms,
        "participants": [
            {
                "name": name,
                "status": None if e.status is None else e.status.name,
                "status_value": None if e.status is None else int(e.status),
                "reason": e.reason,
            }
            for name, e in sorted(view.participants.items())
        ],
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
