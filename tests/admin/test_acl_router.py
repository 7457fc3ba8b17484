"""The router user of docs/security.md (issue 16, items 4 and 6), on a real Redis: what it is granted, what it is
refused, and, because a tenant is hostile, what it can still do inside its namespace (the doc says so).

Both Lua recipes: ``functions`` (FCALL of the library an admin loaded; Redis 7) and ``eval``.
"""

from __future__ import annotations

from typing import Any, Iterator

import pytest
import redis

from kvstatus import KVPoll, Outcome, PermissionDeniedError, StatusStore
from kvstatus.admin.acl import acl_rules, acl_setuser_line, recipe_commands, router_commands
from kvstatus.admin.functions import load_functions
from kvstatus.errors import InvalidArgumentError
from kvstatus.keys import FATE_FIELD
from kvstatus.model import CancelOutcome, Stage
from kvstatus.scripts import LIBRARY_NAME
from tests.helpers import ROOT
from tests.helpers.backends import fresh_namespace
from tests.helpers.cli import assert_clean_failure, run_cli
from tests.servers import RedisServer

ADMIN = "admin-Rout3r"
SECRET = "router-Pa55"
NS = "ns-r"
SCRIPTS = ["functions", "eval"]
SECURITY = ROOT / "docs" / "security.md"


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer(password=ADMIN) as started:
        with started.client() as admin:
            assert load_functions(admin)
            for scripts in SCRIPTS:
                for user, recipe in (("worker", {}), ("router", {"router": True}), ("dashboard", {"read_only": True})):
                    rules = acl_rules(NS, password=SECRET, scripts=scripts, **recipe)
                    admin.execute_command("ACL", "SETUSER", f"{user}-{scripts}", *rules)
        yield started


def _url(server: RedisServer, user: str, scripts: str) -> str:
    return f"redis://{user}-{scripts}:{SECRET}@{server.host}:{server.port}/0"


def _store(server: RedisServer, user: str, scripts: str, **settings: Any) -> StatusStore:
    return StatusStore.from_url(_url(server, user, scripts), namespace=NS, scripts=scripts, **settings)


def _raw(server: RedisServer, user: str, scripts: str) -> redis.Redis:
    return redis.Redis(host=server.host, port=server.port, username=f"{user}-{scripts}", password=SECRET)


def _key(room: int) -> str:
    return f"kvstatus:{NS}:{{{room}}}"


@pytest.fixture
def admin(server: RedisServer) -> Iterator[redis.Redis]:
    with server.client() as client:
        client.flushdb()
        yield client


def test_the_router_recipe_is_what_cancel_and_the_reads_need_and_no_more() -> None:
    commands = set(router_commands())
    assert {"fcall", "fcall_ro", "hget", "hmget", "hgetall", "pttl", "time", "hset", "hsetnx", "pexpire"} <= commands
    # Not clear (hdel), record_failure (hexists), leases (hincrby), SCAN, wait_for, the near cache.
    assert not {"hdel", "hexists", "hincrby", "scan", "exists", "client|tracking"} & commands
    assert set(recipe_commands(router=True, near_cache=True)) - commands == {"client|tracking", "client|id", "role"}
    assert "+scan" not in acl_rules(NS, router=True, scripts="eval")
    with pytest.raises(InvalidArgumentError, match="read_only .* or router"):
        acl_rules(NS, read_only=True, router=True)


def test_the_workers_lists_hold_what_shared_fate_runs() -> None:
    """get's HMGET, the update script's HSETNX and TIME (the first failure), clear's HGETALL (the room's tidy-up)."""
    assert {"hmget", "hsetnx", "time", "hgetall"} <= set(recipe_commands())
    assert {"hmget", "time"} <= set(recipe_commands(read_only=True))


def test_security_md_shows_the_router_recipe() -> None:
    assert acl_setuser_line("router-prod-a", "prod-a", router=True) in SECURITY.read_text(encoding="utf-8")


