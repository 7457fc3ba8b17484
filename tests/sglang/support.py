"""Helpers of the SGLang tests: stores on fakeredis that count their round trips."""

from __future__ import annotations

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


def commands_served(raw: Any) -> dict[str, int]:
    """Calls per command so far (INFO commandstats), without INFO itself and the near cache's liveness PINGs
    (sent on its invalidation connection without waiting: not a round trip of a poll)."""
    return {k: v["calls"] for k, v in raw.info("commandstats").items() if k not in ("cmdstat_info", "cmdstat_ping")}


def round_trips_of(raw: Any, work: Callable[[], object]) -> dict[str, int]:
    """The commands a real Redis served while ``work`` ran, per command (``cmdstat_<name>``)."""
    before = commands_served(raw)
    work()
    after = commands_served(raw)
    return {k: n - before.get(k, 0) for k, n in after.items() if n != before.get(k, 0)}
