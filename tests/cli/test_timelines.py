"""``kvstatus get``'s timeline table, ``ls --stuck``, the stuck rooms of ``stats`` and ``--older-than`` (issue 20,
items 1, 3 and 5), against a real Redis: rooms written by stores with ``timeline=True``, and stuck rooms made by
writing a timeline with old times by hand (no test waits 30 s)."""

from __future__ import annotations

import json
from typing import Any, Iterator

import pytest
from click.testing import Result

from kvstatus import KVPoll, StatusStore
from kvstatus.admin.reads import server_ms
from kvstatus.connection import connect
from kvstatus.keys import KeySchema
from kvstatus.stuck import DEFAULT_OLDER_THAN_SECONDS
from tests.helpers.backends import fresh_namespace
from tests.helpers.cli import assert_clean_failure, invoke, json_lines, run_cli
from tests.servers import RedisServer

pytestmark = pytest.mark.real


class Namespace:
    """A fresh namespace on the module's real Redis, and the CLI pointed at it."""

    def __init__(self, server: RedisServer) -> None:
        self.server = server
        self.name = fresh_namespace("timeline")
        self.schema = KeySchema(self.name)
        self.raw = server.client()

    def store(self, participant: str, timeline: bool = True) -> StatusStore:
        return StatusStore(self.raw, namespace=self.name, participant=participant, timeline=timeline)

    def cli(self, *args: str) -> Result:
        return invoke(connect, "--namespace", self.name, *args, env={"KVSTATUS_URL": self.server.url})

    def write(self, room: int, **fields: Any) -> None:
        """HSET ``fields`` (a participant's status, ``t_<participant>`` its timeline) into the room, with a TTL."""
        key = self.schema.room_key(room)
        self.raw.hset(key, mapping={name.replace("t_", "t:", 1): value for name, value in fields.items()})
        self.raw.pexpire(key, 600_000)


@pytest.fixture
def ns(real_server: RedisServer) -> Iterator[Namespace]:
    made = Namespace(real_server)
    yield made
    made.raw.close()


def test_get_shows_the_first_arrival_at_each_status_since_the_rooms_first_step(ns: Namespace) -> None:
    base = 1_764_680_000_000
    ns.write(42, **{"prefill-0": 4, "t_prefill-0": f"1@{base} 3+15 4+1234"})
    # decode-0 (seed policy) reached WaitingForInput twice, Failed in between: the table shows each first arrival
    ns.write(42, **{"decode-0": 3, "t_decode-0": f"2@{base + 7} 0+20 2+25 3+61000"})
    done = ns.cli("get", "42")
    assert done.exit_code == 0, done.output
    lines = done.output.splitlines()
    assert lines[3] == "room 42: timeline, since the room's first step (Redis' clock):"
    top, decode, prefill = lines[4:7]
    assert top.split() == ["PARTICIPANT", "Bootstrapping", "WaitingForInput", "Transferring", "Success", "Failed"]
    assert decode.split()[0] == "decode-0" and prefill.split()[0] == "prefill-0"

    def cell(row: str, status: str) -> str:
        """The text of ``row`` under the column of ``status``."""
        at = top.index(status)
        return row[at:].split("  ")[0].strip() if len(row) > at else ""

    statuses = ["Bootstrapping", "WaitingForInput", "Transferring", "Success", "Failed"]
    assert [cell(prefill, s) for s in statuses] == ["+0 ms", "", "+15 ms", "+1.2 s", ""]
    assert [cell(decode, s) for s in statuses] == ["", "+7 ms", "+61 s", "", "+27 ms"]
    assert len(lines) == 7


