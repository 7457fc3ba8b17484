"""The library under the ACL users of docs/security.md: one namespace each, read-write and read-only."""

from __future__ import annotations

import re
from typing import Iterator

import pytest
import redis

from kvstatus import KVPoll, Outcome, PermissionDeniedError, StatusStore
from kvstatus.admin.acl import (
    acl_rules,
    acl_setuser_line,
    read_only_commands,
    read_write_commands,
    sentinel_acl_rules,
)
from tests.helpers import ROOT
from tests.helpers.clock import hold_background_watch
from tests.servers import RedisClusterServers, RedisSentinelServers, RedisServer

ADMIN_SECRET = "admin-Secr3t"
USER_SECRET = "worker-Pa55"
SECURITY = ROOT / "docs" / "security.md"


def _add_users(client) -> None:
    client.execute_command("ACL", "SETUSER", "ns-a", *acl_rules("ns-a", password=USER_SECRET, scripts="eval"))
    client.execute_command(
        "ACL", "SETUSER", "ns-a-ro", *acl_rules("ns-a", read_only=True, password=USER_SECRET, scripts="eval")
    )


@pytest.fixture(scope="module")
def acl_server() -> Iterator[RedisServer]:
    with RedisServer(password=ADMIN_SECRET) as server:
        with server.client() as admin:
            _add_users(admin)
        yield server


@pytest.fixture
def acl_cluster(redis_cluster: RedisClusterServers) -> RedisClusterServers:
    for node in redis_cluster.nodes:
        with node.client() as client:
            _add_users(client)
    return redis_cluster


def _url(scheme: str, user: str, hosts: str) -> str:
    return f"{scheme}://{user}:{USER_SECRET}@{hosts}"


def _urls(request: pytest.FixtureRequest, topology: str, user: str) -> str:
    if topology == "cluster":
        cluster = request.getfixturevalue("acl_cluster")
        return _url("redis+cluster", user, ",".join(f"{h}:{p}" for h, p in cluster.startup_nodes))
    server = request.getfixturevalue("acl_server")
    return _url("redis", user, f"{server.host}:{server.port}")


def _flush_scripts(request: pytest.FixtureRequest, topology: str) -> None:
    nodes = (
        request.getfixturevalue("acl_cluster").nodes
        if topology == "cluster"
        else [request.getfixturevalue("acl_server")]
    )
    for node in nodes:
        with node.client() as admin:
            admin.script_flush()


TOPOLOGIES = [pytest.param("standalone", marks=pytest.mark.real), pytest.param("cluster", marks=pytest.mark.real)]


@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_namespace_user_reads_and_writes_its_namespace(request: pytest.FixtureRequest, topology: str) -> None:
    with StatusStore.from_url(_urls(request, topology, "ns-a"), namespace="ns-a", participant="p0") as store:
        assert store.update_status(1, KVPoll.Bootstrapping).outcome is Outcome.CREATED
        assert {r.outcome for r in store.update_many({r: KVPoll.Transferring for r in range(200)}).values()} == {
            Outcome.ADVANCED,
            Outcome.CREATED,
        }
        assert store.record_failure(1, "peer lost") is True
        assert store.get_many(range(200))[199] is KVPoll.Transferring
        assert store.room(1).participants["p0"].reason == "peer lost"
        _flush_scripts(request, topology)  # NOSCRIPT healing needs SCRIPT LOAD under this user
        assert store.update_status(2, KVPoll.Success).outcome is Outcome.ADVANCED
        assert store.clear(1) is True


@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_another_namespace_is_refused_clearly(request: pytest.FixtureRequest, topology: str) -> None:
    with StatusStore.from_url(_urls(request, topology, "ns-a"), namespace="ns-b") as store:
        for call in (
            lambda: store.update_status(1, KVPoll.Bootstrapping),
            lambda: store.get(1),
            lambda: store.update_many({1: KVPoll.Bootstrapping, 2: KVPoll.Bootstrapping}),
            lambda: store.get_many([1, 2, 3]),
        ):
            with pytest.raises(PermissionDeniedError, match="ACL") as info:
                call()
            assert USER_SECRET not in str(info.value) and ADMIN_SECRET not in str(info.value)


@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_read_only_user_reads_but_never_writes(request: pytest.FixtureRequest, topology: str) -> None:
    with StatusStore.from_url(_urls(request, topology, "ns-a"), namespace="ns-a", participant="ro") as writer:
        writer.update_many({10: KVPoll.WaitingForInput, 11: KVPoll.Success})
    with StatusStore.from_url(_urls(request, topology, "ns-a-ro"), namespace="ns-a", participant="ro") as reader:
        assert reader.get(10) is KVPoll.WaitingForInput
        assert reader.get_many([10, 11, 12]) == {10: KVPoll.WaitingForInput, 11: KVPoll.Success, 12: None}
        assert reader.room(11).participants["ro"].status is KVPoll.Success
        for call in (
            lambda: reader.update_status(10, KVPoll.Failed),
            lambda: reader.clear(11),
            lambda: reader.update_many({10: KVPoll.Success, 12: KVPoll.Bootstrapping}),
        ):
            with pytest.raises(PermissionDeniedError):
                call()
        assert reader.get_many([10, 11, 12]) == {10: KVPoll.WaitingForInput, 11: KVPoll.Success, 12: None}


def test_readme_recipe_is_the_library_recipe() -> None:
    text = SECURITY.read_text()
    for read_only, user in ((False, "prefill-prod-a"), (True, "dashboard-prod-a")):
        assert acl_setuser_line(user, "prod-a", read_only=read_only) in text
    listed = set(re.findall(r"\+([a-z|_]+)", text.split("## The tenant recipe", 1)[1].split("\n## ", 1)[0]))
    assert set(read_write_commands()) <= listed and set(read_only_commands()) <= listed


