"""Issue 35 item 1: one fate in every view, and a verdict that sees deaths. Against a real redis-server, as an
operator scripts it (exit codes, ``--json`` parsed with json, a ``set -e`` shell).

- A room whose prefill failed: ``ls`` (text and --json), ``stats``, ``watch --json`` and the exporter show its
  decode as Failed by the room's fate (first failure and cause), as ``get`` does, not WaitingForInput.
- A prefill killed (SIGKILL, its lease then lapsed): ``ls --stuck`` names it as the holder of the rooms it left,
  ``ls --lost`` lists them, and ``health`` judges its pair unhealthy although the pair served a room before;
  after a restart under the same name ``ls --lost`` and ``ls --stuck`` still list those rooms (their entries
  carry the old incarnation's epoch), and ``health`` stays unhealthy until the pair serves again.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import Any, Iterator

import pytest
from prometheus_client import generate_latest

from kvstatus import KVPoll, StatusStore
from kvstatus.admin.health import HealthSettings
from kvstatus.admin.reads import read_deaths
from kvstatus.keys import KeySchema
from kvstatus.observe.board import Board
from kvstatus.observe.exporter import build_registry
from kvstatus.observe.scanner import PassLoop
from tests.cli.test_operator_answers import CHECKOUT_ENV
from tests.helpers.backends import fresh_namespace
from tests.helpers.cli import json_lines, run_cli
from tests.observe.test_exporter_health import one, samples
from tests.servers import RedisServer

pytestmark = pytest.mark.real

B, W, T, S, F = KVPoll.Bootstrapping, KVPoll.WaitingForInput, KVPoll.Transferring, KVPoll.Success, KVPoll.Failed
EXIT_UNHEALTHY = 5
EXIT_STUCK = 4
CAUSE = "failed at transfer by prefill-0: NIXL transfer timed out"


@pytest.fixture
def env(redis_server: RedisServer) -> dict[str, str]:
    return {"KVSTATUS_URL": redis_server.url, "KVSTATUS_NAMESPACE": fresh_namespace("fate")}


def _store(redis_server: RedisServer, env: dict[str, str], participant: str, **settings: Any) -> StatusStore:
    return StatusStore.from_url(
        redis_server.url, namespace=env["KVSTATUS_NAMESPACE"], participant=participant, timeline=True, **settings
    )


def _ok(env: dict[str, str], *args: str, code: int = 0) -> str:
    done = run_cli(*args, env=env)
    assert done.returncode == code, (args, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    return done.stdout


def _failed_room(redis_server: RedisServer, env: dict[str, str]) -> tuple[StatusStore, StatusStore]:
    """Room 7: the prefill failed its transfer, the decode's entry still says WaitingForInput; room 8: open."""
    prefill, decode = _store(redis_server, env, "prefill-0"), _store(redis_server, env, "decode-0")
    prefill.update_status(7, T)
    decode.update_status(7, W)
    prefill.update_status(7, F)
    prefill.record_failure(7, "NIXL transfer timed out")
    decode.update_status(8, W)
    return prefill, decode


def test_ls_and_stats_show_the_room_fate_as_get_does(redis_server: RedisServer, env: dict[str, str]) -> None:
    prefill, decode = _failed_room(redis_server, env)
    with prefill, decode:
        got = _ok(env, "get", "7")
        assert "decode-0 reads Failed (shared fate)" in got and CAUSE in got
        rows = {line.split()[1]: line for line in _ok(env, "ls").splitlines()[1:] if line.split()[0] == "7"}
        assert rows["decode-0"].split()[2] == "Failed(0)", rows
        assert f"shared fate (own entry WaitingForInput(2)): {CAUSE}" in rows["decode-0"]
        assert rows["prefill-0"].split()[2] == "Failed(0)"
        (room,) = [line for line in json_lines(_ok(env, "ls", "--json")) if line["room"] == 7]
        assert room["participants"]["decode-0"]["status"] == "WaitingForInput"  # the entry as stored
        assert room["participants"]["decode-0"]["reads"] == "Failed"  # what every read of decode-0 answers
        assert room["failure"]["origin"] == "prefill-0" and room["failure"]["reason"] == "NIXL transfer timed out"
        waiting = json_lines(_ok(env, "ls", "--status", "waitingforinput", "--json"))
        assert [line["room"] for line in waiting] == [8]  # room 7's decode waits for nothing any more
        assert {line["room"] for line in json_lines(_ok(env, "ls", "--status", "failed", "--json"))} == {7}
        stats = json.loads(_ok(env, "stats", "--json"))
        assert stats["by_status"]["WaitingForInput"] == 1 and stats["by_status"]["Failed"] == 2
        assert stats["by_participant"]["decode-0"] == {
            **dict.fromkeys(KVPoll.__members__, 0),
            "Failed": 1,
            "WaitingForInput": 1,
        }
        assert [room["room"] for room in stats["oldest_non_terminal"]] == [8]  # room 7 is done: it failed
        text = _ok(env, "stats")
        assert "decode-0=Failed" not in text and "7 " not in text.split("oldest non-terminal rooms")[1]