def test_get_json_carries_every_step_and_rooms_without_timelines_print_as_before(ns: Namespace) -> None:
    prefill, decode = ns.store("prefill-0"), ns.store("decode-0")
    for status in (KVPoll.Bootstrapping, KVPoll.Transferring):
        prefill.update_status(7, status)
    decode.update_status(7, KVPoll.WaitingForInput)
    ns.store("prefill-1", timeline=False).update_status(8, KVPoll.Transferring)
    document = json.loads(ns.cli("get", "7", "8", "--json").output)
    with_steps, without = document["rooms"]
    steps = with_steps["timelines"]
    assert [s["status"] for s in steps["prefill-0"]] == ["Bootstrapping", "Transferring"]
    assert [s["status"] for s in steps["decode-0"]] == ["WaitingForInput"]
    assert all(isinstance(s["at_ms"], int) for s in steps["prefill-0"] + steps["decode-0"])
    assert steps["prefill-0"][0]["at_ms"] <= steps["prefill-0"][1]["at_ms"]
    assert abs(steps["decode-0"][0]["at_ms"] - server_ms(ns.raw)) < 60_000  # Redis' clock, Unix ms
    assert "timelines" not in without
    text = ns.cli("get", "8")
    assert text.exit_code == 0 and "timeline" not in text.output and len(text.output.splitlines()) == 2
    table = ns.cli("get", "7").output
    assert "room 7: timeline, since the room's first step (Redis' clock):" in table
    assert "+0 ms" in table
    listed = json_lines(ns.cli("ls", "--json").output)
    assert {row["room"]: "timelines" in row for row in listed} == {7: True, 8: False}


def _stuck_rooms(ns: Namespace) -> int:
    """Rooms 1 (decode-0 waits, prefill-0 transfers: 60 s still), 2 (a decode alone for 90 s), 3 (moving), 4 (no
    timeline: not judged), 5 (done 60 s ago). Returns Redis' clock (ms)."""
    now = server_ms(ns.raw)
    ns.write(
        1,
        **{"decode-0": 2, "t_decode-0": f"2@{now - 61_000}", "prefill-0": 3, "t_prefill-0": f"1@{now - 65_000} 3+4000"},
    )
    ns.write(2, **{"decode-1": 2, "t_decode-1": f"2@{now - 90_000}"})
    ns.store("prefill-2").update_status(3, KVPoll.Bootstrapping)
    ns.store("prefill-3", timeline=False).update_status(4, KVPoll.Transferring)
    ns.write(5, **{"prefill-4": 4, "t_prefill-4": f"1@{now - 70_000} 4+10000"})
    return now


def test_ls_stuck_lists_only_the_stuck_rooms_with_their_holders(ns: Namespace) -> None:
    _stuck_rooms(ns)
    done = ns.cli("ls", "--stuck")
    assert done.exit_code == 0, done.output
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["ROOM", "HOLDER", "STATUS", "STUCK", "FOR"]
    rows = sorted(line.split() for line in lines[1:])
    assert [row[:-2] for row in rows] == [
        ["1", "decode-0", "WaitingForInput(2)"],
        ["2", "prefill", "(no", "entry)", "-"],
    ]
    assert all(row[-1] == "s" and float(row[-2]) >= 60 for row in rows)
    assert "1 open room has no timeline and could not be judged" in done.stderr
    listed = sorted(json_lines(ns.cli("ls", "--stuck", "--json").stdout), key=lambda row: row["room"])
    assert [{k: v for k, v in row.items() if k != "seconds"} for row in listed] == [
        {"room": 1, "holder": "decode-0", "status": "WaitingForInput", "dead": False},
        {"room": 2, "holder": "prefill (no entry)", "status": None, "dead": False},
    ]
    assert 60 <= listed[0]["seconds"] < 120 and 90 <= listed[1]["seconds"] < 150


def test_ls_stuck_older_than_filters_and_combines_with_the_other_filters(ns: Namespace) -> None:
    _stuck_rooms(ns)
    rooms = lambda *args: sorted(row["room"] for row in json_lines(ns.cli("ls", "--stuck", "--json", *args).stdout))
    assert rooms("--older-than", "75s") == [2]
    assert rooms("--older-than", "1.25m") == [2]
    assert rooms("--older-than", "2m") == []
    assert rooms("--older-than", "59000ms") == [1, 2]  # room 5 is done, room 3 moves
    assert rooms("--participant", "decode-1") == [2]
    assert rooms("--status", "transferring") == [1]
    assert len(rooms("--limit", "1")) == 1
    none = ns.cli("ls", "--stuck", "--older-than", "1h")
    assert none.exit_code == 0 and none.stdout.splitlines() == [none.stdout.splitlines()[0]]  # the header alone


