"""Helpers of the near cache tests."""

from __future__ import annotations

import time
from typing import Any, Callable, TypeVar

T = TypeVar("T")


def eventually(check: Callable[[], T], timeout: float = 15.0, interval: float = 0.005, what: str = "") -> T:
    """``check()``'s first truthy result; fails after ``timeout`` seconds (generous: visibility, not speed)."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"not seen within {timeout} s: {what or check}")
        time.sleep(interval)


def client_ids(raw: Any, **filters: str) -> list[int]:
    """IDs of the server's clients whose CLIENT LIST fields match ``filters`` (e.g. redir="12")."""
    return [int(c["id"]) for c in raw.client_list() if all(str(c.get(k)) == v for k, v in filters.items())]
