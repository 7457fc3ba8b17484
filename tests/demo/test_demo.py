"""``kvstatus demo`` end to end at a small size, seeded: its report, its servers, its flags.

That the baselines it compares against are broken (and kvstatus is not under
the same race) is proven once, by tests/torture/test_race.py; here the demo
must run those very baselines and report kvstatus clean.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Iterator

import fakeredis
import pytest
from fakeredis import TcpFakeServer

from kvstatus import StatusStore
from kvstatus.demo.baselines import ClientSideStore, PreFixStore
from kvstatus.demo.workload import IMPLEMENTATIONS, DemoConfig, _Participants, run_demo
from kvstatus.sglang.mapping import RoomStatusMap
from tests.helpers.cli import invoke, run_cli
from tests.servers import free_port

SMALL = ("--requests", "120", "--seed", "7")


def by_implementation(results: list[dict]) -> dict[str, dict]:
    return {r["implementation"]: r for r in results}


def assert_report(rows: dict[str, dict], requests: int) -> None:
    """Every implementation ran the same workload; kvstatus left nothing behind."""
    assert list(rows) == ["kvstatus", "client-side", "sglang-map", "pre-fix"]
    for row in rows.values():
        assert row["requests"] == requests and row["aborts"] > 0 and row["updates"] > 0
    assert len({row["aborts"] for row in rows.values()}) == 1  # same seed, same aborts
    for clean in ("kvstatus", "sglang-map"):
        kv = rows[clean]
        assert (kv["resurrected"], kv["stale"], kv["leaked_keys"], kv["keys_without_ttl"]) == (0, 0, 0, 0)


def test_the_demo_runs_the_shipped_baselines() -> None:
    assert IMPLEMENTATIONS == ("kvstatus", "client-side", "sglang-map", "pre-fix")
    client = fakeredis.FakeRedis()
    kinds = {name: type(_Participants(name, client, "t-demo", 60.0).store("decode-0")) for name in IMPLEMENTATIONS}
    assert kinds == {
        "kvstatus": StatusStore,
        "client-side": ClientSideStore,
        "sglang-map": RoomStatusMap,
        "pre-fix": PreFixStore,
    }


@pytest.mark.real
def test_demo_on_embedded_redis_server(tmp_path) -> None:
    result = run_cli("demo", *SMALL, "--json")
    assert result.returncode == 0, result.stderr
    assert "embedded redis-server" in result.stderr and "embedded server stopped" in result.stderr
    doc = json.loads(result.stdout)
    assert_report(by_implementation(doc["results"]), 4 * 120)
    table = run_cli("demo", "--requests", "40", "--prefill", "1", "--decode", "1")
    assert table.returncode == 0, table.stderr
    header = table.stdout.splitlines()[2]
    assert header.split()[:3] == ["IMPLEMENTATION", "REQUESTS", "ABORTS"]
    assert [line.split()[0] for line in table.stdout.splitlines()[3:7]] == [
        "kvstatus",
        "client-side",
        "sglang-map",
        "pre-fix",
    ]


def test_demo_falls_back_to_fakeredis_without_redis_server(tmp_path: Path) -> None:
    result = run_cli("demo", "--requests", "30", "--seed", "3", "--json", env={"PATH": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    assert "embedded fakeredis TCP server" in result.stderr and "redis-server not on PATH" in result.stderr
    rows = by_implementation(json.loads(result.stdout)["results"])
    assert_report(rows, 4 * 30)


@pytest.fixture
def fake_tcp_url() -> Iterator[str]:
    port = free_port()
    server = TcpFakeServer(("127.0.0.1", port))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        server.shutdown()
        server.server_close()


def test_demo_command_with_url_through_clirunner(fake_tcp_url: str) -> None:
    result = invoke(lambda url: None, "--url", fake_tcp_url, "demo", "--requests", "25", "--json")
    assert result.exit_code == 0, result.output
    assert "demo: using redis://127.0.0.1" in result.stderr
    rows = by_implementation(json.loads(result.stdout)["results"])
    assert_report(rows, 4 * 25)


def test_run_demo_leaves_the_namespace_empty(fake_tcp_url: str) -> None:
    import redis

    results = run_demo(fake_tcp_url, "t-demo", DemoConfig(prefill=1, decode=2, requests=20, seed=5))
    assert [r.implementation for r in results] == ["kvstatus", "client-side", "sglang-map", "pre-fix"]
    assert redis.Redis.from_url(fake_tcp_url).keys("*") == []


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--prefill", "0"], "--prefill"),
        (["--abort-rate", "1.5"], "--abort-rate"),
        (["--requests", "x"], "--requests"),
    ],
)
def test_demo_bad_flags_are_usage_errors(args: list[str], needle: str) -> None:
    result = invoke(lambda url: None, "demo", *args)
    assert result.exit_code == 2 and needle in result.output and "Traceback" not in result.output


def test_demo_refuses_a_cluster_url_cleanly() -> None:
    from click.testing import CliRunner

    from kvstatus.cli import main

    result = CliRunner().invoke(main, ["--url", "redis+cluster://:hunter2@127.0.0.1:1", "demo", "--requests", "5"])
    assert result.exit_code == 1, result.output
    assert "not a cluster" in result.output
    assert "Traceback" not in result.output and "hunter2" not in result.output