def test_the_exporter_counts_entries_as_their_reads_answer(redis_server: RedisServer, env: dict[str, str]) -> None:
    prefill, decode = _failed_room(redis_server, env)
    with prefill, decode:
        loop = PassLoop(redis_server.client(), KeySchema(env["KVSTATUS_NAMESPACE"]))
        assert loop.run_once() is not None
        found = samples(generate_latest(build_registry([loop])))
        ns = env["KVSTATUS_NAMESPACE"]
        assert one(found, "kvstatus_entries", namespace=ns, participant="decode-0", status="Failed") == 1
        assert one(found, "kvstatus_entries", namespace=ns, participant="decode-0", status="WaitingForInput") == 1


def test_watch_json_reports_the_decode_failed_by_the_room_fate(redis_server: RedisServer, env: dict[str, str]) -> None:
    prefill, decode = _store(redis_server, env, "prefill-0"), _store(redis_server, env, "decode-0")
    with prefill, decode:
        prefill.update_status(7, T)
        decode.update_status(7, W)
        watch = subprocess.Popen(
            [sys.executable, "-m", "kvstatus.cli", "watch", "--json", "--count", "2", "--interval", "0.5"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={
                **{k: v for k, v in os.environ.items() if not k.startswith("KVSTATUS_")},
                **env,
                "PYTHONUNBUFFERED": "1",
            },
        )
        assert watch.stdout is not None
        first = json.loads(watch.stdout.readline())  # the first refresh is done: the failure comes after it
        assert first["event"] == "snapshot" and first["by_status"]["WaitingForInput"] == 1
        prefill.update_status(7, F)
        prefill.record_failure(7, "NIXL transfer timed out")
        out, err = watch.communicate(timeout=120)
        assert watch.returncode == 0, err
        events = {line["participant"]: line for line in json_lines(out) if line["event"] == "status"}
        assert events["decode-0"]["status"] == "Failed" and events["decode-0"]["previous_status"] == "WaitingForInput"
        assert events["decode-0"]["failure"]["origin"] == "prefill-0"
        assert events["decode-0"]["failure"]["reason"] == "NIXL transfer timed out"
        assert events["decode-0"]["reached_at_ms"] == round(events["decode-0"]["failure"]["at"] * 1000)


# ---------------------------------------------------------------- a server's death


PREFILL = """
import sys, time
from kvstatus import KVPoll, StatusStore
store = StatusStore.from_url(sys.argv[1], namespace=sys.argv[2], participant="prefill-0", lease_ttl=3, timeline=True)
for status in (KVPoll.Bootstrapping, KVPoll.Transferring, KVPoll.Success):
    store.update_status(1, status)
store.clear(1)
store.update_status(2, KVPoll.Transferring)
print("serving", flush=True)
time.sleep(600)
"""


@pytest.fixture
def killed_prefill(redis_server: RedisServer, env: dict[str, str]) -> Iterator[StatusStore]:
    """prefill-0 (a lease holder, in its own process) served room 1 with decode-0, then died (SIGKILL) while
    Transferring room 2, where decode-0 waits; its lease has lapsed (Redis' clock passed its deadline)."""
    with _store(redis_server, env, "decode-0") as decode:  # no lease: no peer watch fails room 2 meanwhile
        decode.update_status(1, W)
        prefill = subprocess.Popen(
            [sys.executable, "-c", PREFILL, redis_server.url, env["KVSTATUS_NAMESPACE"]],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert prefill.stdout is not None and prefill.stdout.readline() == "serving\n"
        finally:
            prefill.send_signal(signal.SIGKILL)
            prefill.wait()
        decode.update_status(1, S)
        decode.clear(1)
        decode.update_status(2, W)
        redis_server.client().hset(f"kvstatus:{env['KVSTATUS_NAMESPACE']}:lease:prefill-0", "deadline", 1)
        yield decode


def _pair(env: dict[str, str], code: int) -> dict[str, Any]:
    pairs = json.loads(_ok(env, "health", "--json", code=code))["pairs"]
    (pair,) = [pair for pair in pairs if (pair["prefill"], pair["decode"]) == ("prefill-0", "decode-0")]
    return pair


def test_a_dead_prefill_holds_its_rooms_and_its_pair_is_unhealthy(
    killed_prefill: StatusStore, redis_server: RedisServer, env: dict[str, str]
) -> None:
    (stuck,) = json_lines(_ok(env, "ls", "--stuck", "--json"))  # at once: a dead holder never moves again
    assert (stuck["room"], stuck["holder"], stuck["status"], stuck["dead"]) == (2, "prefill-0", "Transferring", True)
    assert "prefill-0 (dead)" in _ok(env, "ls", "--stuck")
    assert [line["room"] for line in json_lines(_ok(env, "ls", "--lost", "--json"))] == [2]
    stats = json.loads(_ok(env, "stats", "--json", code=EXIT_STUCK))
    assert stats["stuck_by_holder"] == {"prefill-0": 1} and stats["rooms_on_lost_participants"] == 1
    assert stats["stuck_dead_holders"] == ["prefill-0"]
    assert "prefill-0 (dead)" in _ok(env, "stats", code=EXIT_STUCK)
    pair = _pair(env, EXIT_UNHEALTHY)  # it served room 1 before it died: not a reason to call it healthy
    assert (pair["succeeded"], pair["stuck"], pair["dead"], pair["verdict"]) == (1, 1, ["prefill-0"], "UNHEALTHY")
    assert "prefill-0 died" in _ok(env, "health", code=EXIT_UNHEALTHY)
    ns = env["KVSTATUS_NAMESPACE"]
    loop = PassLoop(redis_server.client(), KeySchema(ns), health=HealthSettings(), lost_participants=read_deaths)
    assert loop.run_once() is not None  # the exporter's pass, as `kvstatus exporter` runs it: its gauges, /ready
    found = samples(generate_latest(build_registry([loop])))
    assert one(found, "kvstatus_pair_unhealthy", namespace=ns, prefill="prefill-0", decode="decode-0") == 1


def test_after_a_restart_the_rooms_it_left_stay_listed_until_the_pair_serves_again(
    killed_prefill: StatusStore, redis_server: RedisServer, env: dict[str, str]
) -> None:
    decode = killed_prefill
    with _store(redis_server, env, "prefill-0", lease_ttl=3) as restarted:  # a new incarnation takes the name
        restarted.update_status(3, B)
        assert json.loads(_ok(env, "participants", "--json"))["participants"][0]["state"] == "alive"
        script = """
            rooms=$(kvstatus ls --lost --json | python -c 'import json,sys; print(*[json.loads(l)["room"] for l in sys.stdin])')
            test "$rooms" = 2
            kvstatus ls --stuck --json | python -c 'import json,sys; (s,) = map(json.loads, sys.stdin); assert (s["room"], s["holder"], s["dead"]) == (2, "prefill-0", True), s'
            kvstatus health >/dev/null || echo "unhealthy $?"
        """
        done = subprocess.run(
            ["bash", "-c", "set -e\n" + script + "\necho reached-the-end"],
            env={**env, **CHECKOUT_ENV},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout.splitlines() == ["unhealthy 5", "reached-the-end"], done.stdout + done.stderr
        assert _pair(env, EXIT_UNHEALTHY)["dead"] == ["prefill-0"]
        for status in (T, S):  # the restarted prefill serves room 3: the pair serves again
            restarted.update_status(3, status)
        decode.update_status(3, W)
        decode.update_status(3, S)
        pair = _pair(env, 0)
        assert (pair["dead"], pair["verdict"]) == ([], "healthy")
        assert [line["room"] for line in json_lines(_ok(env, "ls", "--lost", "--json"))] == [2]  # still left


def test_the_board_names_the_dead_holder_and_its_unhealthy_pair(
    killed_prefill: StatusStore, redis_server: RedisServer, env: dict[str, str]
) -> None:
    board = Board(redis_server.client(), KeySchema(env["KVSTATUS_NAMESPACE"]), shown_url=redis_server.url)
    assert board.loop.run_once() is not None  # the board's pass: it reads the leases once
    (stuck,) = board.stuck("0-0", 50, 30.0)["stuck"]  # /api/stuck
    assert (stuck["room"], stuck["holder"], stuck["dead"]) == (2, "prefill-0", True)
    page = board.pairs("0-0", HealthSettings())  # /api/pairs
    (pair,) = [p for p in page["pairs"] if (p["prefill"], p["decode"]) == ("prefill-0", "decode-0")]
    assert (pair["dead"], pair["verdict"], pair["died_ms"]) == (["prefill-0"], "UNHEALTHY", {"prefill-0": None})
