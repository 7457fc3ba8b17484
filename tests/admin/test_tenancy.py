"""Issue 9 item 10: the tenant ACL recipe (Redis 7 functions) against a hostile tenant, on a real Redis.

A tenant must not run Lua of its own (SCRIPT LOAD / EVAL / FUNCTION LOAD refused), must not read or write
another namespace, and every operation of the library, the CLI and doctor must still work for it and for
the read-only user.
"""

from __future__ import annotations

from typing import Any, Iterator

import pytest
import redis

from kvstatus import BackendError, KVPoll, Outcome, PermissionDeniedError, StatusStore
from kvstatus.admin.acl import acl_rules
from kvstatus.admin.doctor import run_checks
from kvstatus.admin.functions import load_functions
from kvstatus.keys import KeySchema
from kvstatus.scripts import LIBRARY_NAME
from tests.helpers.cli import assert_clean_failure, run_cli
from tests.helpers.tiers import server_version
from tests.servers import RedisClusterServers, RedisServer

pytestmark = pytest.mark.real

ADMIN = "admin-Secr3t"
TENANT = "tenant-Pa55"
USERS = {"tenant-a": ("ns-a", False), "tenant-a-ro": ("ns-a", True), "tenant-b": ("ns-b", False)}


def _add_users(admin: Any) -> None:
    for user, (namespace, read_only) in USERS.items():
        admin.execute_command("ACL", "SETUSER", user, *acl_rules(namespace, read_only=read_only, password=TENANT))


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer(password=ADMIN) as started:
        with started.client() as admin:
            _add_users(admin)
            assert load_functions(admin) == [f"{started.host}:{started.port}"]
        yield started


def _url(server: RedisServer, user: str) -> str:
    return f"redis://{user}:{TENANT}@{server.host}:{server.port}/0"


def _store(server: RedisServer, user: str, namespace: str = "ns-a", **settings: Any) -> StatusStore:
    """A store of the tenant recipe: its Lua runs as functions."""
    return StatusStore.from_url(_url(server, user), namespace=namespace, **{"scripts": "functions", **settings})


def _raw(server: RedisServer, user: str) -> redis.Redis:
    return redis.Redis(host=server.host, port=server.port, username=user, password=TENANT)


@pytest.mark.parametrize("user", ["tenant-a", "tenant-a-ro"])
def test_a_tenant_cannot_run_lua_of_its_own(server: RedisServer, user: str) -> None:
    with _raw(server, user) as tenant:
        attacks = [
            ("SCRIPT", "LOAD", "while true do end"),
            ("EVAL", "while true do end", "0"),
            ("EVALSHA", "0" * 40, "0"),
            ("EVAL_RO", "return 1", "0"),
            ("FUNCTION", "LOAD", "#!lua name=evil\nredis.register_function('spin', function() while true do end end)"),
            ("FUNCTION", "DELETE", LIBRARY_NAME),
            ("FUNCTION", "FLUSH"),
            ("SCRIPT", "FLUSH"),
        ]
        for attack in attacks:
            with pytest.raises(redis.exceptions.NoPermissionError):
                tenant.execute_command(*attack)
    with server.client() as admin:
        assert admin.ping() and admin.function_list(library="evil") == []


