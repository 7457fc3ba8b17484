"""Helpers of the SGLang tests: stores on fakeredis that count their round trips."""

from __future__ import annotations

import uuid
from collections import Counter
from typing import Any, Callable

import fakeredis

from kvstatus import StatusStore
from tests.helpers.backends import fresh_namespace


class CountingRedis(fakeredis.FakeRedis):
    """A fakeredis client counting round trips: each command sent alone, and each pipeline sent."""

    round_trips = 0

    def execute_command(self, *args: Any, **options: Any) -> Any:
        self.round_trips += 1
        return super().execute_command(*args, **options)

    def pipeline(self, *args: Any, **kwargs: Any) -> Any:
        pipe = super().pipeline(*args, **kwargs)
        send = pipe.execute

        def execute(*eargs: Any, **ekwargs: Any) -> Any:
            self.round_trips += 1
            return send(*eargs, **ekwargs)

        pipe.execute = execute
        return pipe


def counting_store(policy: str = "strict", participant: str = "prefill-tp0-pp0") -> StatusStore:
    return StatusStore(
        CountingRedis(server=fakeredis.FakeServer()),
        namespace=fresh_namespace("sg"),
        participant=participant,
        policy=policy,
    )


def room_commands(raw: Any, base: str, work: Callable[[], object]) -> list[str]:
    """The commands Redis served while ``work`` ran that name a room key under ``base`` (``prefix:namespace:``),
    as MONITOR shows them: a lease keeper's or another namespace's commands are not counted."""
    marker = f"kvstatus-monitor-end-{uuid.uuid4().hex}"
    pattern = base + "{"
    seen: list[str] = []
    with raw.monitor() as monitor:  # MONITOR has answered OK: every command from now on is shown
        work()
        raw.echo(marker)
        while True:
            command = monitor.next_command()["command"]
            if marker in command:
                return seen
            if pattern in command:
                seen.append(command)


def room_command_counts(raw: Any, base: str, work: Callable[[], object]) -> dict[str, int]:
    """:func:`room_commands`, counted per command name (lower case)."""
    return dict(Counter(command.split()[0].strip('"').lower() for command in room_commands(raw, base, work)))
