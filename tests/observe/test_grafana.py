"""The Grafana dashboard only queries metrics a real exporter serves."""

from __future__ import annotations

import json
import re
from importlib import resources
from typing import Any, Iterator

import pytest
from prometheus_client import CollectorRegistry

from kvstatus import KVPoll, StatusStore
from kvstatus.observe.metrics import StoreMetrics
from kvstatus.timeline import STAGES
from tests.helpers.backends import fresh_namespace
from tests.observe.support import ServerProcess, scrape, wait_until
from tests.servers import RedisServer

METRIC = re.compile(r"\bkvstatus_[a-z_]+\b")


def dashboard() -> dict[str, Any]:
    return json.loads(resources.files("kvstatus.observe").joinpath("grafana-dashboard.json").read_text())


def queries(board: dict[str, Any]) -> Iterator[str]:
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            yield target["expr"]
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            yield variable["query"]["query"]


def library_samples(registry: CollectorRegistry) -> set[str]:
    """The sample names (``_bucket``, ``_total``...) a registry of library metrics serves."""
    return {sample.name for family in registry.collect() for sample in family.samples}


def library_names() -> set[str]:
    """Every sample name of :mod:`kvstatus.observe.metrics` (the library metrics a store's observer serves)."""
    registry = CollectorRegistry()
    StoreMetrics("ns", "decode-0", registry)  # pre-binds every series
    return library_samples(registry)


def test_stage_panels_show_p50_and_p99_by_role_of_the_library_histogram() -> None:
    board = dashboard()
    library = library_names()
    assert "kvstatus_stage_duration_seconds_bucket" in library
    for stage in STAGES:
        panels = [
            p
            for p in board["panels"]
            if any(
                f'stage="{stage}"' in t["expr"] and "kvstatus_stage_duration_seconds" in t["expr"] for t in p["targets"]
            )
        ]
        assert len(panels) == 1, stage
        exprs = sorted(t["expr"] for t in panels[0]["targets"])
        assert [e.split(",")[0] for e in exprs] == ["histogram_quantile(0.5", "histogram_quantile(0.99"], exprs
        for target in panels[0]["targets"]:
            expr = target["expr"]
            assert "sum by (role, le) (rate(kvstatus_stage_duration_seconds_bucket{" in expr and "[5m]" in expr
            assert "participant" not in expr and "{{role}}" in target["legendFormat"]
            assert set(METRIC.findall(expr)) <= library
        assert panels[0]["fieldConfig"]["defaults"]["unit"] == "s"


def test_dashboard_parses_and_every_panel_queries_kvstatus() -> None:
    board = dashboard()
    assert board["uid"] == "kvstatus-rooms" and board["panels"]
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in board["panels"]:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert METRIC.search(target["expr"]), (panel["title"], target["expr"])


@pytest.mark.real
def test_every_query_names_a_metric_the_exporter_serves(redis_server: RedisServer) -> None:
    namespace = fresh_namespace("grafana")
    with StatusStore.from_url(redis_server.url, namespace=namespace, participant="prefill-0") as store:
        store.update_many({room: KVPoll(1 + room % 4) for room in range(20)})
    with ServerProcess("--url", redis_server.url, "exporter", namespace, "--port", "0", "--interval", "0.3") as exp:
        served = wait_until(
            lambda: (s := scrape(exp.base + "/metrics")) and any(name == "kvstatus_rooms" for name, _ in s) and s,
            30,
            "a completed pass",
        )
        assert exp.terminate() == 0
    names = {name for name, _ in served}
    used = {name for query in queries(dashboard()) for name in METRIC.findall(query)}
    assert len(used) >= 10
    # The library metrics come from the workers' stores, not from the exporter: those a real store serves.
    registry = CollectorRegistry()
    metrics = StoreMetrics(namespace, "decode-0", registry)
    with StatusStore.from_url(
        redis_server.url, namespace=namespace, participant="decode-0", timeline=True, metrics=metrics
    ) as store:
        for status in (KVPoll.Bootstrapping, KVPoll.WaitingForInput, KVPoll.Transferring, KVPoll.Success):
            store.update_status(100, status)
        assert store.clear(100) is True
    library = library_samples(registry)
    assert registry.get_sample_value(
        "kvstatus_stage_duration_seconds_count", {"namespace": namespace, "role": "decode", "stage": "transfer"}
    )
    assert used & library and not names & {"kvstatus_stage_duration_seconds_bucket"}
    assert used <= names | library, sorted(used - names - library)


def test_pair_health_and_open_room_panels() -> None:
    """Issue 20 item 4: the pair gauges (unhealthy pairs, per pair succeeded/failed/stuck) and the open rooms'
    ages (oldest by status, time in status p99 from the snapshot histogram: no rate()) have panels."""
    board = dashboard()
    by_metric: dict[str, list[dict[str, Any]]] = {}
    for panel in board["panels"]:
        for name in sorted({m for target in panel["targets"] for m in METRIC.findall(target["expr"])}):
            by_metric.setdefault(name, []).append(panel)
    for name in (
        "kvstatus_unhealthy_pairs",
        "kvstatus_pair_succeeded_rooms",
        "kvstatus_pair_failed_rooms",
        "kvstatus_pair_stuck_rooms",
        "kvstatus_pair_unhealthy",
        "kvstatus_oldest_open_room_age_seconds",
        "kvstatus_open_entry_status_seconds_bucket",
    ):
        assert by_metric.get(name), name
    assert any(p["type"] == "stat" for p in by_metric["kvstatus_unhealthy_pairs"])
    table = next(p for p in by_metric["kvstatus_pair_unhealthy"] if p["type"] == "table")
    assert all(t.get("instant") and t.get("format") == "table" for t in table["targets"])
    assert {m for t in table["targets"] for m in METRIC.findall(t["expr"])} >= {
        "kvstatus_pair_succeeded_rooms",
        "kvstatus_pair_failed_rooms",
        "kvstatus_pair_stuck_rooms",
    }
    (quantiles,) = by_metric["kvstatus_open_entry_status_seconds_bucket"]
    exprs = [t["expr"] for t in quantiles["targets"]]
    assert any(e.startswith("histogram_quantile(0.99, sum by (status, le) (") for e in exprs), exprs
    assert not any("rate(" in e for e in exprs)  # a snapshot of the open entries, not a counter
    assert quantiles["fieldConfig"]["defaults"]["unit"] == "s"
    for panel in (*by_metric["kvstatus_pair_failed_rooms"], *by_metric["kvstatus_oldest_open_room_age_seconds"]):
        assert all('namespace=~"$namespace"' in t["expr"] for t in panel["targets"]), panel["title"]
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids)) and max(ids) == 30