def test_ls_stuck_on_an_empty_namespace_exits_0_and_says_so(ns: Namespace) -> None:
    done = ns.cli("ls", "--stuck")
    assert done.exit_code == 0 and "holds no rooms" in done.stderr and "HOLDER" in done.stdout


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("5x", "invalid duration '5x'"),
        ("0", "expected more than 0"),
        ("0ms", "expected more than 0"),
        ("-5", "invalid duration '-5'"),
        ("721h", "at most 30 days"),
        ("", "invalid duration ''"),
        ("1e3", "invalid duration '1e3'"),
        ("nan", "invalid duration 'nan'"),
    ],
)
def test_bad_older_than_is_a_usage_error(ns: Namespace, value: str, needle: str) -> None:
    for command in (["ls", "--stuck"], ["stats"]):
        done = ns.cli(*command, "--older-than", value)
        assert_clean_failure(done.output, done.exit_code, 2, "Invalid value for '--older-than'", needle)


def test_older_than_without_stuck_is_a_usage_error(ns: Namespace) -> None:
    done = ns.cli("ls", "--older-than", "5s")
    assert_clean_failure(done.output, done.exit_code, 2, "--older-than goes with --stuck")


def test_stats_counts_stuck_rooms_by_holder(ns: Namespace) -> None:
    _stuck_rooms(ns)
    done = ns.cli("stats", "--json")
    assert done.exit_code == 0, done.output  # stuck rooms do not change the exit code
    document = json.loads(done.stdout)
    assert document["stuck_older_than_s"] == DEFAULT_OLDER_THAN_SECONDS
    assert document["stuck_rooms"] == 2
    assert document["stuck_by_holder"] == {"decode-0": 1, "prefill (no entry)": 1}
    assert document["rooms_without_timeline"] == 1
    later = json.loads(ns.cli("stats", "--json", "--older-than", "80").stdout)
    assert (later["stuck_older_than_s"], later["stuck_rooms"], later["stuck_by_holder"]) == (
        80.0,
        1,
        {"prefill (no entry)": 1},
    )
    text = ns.cli("stats")
    assert text.exit_code == 0
    lines = text.stdout.splitlines()
    at = lines.index(
        "rooms stuck for 30 s or more (by their timelines): 2, by holder below (`kvstatus ls --stuck` lists them); "
        "1 open room has no timeline and cannot be judged"
    )
    assert [line.split("  ")[0] for line in lines[at + 1 : at + 4]] == ["HOLDER", "decode-0", "prefill (no entry)"]
    assert lines[at + 2].split()[-1] == "1"
    quiet = ns.cli("stats", "--older-than", "2m").stdout
    assert "rooms stuck for 120 s or more (by their timelines): 0; 1 open room has no timeline" in quiet
    assert "HOLDER" not in quiet


def test_set_records_a_timeline_with_its_flag(ns: Namespace) -> None:
    url = ns.server.url
    done = invoke(
        connect, "--url", url, "--namespace", ns.name, "set", "9", "bootstrapping", "-p", "prefill-0", "--timeline"
    )
    assert done.exit_code == 0, done.output
    invoke(
        connect,
        "--namespace",
        ns.name,
        "set",
        "9",
        "waitingforinput",
        "-p",
        "decode-0",
        env={"KVSTATUS_URL": ns.server.url},
    )
    steps = json.loads(ns.cli("get", "9", "--json").output)["rooms"][0]["timelines"]
    assert list(steps) == ["prefill-0"]  # decode-0 was set without --timeline
    assert [step["status"] for step in steps["prefill-0"]] == ["Bootstrapping"]


def test_as_an_operator_types_it(ns: Namespace) -> None:
    _stuck_rooms(ns)
    env = {"KVSTATUS_URL": ns.server.url, "KVSTATUS_NAMESPACE": ns.name}
    listed = run_cli("ls", "--stuck", "--older-than", "45s", "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    assert sorted(row["room"] for row in json_lines(listed.stdout)) == [1, 2]
    bad = run_cli("ls", "--stuck", "--older-than", "soon", env=env)
    assert_clean_failure(bad.stderr, bad.returncode, 2, "invalid duration 'soon'")
    helped = run_cli("ls", "--help", env=env)
    assert helped.returncode == 0
    shown = " ".join(helped.stdout.split())
    assert "--stuck" in shown and "--older-than DURATION" in shown and "[default: 30s]" in shown
    assert "exits 0 whether or not it finds any" in shown
    stats_help = " ".join(run_cli("stats", "--help", env=env).stdout.split())
    assert "--older-than DURATION" in stats_help and "do not change the exit code" in stats_help
