"""End to end at cluster shape: two prefills and two decodes on the plugin's defaults, behind the sglang router at
its defaults (retries, circuit breaker), with the plugin on and off; and the plugin's cost on serving.

Each mode's cluster meets the same faults, in one order, each through a fresh router started before it: a
prefill's SIGKILL, a decode's SIGKILL, a prefill killed and restarted at once under its name, a prefill
SIGSTOPped for 5 s, and clients that leave mid-request. The tables (:mod:`tests.e2e.cluster`) are written to
``build/e2e/cluster-table.{json,md}`` and ``cost-table.*``; ``python -m tests.e2e.table --paste`` puts them into
BENCHMARKS.md and docs/e2e.md.

What this asserts, with the plugin on: no request is left without an answer at the bound after any fault; a
pause fails no request (0 false failures); every server of the cluster has its own participant name, and the
rooms the faults left end failed or cleared, none open. The shares and times are figures for the tables.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Iterator

import pytest

from kvstatus.peerwatch import ORPHAN_SECONDS
from tests.e2e import cluster, deploy, scenarios, table

pytestmark = [pytest.mark.real, pytest.mark.slow, pytest.mark.usefixtures("e2e_ready"), pytest.mark.timeout(2400)]

KILL_PREFILL = "SIGKILL a prefill, requests in flight"
KILL_DECODE = "SIGKILL a decode, requests in flight"
RESTART_PREFILL = "SIGKILL a prefill and restart it under its name at once, requests in flight"
PAUSE_PREFILL = f"SIGSTOP a prefill for {cluster.PAUSE:.0f} s, requests in flight"
FAULTS = (KILL_PREFILL, KILL_DECODE, RESTART_PREFILL, PAUSE_PREFILL)
SETTLE_WAIT = ORPHAN_SECONDS + 30.0
"""Seconds for the rooms the faults left to end (fail or clear) once every request has its answer: a room no
decode joined ends by the orphan purge, ORPHAN_SECONDS after it opened, and a loaded box needs a margin."""

rows: list[dict[str, object]] = []
costs: list[dict[str, object]] = []
disconnects: list[dict[str, object]] = []


@pytest.fixture(scope="module", autouse=True)
def write_tables() -> Iterator[None]:
    """After the module: the measured tables, whatever was measured (a failed run shows what it got)."""
    began = time.monotonic()
    yield
    elapsed = round(time.monotonic() - began)
    if rows or disconnects:
        table.write_cluster(table.OUT, rows, disconnects, elapsed, cluster.DECODE_TOKENS)
    if costs:
        table.write_cost(table.OUT, costs, elapsed)


def test_the_plugins_cost_on_serving(model: Path, logs: Path, redis_url: str) -> None:
    """Two 1+1 pairs side by side, plugin on and off, the same streamed requests sent to each in turn."""
    pairs = {
        mode: scenarios.Deployment(scenarios.settings(mode, model, logs / "cost", redis_url), mode)
        for mode in table.MODES
    }
    try:
        for pair in pairs.values():
            pair.start(wait=False)
        for pair in pairs.values():
            pair.wait_all()
        urls = {mode: pair.router().url for mode, pair in pairs.items()}
        measured = cluster.measure_cost(urls)
    finally:
        for pair in pairs.values():
            pair.stop()
    costs.extend(result.row() for result in measured.values())
    assert all(result.samples for result in measured.values())


@pytest.fixture(scope="module")
def with_plugin(model: Path, logs: Path, redis_url: str) -> Iterator[scenarios.Deployment]:
    yield from scenarios.running("kvstatus", model, logs, redis_url, cluster.SHAPE, cluster.DECODE_TOKENS)


@pytest.fixture(scope="module")
def upstream(
    model: Path, logs: Path, redis_url: str, with_plugin: scenarios.Deployment
) -> Iterator[scenarios.Deployment]:
    with_plugin.stop()  # one cluster at a time: two would not fit the box's two cores
    yield from scenarios.running("upstream", model, logs, redis_url, cluster.SHAPE, cluster.DECODE_TOKENS)


def run_faults(dep: scenarios.Deployment) -> list[cluster.ClusterResult]:
    """The faults of :data:`FAULTS` in turn, each server restored before the next; then the clients that leave.
    Each row is recorded as soon as it is measured."""
    baseline = cluster.unfaulted_p99(dep)
    results: list[cluster.ClusterResult] = []

    def keep(result: cluster.ClusterResult) -> None:
        results.append(result)
        rows.append(result.row())

    keep(cluster.in_flight(dep, KILL_PREFILL, dep.prefills[1].kill, baseline))
    dep.restart("prefill", index=1)
    keep(cluster.in_flight(dep, KILL_DECODE, dep.decodes[1].kill, baseline))
    dep.restart("decode", index=1)
    restarted: list[deploy.Process] = []

    def kill_and_restart() -> None:
        dep.prefills[1].kill()
        restarted.append(dep.restart("prefill", wait=False, index=1))

    keep(cluster.in_flight(dep, RESTART_PREFILL, kill_and_restart, baseline))
    dep.wait(restarted[0])
    keep(cluster.in_flight(dep, PAUSE_PREFILL, cluster.pause(dep.prefills[1], cluster.PAUSE), baseline))
    disconnects.append(cluster.disconnect(dep).row())
    return results


def test_faults_at_cluster_shape_with_the_plugin_on(with_plugin: scenarios.Deployment) -> None:
    listed = scenarios.kvstatus(with_plugin.settings, "participants", "--json")
    assert listed.returncode == 0, listed.stderr
    names = {p["participant"] for p in json.loads(listed.stdout)["participants"] if p["state"] == "alive"}
    assert len(names) == sum(cluster.SHAPE), f"{sum(cluster.SHAPE)} servers on the defaults, names {sorted(names)}"
    results = run_faults(with_plugin)
    unanswered = {r.fault: r.row()["no_answer"] for r in results if r.row()["no_answer"]}
    assert unanswered == {}, f"requests with no answer at the {cluster.BOUND:.0f} s bound: {unanswered}"
    paused = next(r for r in results if r.fault == PAUSE_PREFILL)
    false_failures = [(a.index, a.status, a.cause()) for a in paused.answers if not a.ok]
    assert false_failures == [], f"a {cluster.PAUSE:.0f} s pause failed requests: {false_failures}"
    deadline = time.monotonic() + SETTLE_WAIT
    while scenarios.waited_room_rows(with_plugin.settings) and time.monotonic() < deadline:
        time.sleep(0.5)
    left = [
        scenarios.kvstatus(with_plugin.settings, "get", str(row["room"]), "--json").stdout
        for row in scenarios.waited_room_rows(with_plugin.settings)
    ]
    assert left == [], f"rooms some engine still waits on {SETTLE_WAIT:.0f} s after the faults settled: {left}"


def test_faults_at_cluster_shape_with_the_plugin_off(upstream: scenarios.Deployment) -> None:
    results = run_faults(upstream)
    assert [r.fault for r in results] == list(FAULTS)
