"""The late-abort race on a real Redis with 8 processes, and proof that the harness catches the pre-fix rule."""

from __future__ import annotations

import pytest

from tests.helpers.race import run_race
from tests.servers import RedisServer
from tests.helpers.backends import fresh_namespace

pytestmark = pytest.mark.real


def test_no_room_survives_its_clear(redis_server: RedisServer) -> None:
    result = run_race(redis_server.url, fresh_namespace("race"), "kvstatus", processes=8)
    assert result["exit_codes"] == [0] * 16
    assert result["survivors"] == []
    assert result["stale_starts"] == 0


def test_the_harness_catches_the_pre_fix_rule(redis_server: RedisServer) -> None:
    result = run_race(redis_server.url, fresh_namespace("race"), "prefix", processes=8)
    assert result["exit_codes"] == [0] * 16
    assert len(result["survivors"]) > 0
    assert result["stale_starts"] > 0