@pytest.mark.real
@pytest.mark.parametrize("scripts", SCRIPTS)
def test_a_router_cancels_and_reads(server: RedisServer, admin: redis.Redis, scripts: str) -> None:
    with _store(server, "worker", scripts, participant="prefill-0") as worker:
        worker.update_status(1, KVPoll.Transferring)
        worker.update_status(2, KVPoll.Success)
        worker.for_participant("decode-0").update_status(1, KVPoll.WaitingForInput)
    with _store(server, "router", scripts, participant="router-1") as router:
        assert router.cancel(1, "client went away").outcome is CancelOutcome.CANCELLED
        assert router.cancel_many([1, 2, 3], "again") == {
            1: (CancelOutcome.ALREADY_FAILED, 0),
            2: (CancelOutcome.ALREADY_SERVED, 0),  # every entry Success: left as it is
            3: (CancelOutcome.CANCELLED, 0),  # no entry yet: the record alone
        }
        failure = router.failure(1)
        assert failure is not None and (failure.stage, failure.origin, failure.reason) == (
            Stage.CANCELLED,
            "router-1",
            "client went away",
        )
        view = router.room(1)
        assert {n: e.status for n, e in view.participants.items()} == {
            "decode-0": KVPoll.Failed,
            "prefill-0": KVPoll.Failed,
        }
        assert view.participants["prefill-0"].reason == "cancelled by router-1: client went away"
        assert router.for_participant("prefill-0").get(2) is KVPoll.Success
        assert router.for_participant("prefill-0").get_many([1, 2, 3]) == {1: KVPoll.Failed, 2: KVPoll.Success, 3: None}
        assert router.room_status(1, ["prefill-0", "decode-0"]).status is KVPoll.Failed
    assert 0 < admin.pttl(_key(3)) <= 600_000  # the record alone has the store TTL


@pytest.mark.real
@pytest.mark.parametrize("scripts", SCRIPTS)
def test_a_router_is_refused_what_its_recipe_leaves_out(server: RedisServer, admin: redis.Redis, scripts: str) -> None:
    with _store(server, "worker", scripts, participant="prefill-0") as worker:
        worker.update_status(5, KVPoll.Transferring)
        worker.update_status(5, KVPoll.Failed)
    before = admin.hgetall(_key(5))
    with _store(server, "router", scripts, participant="prefill-0") as router:
        for call, command in (
            (lambda: router.clear(5), "hdel"),
            (lambda: router.record_failure(5, "x"), "hexists"),
            (lambda: router.update_status(5, KVPoll.Success), "hdel"),  # leaving Failed drops the reason
        ):
            with pytest.raises(PermissionDeniedError, match=f"'{command}'"):
                call()
    assert admin.hgetall(_key(5)) == before  # refused before any write
    with StatusStore.from_url(_url(server, "router", scripts), namespace="ns-other", scripts=scripts) as intruder:
        with pytest.raises(PermissionDeniedError):
            intruder.cancel(5, "not yours")
        with pytest.raises(PermissionDeniedError):
            intruder.room(5)
    assert list(admin.scan_iter(match="kvstatus:ns-other:*")) == []
    with _raw(server, "router", scripts) as raw:
        for attack in (
            ("SCAN", "0"),
            ("HDEL", _key(5), "prefill-0"),
            ("DEL", _key(5)),
            ("CLIENT", "TRACKING", "on"),
            ("SUBSCRIBE", _key(5)),
            ("HGET", "kvstatus:ns-other:{5}", "prefill-0"),
        ):
            with pytest.raises(redis.exceptions.NoPermissionError):
                raw.execute_command(*attack)
        if scripts == "functions":
            with pytest.raises(redis.exceptions.NoPermissionError):
                raw.execute_command("EVAL", "return 1", "0")


@pytest.mark.real
@pytest.mark.parametrize("scripts", SCRIPTS)
def test_what_a_router_can_still_do_inside_its_namespace(server: RedisServer, admin: redis.Redis, scripts: str) -> None:
    """docs/security.md, "The router user": ACL cannot limit FCALL to one function nor HSET to Lua, so a hostile
    router can forge, fail and expire any room of its namespace, and release a worker's lease. Nothing more: the
    test above holds the rest."""
    with _store(server, "worker", scripts, participant="prefill-0", lease_ttl=30) as worker:
        worker.update_status(8, KVPoll.Transferring)
        worker.update_status(9, KVPoll.Bootstrapping)
        incarnation = admin.hget(f"kvstatus:{NS}:lease:prefill-0", "inc")
        assert incarnation
        with _store(server, "router", scripts, participant="decode-0") as router:
            # The update function, under any participant's name: a forged Success and a Failed.
            assert router.update_status(8, KVPoll.Success).outcome is Outcome.CREATED
            assert router.for_participant("prefill-0").update_status(9, KVPoll.Failed).outcome is Outcome.FAILED
        with _raw(server, "router", scripts) as raw:
            assert raw.hset(_key(10), "prefill-0", "4") == 1  # raw HSET: a key without TTL
            assert raw.execute_command("PEXPIRE", _key(8), "0") == 1  # raw PEXPIRE 0 deletes any room at once
            if scripts == "functions":  # the lease function: a worker's lease released by someone else
                raw.execute_command(
                    "FCALL",
                    f"{LIBRARY_NAME}_lease",
                    "1",
                    f"kvstatus:{NS}:lease:prefill-0",
                    "release",
                    incarnation,
                    "30000",
                    "600000",
                )
                assert admin.hget(f"kvstatus:{NS}:lease:prefill-0", "state") == b"released"
    assert admin.pttl(_key(10)) == -1 and not admin.exists(_key(8))
    assert admin.hget(_key(9), "prefill-0") == b"0" and admin.hget(_key(9), FATE_FIELD).split(b":")[2] == b"prefill-0"


