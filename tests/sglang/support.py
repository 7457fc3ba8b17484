"""Helpers of the SGLang tests: stores on fakeredis that count their round trips."""

from __future__ import annotations

from typing import Any

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
