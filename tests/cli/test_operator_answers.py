"""Issue 19 item 18: what the CLI answers an operator, tested the way scripts use it (``set -e``, cron alerts).

- a mistyped namespace: exit 0 (an empty namespace is a valid state: a quiet cluster must not kill a ``set -e``
  script), stdout stays the empty table, stderr says the namespace holds no rooms;
- ``stats`` with rooms stuck on a lost participant: exit 4 (3, a leak or a corrupted value, wins);
- ``sweep -p NAME`` names what is true of NAME, and the lost participants it left alone;
- ``doctor`` of a functions-recipe tenant without ``--scripts functions`` suggests it once.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import fakeredis
import pytest

from kvstatus import KVPoll, StatusStore
from kvstatus.admin.acl import acl_rules
from kvstatus.admin.functions import load_functions
from tests.helpers.backends import fresh_namespace
from tests.helpers.cli import NS, invoke
from tests.helpers.tiers import require_redis_server
from tests.servers import RedisServer

ROOT = Path(__file__).resolve().parents[2]
CHECKOUT_ENV = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
SECRET = "s3cr3t-operator"
B, T = KVPoll.Bootstrapping, KVPoll.Transferring


@pytest.fixture
def connect_fake(server: fakeredis.FakeServer) -> Any:
    return lambda url: fakeredis.FakeRedis(server=server)


OPENED: list[StatusStore] = []


@pytest.fixture(autouse=True)
def _close_stores() -> Iterator[None]:
    """The stores a test opened are closed after it: a store with a lease runs a keeper thread."""
    yield
    while OPENED:
        OPENED.pop().close()


def _opened(store: StatusStore) -> StatusStore:
    OPENED.append(store)
    return store


def _store(server: fakeredis.FakeServer, **settings: Any) -> StatusStore:
    return _opened(StatusStore(fakeredis.FakeRedis(server=server), namespace=NS, **settings))


def _expire(server: fakeredis.FakeServer, participant: str) -> None:
    fakeredis.FakeRedis(server=server).hset(f"kvstatus:{NS}:lease:{participant}", "deadline", 1)


def cli(connect: Any, *args: str, namespace: str = NS) -> Any:
    return invoke(connect, "--namespace", namespace, *args)


# ---------------------------------------------------------------- a mistyped namespace


@pytest.mark.parametrize("as_json", [False, True])
def test_ls_of_an_empty_namespace_says_so_on_stderr_and_exits_0(server, connect_fake, as_json: bool) -> None:
    _store(server).update_status(1, B)
    result = cli(connect_fake, "ls", *(["--json"] if as_json else []), namespace="prod-b")
    assert result.exit_code == 0
    assert "namespace 'prod-b' holds no rooms" in result.stderr and "--namespace" in result.stderr
    assert result.stdout.split() == ([] if as_json else ["ROOM", "PARTICIPANT", "STATUS", "TTL", "LEFT", "REASON"])
    # A filter that matches nothing in a namespace that has rooms is no typo: no note.
    filtered = cli(connect_fake, "ls", "--status", "failed")
    assert filtered.exit_code == 0 and "holds no rooms" not in filtered.stderr


def test_stats_of_an_empty_namespace_says_so(server, connect_fake) -> None:
    _store(server).update_status(1, B)
    for args in (["stats"], ["stats", "--json"]):
        result = cli(connect_fake, *args, namespace="prod-b")
        assert result.exit_code == 0 and "namespace 'prod-b' holds no rooms" in result.stderr
    assert "holds no rooms" not in cli(connect_fake, "stats").stderr


# ---------------------------------------------------------------- stats: rooms stuck on a lost participant


def test_stats_exits_4_on_stuck_rooms_and_3_wins_over_it(server, connect_fake) -> None:
    dead = _store(server, participant="dead-0", lease_ttl=3)
    dead.update_status(1, T)
    assert cli(connect_fake, "stats").exit_code == 0
    _expire(server, "dead-0")
    for args in (["stats"], ["stats", "--json"]):
        result = cli(connect_fake, *args)
        assert result.exit_code == 4, result.output
    document = json.loads(cli(connect_fake, "stats", "--json").stdout)
    assert document["stuck"] is True and document["findings"] is False
    assert "STUCK: 1 room has" in cli(connect_fake, "stats").stdout
    fakeredis.FakeRedis(server=server).persist(f"kvstatus:{NS}:{{1}}")  # and a leak
    assert cli(connect_fake, "stats").exit_code == 3


def test_the_exit_codes_are_in_the_help() -> None:
    main_help = " ".join(invoke(lambda url: None, "--help").output.split())
    assert "4 stats found rooms stuck on participants whose lease is lost or that restarted" in main_help
    stats_help = " ".join(invoke(lambda url: None, "stats", "--help").output.split())
    assert "else 4 if rooms are stuck" in stats_help


# ---------------------------------------------------------------- sweep -p NAME


def test_sweep_of_a_named_participant_without_a_lease_says_so_and_names_the_lost_one(server, connect_fake) -> None:
    _store(server, participant="dead-0", lease_ttl=3).update_status(1, T)
    _store(server, participant="live-0", lease_ttl=60).update_status(1, T)  # alive throughout: never lapses
    _store(server, participant="plain-0").update_status(1, T)
    _expire(server, "dead-0")
    result = cli(connect_fake, "sweep", "-p", "plain-0", "-p", "live-0")
    assert result.exit_code == 0
    out = result.stdout
    assert "no lost lease in namespace" not in out
    assert "plain-0 has no lease record" in out and "live-0 holds a live lease: not swept" in out
    assert "lost participants dead-0 (run without -p to sweep them)" in out
    document = json.loads(cli(connect_fake, "sweep", "-p", "plain-0", "--json").stdout)
    assert document["not_swept"] == {"plain-0": "no lease record"}
    assert document["other_lost_participants"] == ["dead-0"] and document["entries_failed"] == 0
    assert _store(server).room(1).participants["dead-0"].status is T  # left alone
    swept = cli(connect_fake, "sweep", "-p", "dead-0")
    assert swept.exit_code == 0 and "lost participants: dead-0" in swept.stdout
    assert "failed 1 open entry in 1 room" in swept.stdout and "not swept" not in swept.stdout


def test_sweep_with_nothing_lost_still_says_so(server, connect_fake) -> None:
    assert "no lost lease in namespace 'prod-a'" in cli(connect_fake, "sweep").stdout


# ---------------------------------------------------------------- as a script and cron see it (real Redis)


@pytest.fixture(scope="module")
def real_server() -> Iterator[RedisServer]:
    require_redis_server()
    with RedisServer(password=SECRET) as started:
        with started.client() as admin:
            admin.execute_command("ACL", "SETUSER", "tenant", *acl_rules(NS, password=SECRET))
            admin.execute_command("ACL", "SETUSER", "tenant-ro", *acl_rules(NS, password=SECRET, read_only=True))
            load_functions(admin)
        yield started


def _sh(
    real_server: RedisServer, script: str, namespace: str, user: str = "default", scripts: str = ""
) -> subprocess.CompletedProcess:
    env = {
        "KVSTATUS_URL": f"redis://{user}:{SECRET}@{real_server.host}:{real_server.port}/0",
        "KVSTATUS_NAMESPACE": namespace,
        **({"KVSTATUS_SCRIPTS": scripts} if scripts else {}),
        **CHECKOUT_ENV,
    }
    return subprocess.run(
        ["bash", "-c", "set -e\n" + script + "\necho reached-the-end"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.real
def test_a_set_e_script_survives_an_empty_namespace_and_cron_alerts_on_stuck_rooms(real_server) -> None:
    namespace = fresh_namespace("ops")
    done = _sh(real_server, "kvstatus ls >/dev/null\nkvstatus stats >/dev/null", namespace + "-typo")
    assert done.returncode == 0 and "reached-the-end" in done.stdout
    assert done.stderr.count("holds no rooms") == 2 and SECRET not in done.stderr
    store = _opened(StatusStore(real_server.client(), namespace=namespace, participant="dead-0", lease_ttl=3))
    store.update_status(1, T)
    real_server.client().hset(f"kvstatus:{namespace}:lease:dead-0", "deadline", 1)
    cron = _sh(real_server, "kvstatus stats >/dev/null || { rc=$?; echo ALERT $rc; exit $rc; }", namespace)
    assert cron.returncode == 4 and "ALERT 4" in cron.stdout and "reached-the-end" not in cron.stdout
    fixed = _sh(real_server, "kvstatus sweep >/dev/null\nkvstatus stats >/dev/null", namespace)
    assert fixed.returncode == 0 and "reached-the-end" in fixed.stdout, fixed.stderr


@pytest.mark.real
@pytest.mark.parametrize("user", ["tenant", "tenant-ro"])
def test_doctor_suggests_scripts_functions_once_to_a_tenant_on_eval(real_server, user: str) -> None:
    done = _sh(real_server, "kvstatus doctor", NS, user=user)
    assert done.returncode == 1  # the default, eval, does not work for this user
    assert done.stdout.count("--scripts functions") == 1, done.stdout
    assert len(re.findall(r"^fail", done.stdout, re.M)) == 1, done.stdout  # was 9 NOPERM lines
    assert "NOPERM" in done.stdout.split("\n")[3]
    fixed = _sh(real_server, "kvstatus doctor", NS, user=user, scripts="functions")
    assert fixed.returncode == 0 and "--scripts functions" not in fixed.stdout, fixed.stdout
    admin = _sh(real_server, "kvstatus doctor", NS)  # an admin on an eval URL needs no hint
    assert admin.returncode == 0 and "scripts=functions" not in admin.stdout


@pytest.mark.real
@pytest.mark.parametrize("user", ["tenant", "tenant-ro"])
def test_participants_and_sweep_name_a_tenants_junk_at_the_lease_keys_and_go_on(real_server, user: str) -> None:
    """Issue 36, Medium 4: a string at ``<ns>:leases`` (the peer watch's index) or at a lease record's name was
    passed over in silence; both tools now name each such key on stderr and go on (exit 0, the listing whole)."""
    namespace = fresh_namespace("junk")
    admin = real_server.client()
    # The worker recipe grants SCAN (the tools') under the eval script mode; a read-only user has it in both.
    rules = acl_rules(namespace, password=SECRET, read_only=user == "tenant-ro", scripts="eval")
    admin.execute_command("ACL", "SETUSER", f"{user}-{namespace}", *rules)
    dead = _opened(StatusStore(real_server.client(), namespace=namespace, participant="dead-0", lease_ttl=3))
    dead.update_status(1, T)
    admin.hset(f"kvstatus:{namespace}:lease:dead-0", "deadline", 1)
    admin.set(f"kvstatus:{namespace}:leases", "junk")
    admin.set(f"kvstatus:{namespace}:lease:bogus-1", "junk")
    script = "kvstatus participants\nkvstatus participants --json" + ("\nkvstatus sweep" if user == "tenant" else "")
    done = _sh(real_server, script, namespace, user=f"{user}-{namespace}", scripts="eval")
    assert done.returncode == 0 and "reached-the-end" in done.stdout, done.stderr
    assert "dead-0" in done.stdout and "bogus-1" not in done.stdout  # stdout: the listing, as without junk
    runs = script.count("\n") + 1
    assert done.stderr.count(f"key kvstatus:{namespace}:leases holds a value that is not the lease index") == runs
    assert done.stderr.count(f"key kvstatus:{namespace}:lease:bogus-1 is not a lease record") == runs
    if user == "tenant":
        assert "failed 1 open entry in 1 room" in done.stdout