def test_a_tenant_cannot_read_write_or_list_another_namespace(server: RedisServer) -> None:
    with _store(server, "tenant-b", "ns-b", participant="p") as b:
        b.update_status(1, KVPoll.Transferring)
    with _store(server, "tenant-a", "ns-b", participant="p") as intruder:
        for call in (
            lambda: intruder.update_status(1, KVPoll.Failed),
            lambda: intruder.get(1),
            lambda: intruder.update_many({1: KVPoll.Failed, 2: KVPoll.Bootstrapping}),
            lambda: intruder.get_many([1, 2]),
            lambda: intruder.record_failure(1, "x"),
            lambda: intruder.clear(1),
            lambda: intruder.room(1),
        ):
            with pytest.raises(PermissionDeniedError) as info:
                call()
            assert TENANT not in str(info.value) and ADMIN not in str(info.value)
    with _raw(server, "tenant-a") as tenant:
        key = "kvstatus:ns-b:{1}"
        for attack in (
            ("HGET", key, "p"),
            ("HSET", key, "p", "0"),
            ("DEL", key),
            ("PEXPIRE", key, "1"),
            ("SCAN", "0", "MATCH", "kvstatus:ns-b:*"),
            ("KEYS", "*"),
            ("INFO", "keyspace"),
            ("FCALL", f"{LIBRARY_NAME}_update", "1", key, "seed", "1000", "p", "reason:p", "inc:p", "", "", "0"),
        ):
            with pytest.raises(redis.exceptions.NoPermissionError):
                tenant.execute_command(*attack)
    with _store(server, "tenant-b", "ns-b", participant="p") as b:
        assert b.get(1) is KVPoll.Transferring and b.room(1).ttl_ms > 500_000


def test_the_library_works_for_the_tenant_and_the_read_only_user(server: RedisServer) -> None:
    with server.client() as admin:
        admin.script_flush()  # functions do not live in the script cache: nothing to heal
    with _store(server, "tenant-a", participant="p0") as store:
        assert store.scripts == "functions"
        assert store.update_status(1, KVPoll.Bootstrapping).outcome is Outcome.CREATED
        assert {r.outcome for r in store.update_many({r: KVPoll.Transferring for r in range(1, 50)}).values()} == {
            Outcome.ADVANCED,
            Outcome.CREATED,
        }
        assert store.update_status(1, KVPoll.Failed).outcome is Outcome.FAILED
        assert store.record_failure(1, "peer lost") is True
        assert store.get(2) is KVPoll.Transferring
        assert store.get_many([1, 2, 99]) == {1: KVPoll.Failed, 2: KVPoll.Transferring, 99: None}
        assert store.room(1).participants["p0"].reason == "peer lost"
        assert store.for_participant("p1").update_status(1, KVPoll.Bootstrapping).outcome is Outcome.CREATED
    with _store(server, "tenant-a-ro", participant="p0") as reader:
        assert reader.get(2) is KVPoll.Transferring
        assert reader.get_many([1, 2]) == {1: KVPoll.Failed, 2: KVPoll.Transferring}
        assert set(reader.room(1).participants) == {"p0", "p1"}
        for call in (
            lambda: reader.update_status(2, KVPoll.Failed),
            lambda: reader.clear(2),
            lambda: reader.record_failure(2, "x"),
            lambda: reader.update_many({2: KVPoll.Success}),
        ):
            with pytest.raises(PermissionDeniedError):
                call()
    with _store(server, "tenant-a", participant="p0") as store:
        assert store.clear(1) is True and store.get(1) is None


@pytest.mark.parametrize("user", ["tenant-a", "tenant-a-ro"])
def test_doctor_passes_for_the_tenant_and_the_read_only_user(server: RedisServer, user: str) -> None:
    with _raw(server, user) as client:
        checks = {c.name: c for c in run_checks(client, KeySchema("ns-a"), 600, "x", scripts="functions")}
    assert all(c.ok for c in checks.values()), checks
    assert "cannot run Lua of its own" in checks["isolation"].detail
    assert LIBRARY_NAME in checks["functions"].detail
    assert checks["server version"].detail == server_version()  # from HELLO: the recipe has no INFO
    if user == "tenant-a":
        assert "refused" in checks["acl scan"].detail  # the worker cannot list the keyspace
    else:
        assert checks["acl"].detail.startswith("read-only user")


