"""``wait_for``: wake up when a participant's entry reaches one of some statuses, pushed by Redis.

The plan (what to do when) is :mod:`kvstatus.waitplan`; the driver is written once in
:mod:`kvstatus._async.waiting` and generated for threads. This module keeps their import paths.
"""

from kvstatus._async.waiting import AsyncSubscription, async_wait_for
from kvstatus._sync.waiting import Subscription, subscription_for, wait_for
from kvstatus.waitplan import (
    POLL_INTERVAL_SECONDS,
    RECHECK_SECONDS,
    check_timeout,
    parse_payload,
    target_statuses,
    wait_plan,
)

__all__ = [
    "POLL_INTERVAL_SECONDS",
    "RECHECK_SECONDS",
    "AsyncSubscription",
    "Subscription",
    "async_wait_for",
    "check_timeout",
    "parse_payload",
    "subscription_for",
    "target_statuses",
    "wait_for",
    "wait_plan",
]
