"""What ``get`` shows of a room's timelines, and ``ls --stuck`` of its stuck rooms (text and JSON)."""

from __future__ import annotations

from typing import Any, Optional

from kvstatus.cli.app import table
from kvstatus.model import KVPoll, RoomView
from kvstatus.stuck import Stuck

TIMELINE_COLUMNS: tuple[KVPoll, ...] = (
    KVPoll.Bootstrapping,
    KVPoll.WaitingForInput,
    KVPoll.Transferring,
    KVPoll.Success,
    KVPoll.Failed,
)
"""The statuses of ``get``'s timeline table, in the order a room goes through them."""


def offset_text(ms: int) -> str:
    """A time since the room's first step: "+0 ms", "+15 ms" under a second, "+1.2 s" under a minute, "+75 s"."""
    if ms < 1000:
        return f"+{ms} ms"
    return f"+{ms / 1000:.1f} s" if ms < 60_000 else f"+{ms / 1000:.0f} s"


def timelines_json(view: RoomView) -> dict[str, list[dict[str, Any]]]:
    """Each participant's steps, in order: ``{"status": name, "at_ms": Unix ms by Redis' clock}``."""
    return {
        name: [{"status": step.status.name, "at_ms": step.at_ms} for step in steps]
        for name, steps in view.timelines.items()
        if steps
    }


def timeline_table(view: RoomView) -> Optional[str]:
    """The room's timelines as a table (None without any): one row per participant that records one, one column
    per status, each cell when the participant first reached it, since the room's first step (any participant's)."""
    timelines = {name: steps for name, steps in view.timelines.items() if steps}
    if not timelines:
        return None
    start = min(steps[0].at_ms for steps in timelines.values())
    rows = []
    for name, steps in sorted(timelines.items()):
        first: dict[KVPoll, int] = {}
        for step in steps:
            first.setdefault(step.status, step.at_ms)  # a status reached twice (seed policy): the first time
        rows.append([name] + [offset_text(first[s] - start) if s in first else "" for s in TIMELINE_COLUMNS])
    shown = table(["PARTICIPANT"] + [s.name for s in TIMELINE_COLUMNS], rows)
    return "\n".join("  " + line for line in shown.splitlines())


STUCK_HEADERS = ["ROOM", "HOLDER", "STATUS", "STUCK FOR"]


def stuck_row(found: Stuck) -> list[str]:
    """``ls --stuck``'s row of a stuck room (cells escaped by the table)."""
    status = "-" if found.status is None else f"{found.status.name}({found.status.value})"
    holder = f"{found.holder} (dead)" if found.dead else found.holder
    return [str(found.room), holder, status, f"{found.seconds:.1f} s"]


def no_timeline_note(rooms: int) -> str:
    """On stderr after ``ls --stuck``: how many open rooms could not be judged."""
    return (
        f"kvstatus: {rooms} open {'room has' if rooms == 1 else 'rooms have'} no timeline and could not be judged "
        "(their writers record none: timeline=True, set --timeline)"
    )
