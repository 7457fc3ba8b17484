"""The Grafana dashboard only queries metrics a real exporter serves."""

from __future__ import annotations

import json
import re
from importlib import resources
from typing import Any, Iterator

import pytest

from kvstatus import KVPoll, StatusStore
from kvstatus.demo.server import RedisServer
from tests.helpers.backends import fresh_namespace
from tests.observe.support import ServerProcess, scrape, wait_until

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
    assert used <= names, sorted(used - names)
