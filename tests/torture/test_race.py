"""The late-abort race on a real Redis with 8 processes: kvstatus survives it, every baseline is caught.

This is the one proof that the demo's baselines are broken and kvstatus is not
(tests/demo checks the demo command itself). The harness has teeth: run
against the client-side read-then-write or the pre-fix rule, it finds rooms
that survived their clear.
"""

from __future__ import annotations

import pytest

from kvstatus.demo.baselines import BASELINES
from tests.helpers.backends import fresh_namespace
from tests.helpers.race import run_race
from tests.servers import RedisServer


def test_no_room_survives_its_clear(redis_server: RedisServer) -> None:
    result = run_race(redis_server.url, fresh_namespace("race"), "kvstatus", processes=8)
    assert result["exit_codes"] == [0] * 16
    assert result["survivors"] == []
    assert result["stale_starts"] == 0


@pytest.mark.parametrize("baseline", BASELINES)
def test_the_harness_catches_every_baseline(redis_server: RedisServer, baseline: str) -> None:
    result: dict = {}
    for _ in range(3):  # a race: a few tries; one run is nearly always enough
        result = run_race(redis_server.url, fresh_namespace("race"), baseline, processes=8)
        assert result["exit_codes"] == [0] * 16
        if result["survivors"] and result["stale_starts"]:
            break
    assert len(result["survivors"]) > 0, f"no room of the {baseline} baseline survived its clear"
    assert result["stale_starts"] > 0, f"no request of the {baseline} baseline started from a leftover status"
