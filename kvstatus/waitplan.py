"""``wait_for``: wake up when a participant's entry reaches one of some statuses, pushed by Redis.

The update script publishes ``<status>:<participant>`` on the room's channel whenever it changes an
entry (CREATED, ADVANCED, FAILED). The channel is named like the room key and is a shard channel
(``SPUBLISH``/``SSUBSCRIBE``, Redis >= 7), so on a cluster it lives on the room's node and costs no
cluster-bus traffic; on Redis 6 it is a plain channel (``PUBLISH``/``SUBSCRIBE``).

Another participant's Failed on the channel (its update, or a cancel) makes the waiter read its own entry
at once: with shared fate (:mod:`kvstatus.fate`) that read answers Failed.

A waiter subscribes *before* it reads the entry, so a change between its read and its subscription
cannot be missed. Pub/Sub is at-most-once (a message is lost if the subscription connection drops, and
the script does not publish for a user the ACL refuses the channel), so the waiter also re-reads the
entry every ``recheck`` seconds, and when the subscription breaks it polls every ``poll_interval``
seconds (re-subscribing as it goes). The loop is plain data here (:func:`wait_plan`, no I/O); the
driver that performs its actions is written once in :mod:`kvstatus._async.waiting` and generated for
threads.
"""

from __future__ import annotations

import math
import time
from collections.abc import Generator, Iterable
from typing import Any, Optional

from kvstatus.errors import InvalidArgumentError
from kvstatus.rule import KVPoll, to_status

RECHECK_SECONDS = 1.0
POLL_INTERVAL_SECONDS = 0.05

# The I/O actions of a wait plan: (kind, argument).
SUBSCRIBE = "subscribe"  # argument None; reply: True if subscribed, False if not possible now
READ = "read"  # argument None; reply: the entry's status now (Optional[KVPoll])
RECEIVE = "receive"  # argument: seconds to wait; reply: payloads received (maybe []), or None if it broke
SLEEP = "sleep"  # argument: seconds
CLOCK = "clock"  # argument None; reply: time.monotonic()
Action = tuple[str, Any]


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


def parse_payload(payload: Any) -> tuple[str, Optional[KVPoll]]:
    """(participant, status) of a published ``<status>:<participant>``; status None if malformed."""
    text = payload.decode("utf-8", "replace") if isinstance(payload, bytes) else str(payload)
    head, _, participant = text.partition(":")
    if len(head) == 1 and head in "01234":
        return participant, KVPoll(int(head))
    return participant, None


def wait_plan(
    participant: str,
    targets: frozenset[KVPoll],
    timeout: float,
    recheck: float = RECHECK_SECONDS,
    poll_interval: float = POLL_INTERVAL_SECONDS,
) -> Generator[Action, Any, Optional[KVPoll]]:
    """The waiting loop: returns the status reached, or None when ``timeout`` seconds passed first."""
    start = yield CLOCK, None
    deadline = start + timeout
    subscribed = yield SUBSCRIBE, None
    status: Optional[KVPoll] = yield READ, None
    next_read = start + (recheck if subscribed else poll_interval)
    while True:
        if status in targets:
            return status
        now = yield CLOCK, None
        if now >= deadline:
            return None
        if now >= next_read:
            if not subscribed:
                subscribed = yield SUBSCRIBE, None  # subscribe first, then read: nothing falls in between
            status = yield READ, None
            next_read = now + (recheck if subscribed else poll_interval)
            continue
        wait = min(deadline, next_read) - now
        if not subscribed:
            yield SLEEP, wait
            continue
        payloads = yield RECEIVE, wait
        if payloads is None:
            subscribed = False
            next_read = now  # read (and try to re-subscribe) at once
            continue
        for payload in payloads:
            who, new = parse_payload(payload)
            if who == participant and new is not None:
                status = new
                if status in targets:
                    break
            elif new is KVPoll.Failed:
                next_read = now  # a peer's entry failed: under shared fate this one may read Failed now


def _is_message(reply: Any) -> bool:
    return isinstance(reply, list) and len(reply) == 3 and reply[0] in (b"smessage", b"message")


MIN_STEP_SECONDS = 0.5
"""The least time one step of a wait (a subscription, a read) is given, even at the wait's very end."""


def step_deadline(ends: float, deadline: float) -> float:
    """The monotonic time by which a step starting now must end: the store's ``deadline`` (seconds) from now,
    and no later than the wait's end ``ends``, unless that leaves less than :data:`MIN_STEP_SECONDS`."""
    now = time.monotonic()
    return min(now + deadline, max(ends, now + MIN_STEP_SECONDS))


def is_message(reply: Any) -> bool:
    """True for a Pub/Sub message (``message`` or ``smessage``) as redis-py returns it."""
    return isinstance(reply, list) and len(reply) == 3 and reply[0] in (b"smessage", b"message")
