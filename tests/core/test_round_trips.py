"""The README's table of round trips per call, counted on a real Redis: every ``send_packed_command`` of this
thread is one round trip, and so is every arm of a ``wait_for`` watch (a call's commands go out in one send per connection; a lease keeper's background
sends are another thread's). Each call runs once first, so connections are open, scripts loaded and the near
cache filled; then it runs again, counted."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

import pytest
import redis.connection

from kvstatus import KVPoll, StatusStore
from kvstatus.storebase import StoreBase
from tests.helpers.backends import fresh_namespace

pytestmark = pytest.mark.real

README = Path(__file__).resolve().parents[2] / "README.md"
HEADER = "| call | round trips | with the near cache, room unchanged |"
ROOMS = range(10, 2510)


def readme_rows() -> list[tuple[str, int, int]]:
    """(call, round trips, with the near cache) for every call named in the README's table."""
    lines = README.read_text().splitlines()
    start = lines.index(HEADER) + 2
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        names, uncached, cached = (cell.strip() for cell in line.strip("|").split("|"))
        calls = re.findall(r"`(\w+)`", names)
        plain = [int(n) for n in uncached.split("/")]
        near = [int(n) for n in cached.split("/")]
        for i, call in enumerate(calls):
            rows.append((call, plain[min(i, len(plain) - 1)], near[min(i, len(near) - 1)]))
    return rows


@pytest.fixture
def sends(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """A counter of this thread's sends on redis-py connections."""
    counted, me = [0], threading.get_ident()
    original = redis.connection.AbstractConnection.send_packed_command

    def counting(self: Any, *args: Any, **kwargs: Any) -> Any:
        if threading.get_ident() == me:
            counted[0] += 1
        return original(self, *args, **kwargs)

    monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", counting)
    yield counted


def _public_calls() -> list[str]:
    """The store's public methods (its own and StoreBase's), but building, closing and the near cache's map."""
    local = {"close", "from_url", "for_participant", "uncached", "fresh_reads"}
    return [
        name
        for cls in (StatusStore, StoreBase)
        for name, value in vars(cls).items()
        if not name.startswith("_") and callable(value) and name not in local
    ]


def _calls(store: StatusStore) -> dict[str, Callable[[], object]]:
    return {
        "update_status": lambda: store.update_status(1, KVPoll.Bootstrapping),
        "record_failure": lambda: store.record_failure(1, "why"),
        "clear": lambda: store.clear(2),
        "pop": lambda: store.pop(2),
        "update_many": lambda: store.update_many({room: KVPoll.Bootstrapping for room in ROOMS}),
        "get_many": lambda: store.get_many(ROOMS),
        "get": lambda: store.get(1),
        "check_status": lambda: store.check_status(1),
        "room": lambda: store.room(1),
        "failure": lambda: store.failure(1),
        "cancel": lambda: store.cancel(3, "why"),
        "cancel_many": lambda: store.cancel_many([3, 4], "why"),
        "room_status": lambda: store.room_status(1, [store.participant, "decode-0"]),
        "room_statuses": lambda: store.room_statuses([1, 2], [store.participant, "decode-0"]),
        "acquire_lease": lambda: store.acquire_lease(),
        "look_at_peers": lambda: store.look_at_peers(),
        "live_holder": lambda: store.live_holder(),
        "awaits": lambda: store.awaits(1, "127.0.0.1:8998"),
        "wait_for": lambda: store.wait_for(1, KVPoll.Bootstrapping, 5),
    }


@pytest.mark.parametrize("near_cache", [False, True], ids=["uncached", "near-cache"])
def test_the_readme_round_trips(redis_server: Any, sends: list[int], near_cache: bool) -> None:
    rows = readme_rows()
    store = StatusStore.from_url(
        redis_server.url, namespace=fresh_namespace("rt"), participant="prefill-0", near_cache=near_cache, lease_ttl=30
    )
    try:
        store.update_status(1, KVPoll.Bootstrapping)
        calls = _calls(store)
        assert sorted(call for call, _, _ in rows) == sorted(calls) == sorted(_public_calls())
        counted = {}
        for call, _, _ in rows:
            calls[call]()
            sends[0] = 0
            calls[call]()
            counted[call] = sends[0]
        assert counted == {call: cached if near_cache else plain for call, plain, cached in rows}
    finally:
        store.close()