def test_the_cli_works_for_the_tenant_and_doctor_flags_an_admin_as_not_isolated(server: RedisServer) -> None:
    env = {"KVSTATUS_NAMESPACE": "ns-a", "KVSTATUS_SCRIPTS": "functions"}
    # Its own entry first: a Failed without one is IGNORED_MISSING (the test must not lean on another test's rooms).
    opened = run_cli("--url", _url(server, "tenant-a"), "set", "7", "transferring", "-p", "p0", env=env)
    assert opened.returncode == 0, opened.stderr
    done = run_cli("--url", _url(server, "tenant-a"), "set", "7", "failed", "-p", "p0", "--reason", "lost", env=env)
    assert done.returncode == 0 and "FAILED" in done.stdout and "reason recorded" in done.stdout, done.stderr
    shown = run_cli("--url", _url(server, "tenant-a-ro"), "get", "7", env=env)
    assert shown.returncode == 0 and "lost" in shown.stdout, shown.stderr
    listed = run_cli("--url", _url(server, "tenant-a-ro"), "ls", env=env)
    assert listed.returncode == 0 and "7" in listed.stdout, listed.stderr
    for user in ("tenant-a", "tenant-a-ro"):
        doctor = run_cli("--url", _url(server, user), "doctor", env=env)
        assert doctor.returncode == 0, doctor.stdout + doctor.stderr
        assert TENANT not in doctor.stdout + doctor.stderr
    admin_url = f"redis://:{ADMIN}@{server.host}:{server.port}/0"
    doctor = run_cli("--url", admin_url, "doctor", env=env)
    isolation = [line.split() for line in doctor.stdout.splitlines() if " isolation " in line]
    assert doctor.returncode == 0 and isolation[0][:5] == ["warn", "isolation", "this", "user", "may"], doctor.stdout
    assert "may run Lua of its own" in doctor.stdout
    cleared = run_cli("--url", _url(server, "tenant-a"), "clear", "7", "-p", "p0", env=env)
    assert cleared.returncode == 0 and "cleared" in cleared.stdout


def test_a_missing_library_says_what_an_admin_runs(server: RedisServer) -> None:
    admin_url = f"redis://:{ADMIN}@{server.host}:{server.port}/0"
    with server.client() as admin:
        admin.function_delete(LIBRARY_NAME)
    try:
        with _store(server, "tenant-a") as store:
            with pytest.raises(BackendError, match=f"{LIBRARY_NAME} .*kvstatus --url ADMIN_URL functions load"):
                store.update_status(1, KVPoll.Bootstrapping)
        env = {"KVSTATUS_NAMESPACE": "ns-a"}
        failed = run_cli(
            "--url", _url(server, "tenant-a"), "--scripts", "functions", "set", "1", "bootstrapping", env=env
        )
        assert_clean_failure(failed.stdout + failed.stderr, failed.returncode, 1, "functions load", secrets=(TENANT,))
        doctor = run_cli("--url", _url(server, "tenant-a"), "--scripts", "functions", "doctor", env=env)
        assert doctor.returncode == 1 and "functions load" in doctor.stdout
        listed = run_cli("--url", admin_url, "functions", "list", env=env)
        assert listed.returncode == 1 and "is not loaded" in listed.stderr
    finally:
        loaded = run_cli("--url", admin_url, "functions", "load", env={})
        assert loaded.returncode == 0 and "loaded kvstatus' function library" in loaded.stdout, loaded.stderr
    listed = run_cli("--url", admin_url, "functions", "list", env={})
    assert listed.returncode == 0 and f"{LIBRARY_NAME} (this version)" in listed.stdout
    with _store(server, "tenant-a") as store:
        assert store.update_status(1, KVPoll.Bootstrapping).outcome is Outcome.CREATED


def test_an_eval_store_under_the_tenant_recipe_is_told_to_use_functions(server: RedisServer) -> None:
    with StatusStore.from_url(_url(server, "tenant-a"), namespace="ns-a") as store:
        assert store.scripts == "eval"  # the default
        with pytest.raises(PermissionDeniedError, match='scripts="functions"'):
            store.update_status(3, KVPoll.Bootstrapping)


