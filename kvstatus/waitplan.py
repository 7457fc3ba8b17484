"""``wait_for``: wake up when a participant's entry reaches one of some statuses, told by Redis.

The waiter watches the room key through CLIENT TRACKING (:mod:`kvstatus.keywatch`): Redis tells it when
the room changes, and it re-reads the entry. The writers pay nothing for it (no publish). Every change to the
room wakes the waiter, a peer's Failed or a cancel included: with shared fate (:func:`kvstatus.rule.shared_status`) its
read then answers Failed.

A waiter arms its watch *before* it reads the entry, so a change between the read and the arm cannot be
missed. Told of a change, it reads first (the change may be the one awaited: one round trip to deliver it),
then, if it must go on waiting, arms the watch again and reads once more. It also re-reads the entry every ``recheck`` seconds (a watch connection that died without a word),
and when it cannot watch (the ACL refuses CLIENT TRACKING, the connection broke) it polls every
``poll_interval`` seconds, trying to watch again as it goes unless the ACL refused. The loop is plain data
here (:func:`wait_plan`, no I/O); the driver that performs its actions is written once in
:mod:`kvstatus._async.waiting` and generated for threads.
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
WATCH: Final = "watch"  # argument None; reply: True once the room key is watched, False if not possible now
READ: Final = "read"  # argument None; reply: the entry's status now (Optional[KVPoll])
RECEIVE: Final = "receive"  # argument: seconds to wait; reply: True if the room changed, False if not, None if broken
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
    participant: str,
    targets: frozenset[KVPoll],
    timeout: float,
    recheck: float = RECHECK_SECONDS,
    poll_interval: float = POLL_INTERVAL_SECONDS,
) -> Generator[Action, Any, Optional[KVPoll]]:  # each reply's type follows its action's kind
    """The waiting loop: returns the status reached, or None when ``timeout`` seconds passed first."""
    start = yield CLOCK, None
    deadline = start + timeout
    watching = yield WATCH, None
    status: Optional[KVPoll] = yield READ, None
    next_read = start + (recheck if watching else poll_interval)
    while True:
        if status in targets:
            return status
        now = yield CLOCK, None
        if now >= deadline:
            return None
        if now >= next_read:
            watching = yield WATCH, None  # watch first, then read: nothing falls in between
            status = yield READ, None
            next_read = now + (recheck if watching else poll_interval)
            continue
        wait = min(deadline, next_read) - now
        if not watching:
            yield SLEEP, wait
            continue
        changed = yield RECEIVE, wait
        if changed:  # the change may be the awaited one: read it first, and watch again only if not
            status = yield READ, None
            if status in targets:
                return status
        if changed is not False:
            next_read = now  # the room changed, or the watch broke: watch again, then read (nothing is lost)


MIN_STEP_SECONDS = 0.5
"""The least time one step of a wait (a watch, a read) is given, even at the wait's very end."""


def step_deadline(ends: float, deadline: float) -> float:
    """The monotonic time by which a step starting now must end: the store's ``deadline`` (seconds) from now,
    and no later than the wait's end ``ends``, unless that leaves less than :data:`MIN_STEP_SECONDS`."""
    now = time.monotonic()
    return min(now + deadline, max(ends, now + MIN_STEP_SECONDS))
