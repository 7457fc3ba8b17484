"""``wait_for``'s plan: its loop as plain data (no I/O), which :func:`kvstatus._async.store.async_wait_for` performs.

The waiter watches the room on a near cache (:meth:`kvstatus._async.nearcache.AsyncNearCache.watch`): Redis
tracks every key the cache reads, and tells it on the cache's invalidation connection the first time that key
changes afterwards. The writers pay nothing for it (no publish). Every change to the room wakes the waiter, a
peer's Failed or a cancel included: with shared fate (:func:`kvstatus.rule.shared_status`) its read then answers
Failed. A waiter watches *before* it reads the entry, and the read through the cache is what Redis tracks, so a
change after the read cannot be missed. Told of a change (or when the cache empties), it watches again and reads.
It also reads every ``recheck`` seconds (a connection that died without a word), and when the cache cannot be
told of changes (the ACL refuses CLIENT TRACKING, fakeredis) it polls every ``poll_interval`` seconds.
"""

from __future__ import annotations

import math
import time
from collections.abc import Generator, Iterable
from typing import Any, Final, Literal, Optional, Union

from kvstatus.errors import InvalidArgumentError
from kvstatus.model import KVPoll, to_status

RECHECK_SECONDS = 1.0
POLL_INTERVAL_SECONDS = 0.05

# The I/O actions of a wait plan: (kind, argument).
WATCH: Final = "watch"  # argument None; reply: True if the room is watched (the read after it arms it), else False
READ: Final = "read"  # argument None; reply: the entry's status now (Optional[KVPoll])
RECEIVE: Final = "receive"  # argument: seconds to wait at most; returns early when the room changed
SLEEP: Final = "sleep"  # argument: seconds
CLOCK: Final = "clock"  # argument None; reply: time.monotonic()
Action = Union[
    tuple[Literal["watch"], None],
    tuple[Literal["read"], None],
    tuple[Literal["receive"], float],
    tuple[Literal["sleep"], float],
    tuple[Literal["clock"], None],
]


def target_statuses(statuses: KVPoll | int | Iterable[KVPoll | int]) -> frozenset[KVPoll]:
    """The statuses to wait for, validated (one status or an iterable of them)."""
    if isinstance(statuses, (KVPoll, int)) and not isinstance(statuses, bool):
        return frozenset({to_status(statuses)})
    if isinstance(statuses, (str, bytes)) or not isinstance(statuses, Iterable):
        raise InvalidArgumentError(f"invalid statuses {statuses!r}: expected a KVPoll, an int 0..4 or an iterable")
    targets = frozenset(to_status(s) for s in statuses)
    if not targets:
        raise InvalidArgumentError("wait_for needs at least one status to wait for")
    return targets


def check_timeout(timeout: Optional[float]) -> float:
    """``timeout`` in seconds (None: no limit) as a finite or infinite float."""
    if timeout is None:
        return math.inf
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or math.isnan(timeout) or timeout < 0:
        raise InvalidArgumentError(f"invalid timeout {timeout!r}: expected seconds >= 0 or None")
    return float(timeout)


def wait_plan(
    targets: frozenset[KVPoll],
    timeout: float,
    recheck: float = RECHECK_SECONDS,
    poll_interval: float = POLL_INTERVAL_SECONDS,
) -> Generator[Action, Any, Optional[KVPoll]]:  # each reply's type follows its action's kind
    """The waiting loop: returns the status reached, or None when ``timeout`` seconds passed first."""
    start = yield CLOCK, None
    deadline = start + timeout
    while True:
        watching = yield WATCH, None  # watch first, then read: no change falls in between
        status: Optional[KVPoll] = yield READ, None
        if status in targets:
            return status
        now = yield CLOCK, None
        if now >= deadline:
            return None
        wait = min(deadline - now, recheck if watching else poll_interval)
        yield (RECEIVE, wait) if watching else (SLEEP, wait)


MIN_STEP_SECONDS = 0.5
"""The least time one step of a wait (a watch, a read) is given, even at the wait's very end."""


def step_deadline(ends: float, deadline: float) -> float:
    """The monotonic time by which a step starting now must end: the store's ``deadline`` (seconds) from now,
    and no later than the wait's end ``ends``, unless that leaves less than :data:`MIN_STEP_SECONDS`."""
    now = time.monotonic()
    return min(now + deadline, max(ends, now + MIN_STEP_SECONDS))