def test_the_tenant_recipe_on_a_cluster(redis_cluster: RedisClusterServers) -> None:
    for node in redis_cluster.nodes:
        with node.client() as admin:
            admin.execute_command("ACL", "SETUSER", "tenant-c", *acl_rules("ns-c", password=TENANT))
            admin.execute_command("ACL", "SETUSER", "tenant-c-ro", *acl_rules("ns-c", read_only=True, password=TENANT))
    hosts = ",".join(f"{h}:{p}" for h, p in redis_cluster.startup_nodes)
    admin_url = f"redis+cluster://{hosts}"
    loaded = run_cli("--url", admin_url, "functions", "load", env={})
    assert loaded.returncode == 0 and loaded.stdout.count(":") >= 3, loaded.stdout + loaded.stderr
    url = f"redis+cluster://tenant-c:{TENANT}@{hosts}"
    with StatusStore.from_url(url, namespace="ns-c", participant="p", scripts="functions") as store:
        results = store.update_many({r: KVPoll.Bootstrapping for r in range(100)})
        assert {r.outcome for r in results.values()} == {Outcome.CREATED}
        assert store.update_status(5, KVPoll.Failed).outcome is Outcome.FAILED
        assert store.record_failure(5, "lost") is True
        assert store.get_many(range(100))[99] is KVPoll.Bootstrapping
    ro_url = url.replace("tenant-c:", "tenant-c-ro:")
    with StatusStore.from_url(ro_url, namespace="ns-c", participant="p", scripts="functions") as ro:
        assert ro.get_many([5, 6]) == {5: KVPoll.Failed, 6: KVPoll.Bootstrapping}
        with pytest.raises(PermissionDeniedError):
            ro.update_status(6, KVPoll.Success)


def test_what_a_hostile_tenant_can_forge_in_its_own_namespace_is_named_or_fails_nothing(server: RedisServer) -> None:
    """The fields the fencing, the timelines and the peer watch read, forged by a tenant with the worker recipe
    (a raw HSET, which its recipe grants): a malformed stamp fences nothing and a malformed timeline is left out
    and named (issue 36), never a Lua error or a guess; a forged lease address fails no room while Redis says the lease is held; and none of it
    reaches another namespace (tenant-b is refused). docs/security.md lists what a forged well-formed value does
    (a future stamp supersedes the worker: write access to a namespace is no boundary inside it)."""
    with _store(server, "tenant-a", participant="prefill-7", lease_ttl=3, timeline=True, address="10.0.0.7:8998") as p:
        decode = _store(server, "tenant-a", participant="decode-7", lease_ttl=3)
        try:
            p.update_status(71, KVPoll.Bootstrapping)
            decode.update_status(72, KVPoll.Bootstrapping)
            decode.awaits(72, "10.0.0.7:8998")
            key, lease = KeySchema("ns-a").room_key(71), KeySchema("ns-a").lease_key("prefill-7")
            with _raw(server, "tenant-a") as tenant:
                tenant.hset(key, "inc:prefill-7", "garbage")  # a stamp kvstatus does not write fences nothing
                assert p.update_status(71, KVPoll.WaitingForInput).outcome is Outcome.ADVANCED
                assert tenant.hget(key, "inc:prefill-7") == str(p.lease.epoch).encode()  # replaced by the writer's
                tenant.hset(key, mapping={"inc:prefill-7": str(p.lease.epoch), "t:prefill-7": "garbage"})
                assert p.get(71) is KVPoll.WaitingForInput  # the poll reads the entry only
                view = p.room(71)  # the statuses are read; the junk timeline is left out, and named
                assert view.participants["prefill-7"].status is KVPoll.WaitingForInput
                assert "prefill-7" not in view.timelines
                assert [m for m in view.ignored if "field t:prefill-7 holds 'garbage', not a timeline" in m]
                for forged in ("10.0.0.7:8998 evil", "10.0.0.8:8998"):
                    tenant.hset(lease, "addr", forged)
                    assert decode.look_at_peers() == 0  # the lease is held: nothing fails, whatever it says
                assert decode.get(72) is KVPoll.Bootstrapping
            with _raw(server, "tenant-b") as other:
                with pytest.raises(redis.exceptions.NoPermissionError):
                    other.hset(lease, "addr", "10.0.0.7:8998")
        finally:
            decode.close()