@pytest.mark.real
def test_sentinel_user_of_the_recipe_finds_the_master() -> None:
    with RedisSentinelServers(password=ADMIN_SECRET) as group:
        for sentinel in group.sentinels:
            with sentinel.client() as client:
                client.execute_command("ACL", "SETUSER", "kvstatus", *sentinel_acl_rules(USER_SECRET))
                client.execute_command("ACL", "SETUSER", "default", "off")  # only the recipe's user remains
        url = group.url + f"?sentinel_username=kvstatus&sentinel_password={USER_SECRET}"
        with StatusStore.from_url(url, namespace="ns-s") as store:
            assert store.update_status(1, KVPoll.Bootstrapping).outcome is Outcome.CREATED
            assert store.get(1) is KVPoll.Bootstrapping


def test_readme_sentinel_recipe_is_the_library_recipe() -> None:
    line = "ACL SETUSER kvstatus " + " ".join(sentinel_acl_rules("PASSWORD"))
    assert line in SECURITY.read_text()


def test_read_only_rules_have_no_write_command() -> None:
    rules = acl_rules("prod-a", read_only=True)
    assert "~kvstatus:prod-a:*" in rules and "resetchannels" in rules
    assert not {"+hset", "+hsetnx", "+hdel", "+pexpire"} & set(rules)


@pytest.mark.real
@pytest.mark.parametrize("missing", ["pexpire", "hdel"])
def test_an_acl_that_would_stop_a_write_half_way_is_refused_before_any_write(
    acl_server: RedisServer, missing: str
) -> None:
    user = f"ns-a-no-{missing}"
    with acl_server.client() as admin:
        admin.execute_command(
            "ACL", "SETUSER", user, *acl_rules("ns-a", password=USER_SECRET, scripts="eval"), f"-{missing}"
        )
        key = "kvstatus:ns-a:{4242}"
        admin.delete(key, "kvstatus:ns-a:{4241}")
        if missing == "hdel":  # HDEL runs only when an entry leaves Failed (and drops its reason)
            for k in (key, "kvstatus:ns-a:{4241}"):
                admin.hset(k, mapping={"default": "0", "reason:default": "lost"})
                admin.pexpire(k, 60_000)
        before = [admin.hgetall(k) for k in (key, "kvstatus:ns-a:{4241}")]
        with StatusStore.from_url(
            _url("redis", user, f"{acl_server.host}:{acl_server.port}"), namespace="ns-a"
        ) as store:
            with pytest.raises(PermissionDeniedError, match=f"'{missing}'"):
                store.update_status(4242, KVPoll.Bootstrapping)
            with pytest.raises(PermissionDeniedError, match=f"'{missing}'"):
                store.update_many({4241: KVPoll.Bootstrapping, 4242: KVPoll.Bootstrapping})
        assert [admin.hgetall(k) for k in (key, "kvstatus:ns-a:{4241}")] == before  # nothing written


@pytest.mark.real
def test_record_failure_is_refused_before_writing_when_pexpire_is_denied(acl_server: RedisServer) -> None:
    with acl_server.client() as admin:
        admin.execute_command(
            "ACL", "SETUSER", "ns-a-rf", *acl_rules("ns-a", password=USER_SECRET, scripts="eval"), "-pexpire"
        )
        admin.hset("kvstatus:ns-a:{4343}", "default", "3")
        admin.pexpire("kvstatus:ns-a:{4343}", 60_000)
        with StatusStore.from_url(
            _url("redis", "ns-a-rf", f"{acl_server.host}:{acl_server.port}"), namespace="ns-a"
        ) as store:
            with pytest.raises(PermissionDeniedError, match="'pexpire'"):
                store.record_failure(4343, "peer lost")
        assert admin.hgetall("kvstatus:ns-a:{4343}") == {b"default": b"3"}


@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_the_worker_recipe_holds_a_lease_and_watches_its_peers(
    request: pytest.FixtureRequest, topology: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    hold_background_watch(monkeypatch)  # the looks below are the test's own
    url = _urls(request, topology, "ns-a")
    with StatusStore.from_url(url, namespace="ns-a", participant="decode-w", lease_ttl=3) as decode:
        prefill = StatusStore.from_url(url, namespace="ns-a", participant="prefill-w", lease_ttl=3)
        room = 4_000 + (topology == "cluster")
        decode.update_status(room, KVPoll.WaitingForInput)
        prefill.update_status(room, KVPoll.Transferring)  # the acquire writes its mark in the lease index
        assert decode.look_at_peers() == 0
        prefill.close()  # its release's mark tells the peers at once
        assert decode.look_at_peers() == 1
        assert decode.get(room) is KVPoll.Failed
        assert decode.failure(room).describe() == "failed: participant prefill-w lost its lease"
        decode.clear(room)


@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_another_tenant_cannot_hold_a_lease_or_watch_in_a_namespace_not_its_own(
    request: pytest.FixtureRequest, topology: str
) -> None:
    with StatusStore.from_url(_urls(request, topology, "ns-a"), namespace="ns-b", lease_ttl=3) as store:
        with pytest.raises(PermissionDeniedError, match="ACL") as info:
            store.acquire_lease()  # the lease record and its mark in ns-b's lease index
        assert USER_SECRET not in str(info.value) and ADMIN_SECRET not in str(info.value)
        assert store.look_at_peers() == 0  # no lease held: no mark to write, nothing read
        with pytest.raises(redis.exceptions.NoPermissionError):  # nor by hand: a forged mark in ns-b's index
            store.client.execute_command("HSET", "kvstatus:ns-b:leases", "prefill-0", "forged:1")
