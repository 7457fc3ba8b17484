"""``wait_for``: wake up when a participant's entry reaches one of some statuses, told by Redis.

The plan (what to do when) is :mod:`kvstatus.waitplan`; the watch of a room key is
:mod:`kvstatus.keywatch`; the driver is written once in :mod:`kvstatus._async.waiting` and generated for
threads. This module keeps their import paths.
"""

from kvstatus._async.waiting import AsyncRoomWatch, async_wait_for
from kvstatus._sync.waiting import RoomWatch, wait_for
from kvstatus.waitplan import (
    POLL_INTERVAL_SECONDS,
    RECHECK_SECONDS,
    check_timeout,
    target_statuses,
    wait_plan,
)

__all__ = [
    "POLL_INTERVAL_SECONDS",
    "RECHECK_SECONDS",
    "AsyncRoomWatch",
    "RoomWatch",
    "async_wait_for",
    "check_timeout",
    "target_statuses",
    "wait_for",
    "wait_plan",
]
