"""The CLI on a Redis Cluster URL (every primary) and under the README's ACL users."""

from __future__ import annotations

import json
from typing import Iterator

import pytest
from click.testing import Result

from kvstatus import KVPoll, StatusStore
from kvstatus.admin.acl import acl_rules
from kvstatus.connection import connect
from tests.helpers.backends import fresh_namespace
from tests.helpers.cli import assert_clean_failure, invoke, json_lines
from tests.servers import RedisClusterServers, RedisServer

pytestmark = pytest.mark.real

ADMIN = "cli-Adm1n-pw"
SECRET = "cli-Us3r-pw"


def _cli(url: str, namespace: str, *args: str) -> Result:
    """``kvstatus --url URL --namespace NAMESPACE ARGS`` in-process, with the CLI's own connect."""
    return invoke(connect, "--url", url, "--namespace", namespace, *args)


def test_ls_stats_watch_and_doctor_cover_every_cluster_primary(redis_cluster: RedisClusterServers) -> None:
    namespace = fresh_namespace("clicl")
    with StatusStore.from_url(redis_cluster.url, namespace=namespace, participant="prefill-0") as store:
        store.update_many({room: KVPoll.Transferring for room in range(300)})
        store.update_many({room: KVPoll.Failed for room in range(0, 300, 3)})
        per_primary = [
            sum(1 for _ in node.scan_iter(match=store.schema.scan_pattern))
            for node in (store.client.get_redis_connection(n) for n in store.client.get_primaries())
        ]
    assert len(per_primary) == 3 and all(per_primary)
    listed = json_lines(_cli(redis_cluster.url, namespace, "ls", "--json", "--batch", "50").output)
    assert sorted(row["room"] for row in listed) == list(range(300))
    stats = json.loads(_cli(redis_cluster.url, namespace, "stats", "--json").output)
    assert stats["rooms"] == 300, stats
    watched = json_lines(_cli(redis_cluster.url, namespace, "watch", "--count", "1", "--json").output)
    snapshot = next(line for line in watched if line["event"] == "snapshot")
    assert snapshot["rooms"] == 300, snapshot
    doctor = _cli(redis_cluster.url, namespace, "doctor", "--json")
    checks = {c["check"]: c for c in json.loads(doctor.output)["checks"]}
    assert doctor.exit_code == 0, doctor.output
    assert checks["topology"]["detail"] == "cluster with 3 primaries"


@pytest.fixture(scope="module")
def acl_server() -> Iterator[RedisServer]:
    with RedisServer(password=ADMIN) as server:
        with server.client() as admin:
            admin.execute_command("ACL", "SETUSER", "worker", *acl_rules("prod-a", password=SECRET, scripts="eval"))
            admin.execute_command(
                "ACL", "SETUSER", "dashboard", *acl_rules("prod-a", read_only=True, password=SECRET, scripts="eval")
            )
            no_hset = [rule for rule in acl_rules("prod-a", password=SECRET, scripts="eval") if rule != "+hset"]
            admin.execute_command("ACL", "SETUSER", "no-hset", *no_hset)
        yield server


def _user_url(server: RedisServer, user: str) -> str:
    return f"redis://{user}:{SECRET}@{server.host}:{server.port}/0"


def test_cli_under_the_namespace_user(acl_server: RedisServer) -> None:
    url = _user_url(acl_server, "worker")
    assert _cli(url, "prod-a", "set", "7", "Bootstrapping", "-p", "prefill-0").exit_code == 0
    got = json.loads(_cli(url, "prod-a", "get", "7", "--json").output)
    assert got["rooms"][0]["participants"]["prefill-0"]["status"] == "Bootstrapping"
    doctor = _cli(url, "prod-a", "doctor", "--json")
    assert doctor.exit_code == 0 and all(c["ok"] for c in json.loads(doctor.output)["checks"]), doctor.output
    refused = _cli(url, "prod-b", "set", "7", "Bootstrapping")
    assert_clean_failure(refused.output, refused.exit_code, 1, "ACL", secrets=(SECRET, ADMIN))


def test_cli_under_the_read_only_user(acl_server: RedisServer) -> None:
    _cli(_user_url(acl_server, "worker"), "prod-a", "set", "8", "Transferring", "-p", "decode-0")
    url = _user_url(acl_server, "dashboard")
    assert any(row["room"] == 8 for row in json_lines(_cli(url, "prod-a", "ls", "--json").output))
    assert json.loads(_cli(url, "prod-a", "stats", "--json").output)["rooms"] >= 1
    refused = _cli(url, "prod-a", "set", "8", "Success", "-p", "decode-0")
    assert_clean_failure(refused.output, refused.exit_code, 1, "ACL", "hset", secrets=(SECRET, ADMIN))
    doctor = json.loads(_cli(url, "prod-a", "doctor", "--json").output)
    assert any(c["check"] == "acl" and "read-only user" in c["detail"] for c in doctor["checks"]), doctor
    with acl_server.client() as admin:
        assert admin.hget("kvstatus:prod-a:{8}", "decode-0") == b"3"


def test_doctor_names_a_permission_missing_from_the_recipe(acl_server: RedisServer) -> None:
    result = _cli(_user_url(acl_server, "no-hset"), "prod-a", "doctor", "--json")
    assert result.exit_code == 1
    checks = {c["check"]: c for c in json.loads(result.output)["checks"]}
    assert "hset" in checks["acl update_status"]["detail"], checks
    assert SECRET not in result.output
