"""The CLI end to end: ``python -m kvstatus.cli`` in a subprocess against real redis-server processes."""

from __future__ import annotations

import json
from typing import Iterator

import pytest

from kvstatus import KVPoll, StatusStore
from kvstatus.keys import PROBE_PARTICIPANT
from tests.helpers.backends import fresh_namespace
from tests.helpers.cli import assert_clean_failure, json_lines, run_cli
from tests.helpers.tiers import server_version
from tests.servers import RedisServer

pytestmark = pytest.mark.real

SECRET = "s3cret-Pa55"


@pytest.fixture
def env(redis_server: RedisServer) -> dict[str, str]:
    return {"KVSTATUS_URL": redis_server.url, "KVSTATUS_NAMESPACE": fresh_namespace("cli")}


@pytest.fixture(scope="module")
def locked_server() -> Iterator[RedisServer]:
    """A redis-server with a password on the default user, and two ACL users for doctor."""
    with RedisServer(password=SECRET) as server:
        admin = server.client()
        admin.execute_command(
            "ACL",
            "SETUSER",
            "reader",
            "on",
            f">{SECRET}",
            "~kvstatus:*",
            "+@read",
            "+evalsha",
            "+ping",
            "+scan",
            "+script|load",
            "+client|setname",
            "+info",
        )
        admin.execute_command("ACL", "SETUSER", "noscan", "on", f">{SECRET}", "~kvstatus:*", "+@all", "-scan")
        admin.execute_command("ACL", "SETUSER", "nohgetall", "on", f">{SECRET}", "~kvstatus:*", "+@all", "-hgetall")
        yield server


def test_lifecycle_through_the_cli(env: dict[str, str], redis_server: RedisServer) -> None:
    assert (
        run_cli("set", "42", "Bootstrapping", "-p", "prefill-0", env=env).stdout
        == "room 42 prefill-0: CREATED -> Bootstrapping(1)\n"
    )
    assert "ADVANCED -> Transferring(3)" in run_cli("set", "42", "3", "-p", "prefill-0", env=env).stdout
    failed = run_cli("set", "42", "failed", "-p", "decode-0", env=env)
    assert "IGNORED_MISSING" in failed.stdout
    got = json.loads(run_cli("get", "42", "--json", env=env).stdout)["rooms"][0]
    assert got["participants"] == {
        "prefill-0": {"status": "Transferring", "value": 3, "reason": None, "reads": "Transferring"}
    }
    assert 590_000 < got["ttl_ms"] <= 600_000
    assert [r["room"] for r in json_lines(run_cli("ls", "--json", env=env).stdout)] == [42]
    stats = json.loads(run_cli("stats", "--json", env=env).stdout)
    assert stats["by_status"]["Transferring"] == 1 and stats["keys_without_ttl"] == 0
    watch = json_lines(run_cli("watch", "--count", "1", "--json", env=env).stdout)
    assert watch[0]["rooms"] == 1
    assert run_cli("clear", "42", "-p", "prefill-0", env=env).stdout == "room 42 prefill-0: cleared\n"
    missing = run_cli("get", "42", env=env)
    assert_clean_failure(missing.stderr, missing.returncode, 1, "room 42 not found")
    assert "by prefill-0 at Transferring" in missing.stderr  # the tombstone says who cleared it, and when
    raw = redis_server.client()
    namespace = env["KVSTATUS_NAMESPACE"]
    assert [k.decode() for k in raw.scan_iter(match=f"kvstatus:{namespace}:*")] == [f"kvstatus:{namespace}:{{42}}:t"]
    assert 0 < raw.pttl(f"kvstatus:{namespace}:{{42}}:t") <= 60_000