@pytest.mark.real
@pytest.mark.parametrize("scripts", SCRIPTS)
def test_the_dashboard_cannot_cancel(server: RedisServer, admin: redis.Redis, scripts: str) -> None:
    with _store(server, "worker", scripts, participant="prefill-0") as worker:
        worker.update_status(11, KVPoll.Transferring)
    before = admin.hgetall(_key(11))
    refused = "'fcall'" if scripts == "functions" else "'hgetall'|'hset'"  # the command, or the script's pre-check
    with _store(server, "dashboard", scripts) as reader:
        with pytest.raises(PermissionDeniedError, match=refused):
            reader.cancel(11, "not allowed")
        with pytest.raises(PermissionDeniedError, match=refused):
            reader.cancel_many([11, 12], "not allowed")
        assert reader.for_participant("prefill-0").get(11) is KVPoll.Transferring
    assert admin.hgetall(_key(11)) == before and not admin.exists(_key(12))


@pytest.mark.real
def test_the_worker_recipe_records_a_first_failure_and_clear_drops_it(server: RedisServer, admin: redis.Redis) -> None:
    """The update script's HSETNX and TIME, and clear's HLEN, are granted: a failed room's record goes with its
    last entry (without HLEN it would stay to the TTL)."""
    with _store(server, "worker", "functions", participant="prefill-0") as worker:
        worker.update_status(20, KVPoll.Transferring)
        assert worker.update_status(20, KVPoll.Failed).outcome is Outcome.FAILED
        failure = worker.failure(20)
        assert failure is not None and (failure.stage, failure.origin) == (Stage.TRANSFER, "prefill-0")
        assert worker.clear(20) is True
    assert not admin.exists(_key(20))


@pytest.mark.real
def test_the_cli_cancels_as_the_router_and_not_as_the_dashboard(server: RedisServer, admin: redis.Redis) -> None:
    namespace = {"KVSTATUS_NAMESPACE": NS, "KVSTATUS_SCRIPTS": "functions"}
    with _store(server, "worker", "functions", participant="prefill-0") as worker:
        worker.update_status(30, KVPoll.WaitingForInput)
    done = run_cli(
        "--url",
        _url(server, "router", "functions"),
        "cancel",
        "30",
        "31",
        "--reason",
        "client went away",
        env=namespace,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "room 30: cancelled, 1 open entry failed",
        "room 31: cancelled, 0 open entries failed",
    ]
    shown = run_cli("--url", _url(server, "router", "functions"), "get", "30", env=namespace)
    assert shown.returncode == 0 and "cancelled by operator: client went away" in shown.stdout, shown.stderr
    refused = run_cli("--url", _url(server, "dashboard", "functions"), "cancel", "32", "--reason", "x", env=namespace)
    assert_clean_failure(refused.stdout + refused.stderr, refused.returncode, 1, "'fcall'", secrets=(SECRET,))
    assert not admin.exists(_key(32))
    fresh = fresh_namespace("router")
    other = run_cli(
        "--url",
        _url(server, "router", "functions"),
        "cancel",
        "1",
        "--reason",
        "x",
        env={"KVSTATUS_NAMESPACE": fresh, "KVSTATUS_SCRIPTS": "functions"},
    )
    assert_clean_failure(other.stdout + other.stderr, other.returncode, 1, "ACL", secrets=(SECRET,))
    assert list(admin.scan_iter(match=f"kvstatus:{fresh}:*")) == []
