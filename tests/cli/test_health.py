"""`kvstatus health` as an operator scripts it: the table, --json, the exit codes (0 healthy, 5 unhealthy, 1 could
not look, 2 bad options), through CliRunner on fakeredis and as a subprocess against a real redis-server."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from typing import Any

import fakeredis
import pytest
import redis

from kvstatus.admin.health import NONE
from kvstatus.cli.health import EXIT_UNHEALTHY
from tests.admin.test_health import build
from tests.helpers.backends import RedisUnderTest
from tests.helpers.cli import assert_clean_failure, invoke, run_cli


@pytest.fixture
def pd() -> Any:
    server = fakeredis.FakeServer()
    backend = RedisUnderTest(
        "fake", fakeredis.FakeRedis(server=server), lambda: fakeredis.FakeRedis(server=server), False
    )
    build(backend)
    yield backend, (lambda url: fakeredis.FakeRedis(server=server))
    backend.close()


def health(pd: Any, *args: str) -> Any:
    backend, connect = pd
    return invoke(connect, "--namespace", backend.namespace, "health", *args)


def test_the_table_names_the_unhealthy_pairs_and_exits_5(pd: Any) -> None:
    result = health(pd)
    assert result.exit_code == EXIT_UNHEALTHY == 5, result.output
    lines = result.output.splitlines()
    assert lines[0].split() == ["PREFILL", "DECODE", "SUCCEEDED", "FAILED", "BY", "STAGE", "STUCK", "OPEN", "VERDICT"]
    assert lines[1].split() == ["prefill-a", "decode-b", "2", "1", "transfer", "1", "0", "0", "healthy"]
    assert lines[2].split() == [
        "prefill-c",
        "decode-d",
        "0",
        "2",
        "cancelled",
        "1",
        "unknown",
        "1",
        "1",
        "0",
        "UNHEALTHY",
    ]
    assert lines[3].split() == ["prefill-e", NONE, "0", "0", "-", "1", "0", "UNHEALTHY"]
    assert lines[4].startswith("3 pairs, 2 unhealthy (failed + stuck >= 1 and nothing succeeded in the last 60s")
    assert lines[5] == "1 room has no prefill or decode participant: not counted in a pair"


def test_json(pd: Any) -> None:
    result = health(pd, "--json")
    assert result.exit_code == 5
    document = json.loads(result.output)
    assert document["healthy"] is False and document["unhealthy"] == ["prefill-c,decode-d", f"prefill-e,{NONE}"]
    assert document["window_seconds"] == 60 and document["older_than_seconds"] == 30 and document["threshold"] == 1
    assert document["rooms"] == 8 and document["unpaired_rooms"] == 1 and document["corrupted_rooms"] == 0
    pairs = {(p["prefill"], p["decode"]): p for p in document["pairs"]}
    assert pairs[("prefill-c", "decode-d")]["failed_by_stage"] == {"cancelled": 1, "unknown": 1}
    assert pairs[("prefill-a", "decode-b")]["verdict"] == "healthy"


def test_threshold_older_than_and_window_change_the_verdict(pd: Any) -> None:
    assert health(pd, "--threshold", "4").exit_code == 0
    relaxed = health(pd, "--threshold", "2", "--older-than", "2m", "--json")
    assert relaxed.exit_code == 5  # c-d: 2 failures still; e's room is no longer stuck at 2 minutes
    assert json.loads(relaxed.output)["unhealthy"] == ["prefill-c,decode-d"]
    narrow = health(pd, "--window", "30s")
    assert narrow.exit_code == 5 and "nothing succeeded in the last 30s" in narrow.output, narrow.output


def test_no_pairs_is_healthy() -> None:
    server = fakeredis.FakeServer()
    result = invoke(lambda url: fakeredis.FakeRedis(server=server), "--namespace", "empty", "health")
    assert result.exit_code == 0
    assert "no prefill-decode pair has a room in namespace 'empty' in the last 60s" in result.output
    as_json = invoke(lambda url: fakeredis.FakeRedis(server=server), "--namespace", "empty", "health", "--json")
    assert as_json.exit_code == 0 and json.loads(as_json.output)["pairs"] == []


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--window", "0"], "invalid duration '0'"),
        (["--window", "soon"], "invalid duration 'soon'"),
        (["--window", "-5s"], "invalid duration '-5s'"),
        (["--window", "61s"], "at most the tombstone TTL (60s)"),
        (["--older-than", "0s"], "invalid duration '0s'"),
        (["--threshold", "0"], "'--threshold'"),
        (["--threshold", "many"], "'--threshold'"),
        (["--tombstone-ttl", "5m"], "No such option '--tombstone-ttl'"),
        (["--batch", "0"], "'--batch'"),
        (["--bogus"], "No such option"),
    ],
)
def test_bad_options_are_usage_errors(pd: Any, args: list[str], needle: str) -> None:
    result = health(pd, *args)
    assert_clean_failure(result.output, result.exit_code, 2, "Error:", needle)


def test_help_states_the_exit_codes() -> None:
    result = invoke(lambda url: None, "health", "--help")
    text = " ".join(result.output.split())
    assert result.exit_code == 0
    assert "Exits 5 when a pair is unhealthy, 0 when every pair is healthy (or there is none)" in text
    for option in ("--window", "--older-than", "--threshold", "--json"):
        assert option in text
    assert "5 health found an unhealthy" in " ".join(invoke(lambda url: None, "--help").output.split())


@pytest.mark.real
def test_as_a_script_runs_it(real_server: Any) -> None:
    """`kvstatus health || alert` in cron: 5 on an unhealthy pair, 0 once healthy, 1 when Redis is down."""
    raw = redis.Redis(host=real_server.host, port=real_server.port)
    backend = RedisUnderTest("real", raw, lambda: redis.Redis(host=real_server.host, port=real_server.port), False)
    try:
        build(backend)
        env = {"KVSTATUS_URL": real_server.url, "KVSTATUS_NAMESPACE": backend.namespace}
        unhealthy = run_cli("health", env=env)
        assert unhealthy.returncode == 5, unhealthy.stderr
        assert "UNHEALTHY" in unhealthy.stdout and unhealthy.stderr == ""
        assert run_cli("health", "--threshold", "4", env=env).returncode == 0
        shell = subprocess.run(
            ["sh", "-c", f"set -e; {shlex.quote(sys.executable)} -m kvstatus.cli health --json >/dev/null; echo no"],
            capture_output=True,
            text=True,
            env={**os.environ, **env},
        )
        assert shell.returncode == 5 and shell.stdout == ""
        down = run_cli("--url", "redis://127.0.0.1:1/0", "--namespace", "x", "health")
        assert_clean_failure(down.stderr, down.returncode, 1, "Redis unavailable")
    finally:
        backend.close()