def test_doctor_passes_on_a_full_user_and_removes_its_probe(env: dict[str, str], redis_server: RedisServer) -> None:
    result = run_cli("doctor", env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[1].split()[:5] == ["ok", "server", "version", *server_version().split()]
    assert lines[2].split() == ["ok", "topology", "standalone"]
    assert all(line.split()[0] in ("ok", "warn") for line in lines), lines  # one verdict a line
    assert "WARNING" not in result.stdout and lines[-1].split()[0] == "ok"
    raw = redis_server.client()
    left = {k.decode() for k in raw.scan_iter(match=f"kvstatus:{env['KVSTATUS_NAMESPACE']}:*")}
    # The near cache's database marker (SWAPDB detection, one day's TTL) is shared state, not a probe.
    assert left <= {f"kvstatus:{env['KVSTATUS_NAMESPACE']}:db"}, left


def test_doctor_reports_a_read_only_user(locked_server: RedisServer) -> None:
    url = f"redis://reader:{SECRET}@{locked_server.host}:{locked_server.port}/0"
    result = run_cli("--url", url, "--namespace", "ro", "doctor")
    # issue 9 item 14: a read-only user with every read it needs passes (exit 0)
    assert_clean_failure(
        result.stdout,
        result.returncode,
        0,
        "read-only user: reads ok, writes refused",
        "update_status: NOPERM hset",
        "clear: NOPERM hdel",
        secrets=(SECRET,),
    )
    assert "ok    connectivity" in result.stdout and "reader:***@" in result.stdout


def test_doctor_names_a_missing_command(locked_server: RedisServer) -> None:
    url = f"redis://noscan:{SECRET}@{locked_server.host}:{locked_server.port}/0"
    result = run_cli("--url", url, "--namespace", "ns", "doctor", "--json")
    assert result.returncode == 1
    checks = {c["check"]: c for c in json.loads(result.stdout)["checks"]}
    assert checks["acl scan"] == {"check": "acl scan", "ok": False, "verdict": "fail", "detail": "NOPERM scan"}
    assert checks["acl update_status"]["ok"] and checks["acl clear"]["ok"]
    admin = locked_server.client()
    assert admin.hgetall(f"kvstatus:ns:{{{2**63 - 1}}}") == {}


def test_doctor_reports_every_check_when_a_read_is_refused(locked_server: RedisServer) -> None:
    url = f"redis://nohgetall:{SECRET}@{locked_server.host}:{locked_server.port}/0"
    result = run_cli("--url", url, "--namespace", "ns", "doctor", "--json")
    assert result.returncode == 1, result.stderr
    checks = {c["check"]: c for c in json.loads(result.stdout)["checks"]}
    assert checks["ttl"]["ok"] is False and "NOPERM hgetall" in checks["ttl"]["detail"]
    assert checks["acl room"] == {"check": "acl room", "ok": False, "verdict": "fail", "detail": "NOPERM hgetall"}
    assert checks["acl get"]["ok"] and checks["acl scan"]["ok"]


def test_wrong_password_is_reported_without_the_password(locked_server: RedisServer) -> None:
    url = f"redis://default:wrong-{SECRET}@{locked_server.host}:{locked_server.port}/0"
    result = run_cli("--url", url, "--namespace", "ns", "get", "1")
    assert_clean_failure(
        result.stderr, result.returncode, 1, "Redis refused the credentials", "password", secrets=(SECRET,)
    )
    assert SECRET not in result.stdout


def test_unreachable_url_is_an_operational_error(redis_server: RedisServer) -> None:
    url = f"redis://admin:{SECRET}@127.0.0.1:1/0?socket_connect_timeout=0.5"
    result = run_cli("--url", url, "--namespace", "ns", "ls")
    assert_clean_failure(
        result.stderr,
        result.returncode,
        1,
        "Redis unavailable",
        "Connection refused",
        "kvstatus doctor",
        secrets=(SECRET,),
    )
    doctor = run_cli("--url", url, "--namespace", "ns", "doctor")
    assert_clean_failure(doctor.stdout, doctor.returncode, 1, "fail  connectivity", secrets=(SECRET,))


def test_bad_input_in_a_subprocess(env: dict[str, str]) -> None:
    for args, needle in [
        (["get", "12x"], "invalid room '12x'"),
        (["set", "1", "finished"], "invalid status"),
        (["--namespace", "a b", "ls"], "invalid namespace 'a b'"),
    ]:
        result = run_cli(*args, env=env)
        assert_clean_failure(result.stderr, result.returncode, 2, needle)


def test_probe_entry_of_a_running_doctor_is_not_listed(env: dict[str, str], redis_server: RedisServer) -> None:
    store = StatusStore(redis_server.client(), namespace=env["KVSTATUS_NAMESPACE"])
    store.for_participant(PROBE_PARTICIPANT).update_status(9, KVPoll.Bootstrapping)
    assert run_cli("ls", "--json", env=env).stdout == ""


def test_watch_exits_cleanly_on_ctrl_c(env: dict[str, str]) -> None:
    import os
    import signal
    import subprocess
    import sys

    environment = {**{k: v for k, v in os.environ.items() if not k.startswith("KVSTATUS_")}, **env}
    # A shell that starts jobs in the background hands them SIGINT ignored; an operator's terminal does not.
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvstatus.cli", "watch", "--interval", "0.2"],
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        assert proc.stdout.readline().startswith("kvstatus watch  namespace cli-")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "stopped" in err


@pytest.mark.slow
def test_doctor_and_ls_on_a_sentinel_master_client() -> None:
    """Through the CLI's client seam: a Sentinel-managed master client, as redis+sentinel:// URLs will build."""
    from tests.helpers.cli import invoke
    from tests.servers import RedisSentinelServers

    with RedisSentinelServers() as group:
        store = StatusStore(group.client(), namespace="sent")
        store.update_status(11, KVPoll.Transferring)
        doctor = invoke(lambda url: group.client(), "--namespace", "sent", "doctor")
        assert doctor.exit_code == 0, doctor.output
        assert "topology             sentinel, service 'mymaster'" in doctor.output
        listed = json_lines(invoke(lambda url: group.client(), "--namespace", "sent", "ls", "--json").stdout)
        assert [r["room"] for r in listed] == [11]
