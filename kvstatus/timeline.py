"""Where did room N wait: each entry's timeline, pure Python.

A store built with ``timeline=True`` (on by default for the SGLang plugin) records, for every entry it
writes, the time by Redis' clock at which the entry reached each status. The same atomic update that
changes the status writes it (``lua/lib/timeline.lua``), in the same ``HSET``: no crash can leave a
status without its step, or a step without its status. It lives in the room hash, field
``t:<participant>``, and goes with the entry (``clear``), the room's TTL, or a replacing incarnation.

Stored form: ``"<status>@<unix ms>"`` for the first step, then ``" <status>+<ms since the first>"`` for
each later one, e.g. ``"1@1764680000123 2+15 3+40 4+52"``. Offsets never decrease (a clock that steps back
repeats the previous offset), so a timeline is monotone by construction. A step that would make the value
longer than :data:`MAX_BYTES` is dropped. :func:`timeline_after` is the Python reference of the script's
append; :func:`parse_timeline` reads it; :func:`stage_seconds` turns it into the fleet's stage durations.
"""

from __future__ import annotations

from typing import Optional

from kvstatus import replies
from kvstatus.model import KVPoll, Step

MAX_BYTES = replies.TIMELINE_MAX_BYTES
"""The longest stored timeline in bytes (lua/lib/timeline.lua's TIMELINE_MAX_BYTES): about 14 steps."""


def timeline_after(prev: Optional[str], status: int, now_ms: int) -> str:
    """The stored timeline ``prev`` (None: none yet) with ``status`` reached at ``now_ms`` appended.

    The reference of ``timeline_after`` in lua/lib/timeline.lua: the tests hold the two together. Raises
    :class:`~kvstatus.errors.CorruptedValueError` for a ``prev`` that is not a timeline (the script answers
    KVSTATUS_CORRUPT).
    """
    if prev is None:
        return f"{status}@{now_ms}"
    steps = parse_timeline(prev, "", "")
    base = steps[0].at_ms
    offset = max(now_ms - base, steps[-1].at_ms - base)
    step = f" {status}+{offset}"
    return prev if len(prev) + len(step) > MAX_BYTES else prev + step


def parse_timeline(value: object, key: str, field: str) -> tuple[Step, ...]:
    """The steps of a stored timeline (bytes or str), in order; raises
    :class:`~kvstatus.errors.CorruptedValueError` naming ``key`` and ``field`` for a value kvstatus does not write
    (:func:`kvstatus.replies.parse_timeline`, the rule lua/lib/stored.lua applies before the script appends)."""
    return replies.parse_timeline(value, key, field)


STAGES: tuple[str, ...] = ("bootstrap", "waiting", "transfer", "total")
"""The stage durations observed per cleared entry: ``bootstrap`` Bootstrapping → WaitingForInput,
``waiting`` WaitingForInput → Transferring (waiting for input), ``transfer`` Transferring → Success,
``total`` the first step → the last."""

_STAGE_BOUNDS = {
    "bootstrap": (KVPoll.Bootstrapping, KVPoll.WaitingForInput),
    "waiting": (KVPoll.WaitingForInput, KVPoll.Transferring),
    "transfer": (KVPoll.Transferring, KVPoll.Success),
}


def stage_seconds(steps: tuple[Step, ...]) -> dict[str, float]:
    """Seconds spent in each stage of :data:`STAGES` the timeline saw both ends of (its first arrival at each
    status counts), and ``total`` when it has a step at all."""
    if not steps:
        return {}
    first: dict[KVPoll, int] = {}
    for step in steps:
        first.setdefault(step.status, step.at_ms)
    found = {
        stage: (first[end] - first[start]) / 1000
        for stage, (start, end) in _STAGE_BOUNDS.items()
        if start in first and end in first and first[end] >= first[start]
    }
    found["total"] = (steps[-1].at_ms - steps[0].at_ms) / 1000
    return found


def current_steps(steps: tuple[Step, ...], status: Optional[KVPoll]) -> tuple[Step, ...]:
    """``steps`` if their last step is the entry's ``status``, else (): a timeline that stopped at
    :data:`MAX_BYTES` (a seed-policy entry flipping between Failed and another status), or a store without
    timelines wrote the entry since, so its last step says nothing of when the entry reached its status. The
    judgements (stuck, health, the exporter's time in status) then go by the status alone, as without a timeline."""
    return steps if steps and steps[-1].status is status else ()


def since_current(steps: tuple[Step, ...], now_ms: int) -> Optional[float]:
    """Seconds the entry has sat in its current status (since its last step) at ``now_ms``, or None without steps."""
    return max(0, now_ms - steps[-1].at_ms) / 1000 if steps else None
