"""docker-compose.yml against the guides (Docker does not run here: the file is read, not started)."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from kvstatus.url import parse_url
from tests.helpers import ROOT

COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES: dict[str, Any] = COMPOSE["services"]
OPERATIONS = (ROOT / "docs" / "operations.md").read_text()
GUIDE = (ROOT / "docs" / "guide.md").read_text()
DOCKER_SECTION = OPERATIONS.split("## Running Redis with Docker", 1)[1].split("\n## ", 1)[0]


def _profile(name: str) -> dict[str, Any]:
    return {n: s for n, s in SERVICES.items() if name in s.get("profiles", [])}


def _flag(service: dict[str, Any], flag: str) -> str:
    text = " ".join(service["command"]) if isinstance(service["command"], list) else service["command"]
    found = re.search(rf"{re.escape(flag)}\s+(\S+)", text)
    assert found, f"no {flag} in {text}"
    return found.group(1)


def _readme_url(scheme: str) -> Any:
    urls = re.findall(rf"--url ({re.escape(scheme)}://\S+)", DOCKER_SECTION)
    assert len(urls) == 1, f"expected one {scheme}:// kvstatus command in the Docker section of docs/operations.md"
    return parse_url(urls[0])


def test_standalone_is_the_default_service_on_6379() -> None:
    default = {n: s for n, s in SERVICES.items() if not s.get("profiles")}
    assert list(default) == ["redis"]
    assert "6379:6379" in default["redis"]["ports"]
    assert _readme_url("redis").hosts == (("localhost", 6379),)
    assert "docker compose up -d" in DOCKER_SECTION


def test_cluster_profile_has_three_masters_three_replicas_created_automatically() -> None:
    cluster = _profile("cluster")
    nodes = {n: s for n, s in cluster.items() if n.startswith("cluster-node-")}
    assert len(nodes) == 6
    ports = sorted(int(_flag(s, "--port")) for s in nodes.values())
    assert all(_flag(s, "--cluster-enabled") == "yes" for s in nodes.values())
    create = " ".join(cluster["cluster-init"]["command"])
    assert "--cluster create" in create and "--cluster-replicas 1" in create
    assert sorted(int(p) for p in re.findall(r"127\.0\.0\.1:(\d+)", create)) == ports
    assert set(cluster["cluster-init"]["depends_on"]) == set(nodes)
    url = _readme_url("redis+cluster")
    assert {port for _, port in url.hosts} <= set(ports)
    assert "docker compose --profile cluster up" in DOCKER_SECTION


def test_sentinel_profile_has_master_replica_and_sentinels() -> None:
    sentinel = _profile("sentinel")
    master_port = int(_flag(sentinel["sentinel-master"], "--port"))
    replica = " ".join(sentinel["sentinel-replica"]["command"])
    assert f"--replicaof 127.0.0.1 {master_port}" in replica
    sentinels = {n: s for n, s in sentinel.items() if re.fullmatch(r"sentinel-\d", n)}
    assert len(sentinels) >= 3
    ports = {int(s["environment"]["SENTINEL_PORT"]) for s in sentinels.values()}
    monitor = re.search(r"sentinel monitor (\S+) 127\.0\.0\.1 (\d+) (\d+)", sentinels["sentinel-1"]["command"][-1])
    assert monitor and int(monitor.group(2)) == master_port and int(monitor.group(3)) <= len(sentinels) // 2 + 1
    url = _readme_url("redis+sentinel")
    assert {port for _, port in url.hosts} == ports and url.service == monitor.group(1)
    assert "docker compose --profile sentinel up" in DOCKER_SECTION


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_readme_names_only_existing_services(name: str) -> None:
    mentioned = set(
        re.findall(r"\b(redis|cluster-init|cluster-node-\d|sentinel-(?:master|replica|\d))\b", DOCKER_SECTION)
    )
    mentioned |= {f"cluster-node-{i}" for i in range(1, 7)} if "cluster-node-1..6" in DOCKER_SECTION else set()
    mentioned |= {f"sentinel-{i}" for i in range(1, 4)} if "sentinel-1..3" in DOCKER_SECTION else set()
    assert mentioned - {"redis"} <= set(SERVICES)
    assert name in mentioned, f"service {name} is not described in the Docker section of docs/operations.md"


def test_readme_url_examples_all_parse() -> None:
    section = GUIDE.split("## Topologies and URLs", 1)[1].split("\n## ", 1)[0]
    examples = re.findall(r"\| `((?:redis|rediss|unix)[^`]*://[^`]*)` \|$", section, re.M)
    assert len(examples) == 7
    for url in examples:
        assert parse_url(url).scheme == url.split("://")[0]
