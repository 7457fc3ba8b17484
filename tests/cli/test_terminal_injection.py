"""Issue 36 (Medium 2): values a hostile tenant writes into Redis never reach the terminal raw.

Reasons, participant names, failure records, timelines, tombstones and lease records full of control characters
(CSI clear-screen, OSC title and OSC 52 clipboard writes, CR, C1 controls, NUL, a bidi override, a newline that
would forge a table row) are written into a real redis-server; every text output an operator reads shows them
escaped (``\\x1b``, ``\\n`` ...), and ``--json`` still carries them exactly.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from typing import Iterator

import pytest

from kvstatus.admin.watch import Change, Snapshot
from kvstatus.cli.namespace import _render
from kvstatus.cli.text import StreamTable, safe, table
from kvstatus.keys import KeySchema
from tests.helpers.backends import fresh_namespace
from tests.helpers.cli import run_cli
from tests.servers import RedisServer

pytestmark = pytest.mark.real

HOSTILE = (
    "\x1b[2J\x1b[H\x1b]0;owned\x07\x1b]52;c;cHduZWQ=\x07\rhidden\x9b31m\x85\x00\u202e\ttail"
    "\nFORGED-ROW 1 default Success(4)"
)
"""A reason: clear screen, cursor home, OSC title, OSC 52 clipboard write, CR, C1 CSI and NEL, NUL, RLO, TAB, LF."""
EVIL_NAME = "decode-\x1b[2Jx\x9b1m\x00"
"""A participant (no colon, so the store reads it as one) that is no name kvstatus accepts."""
EVIL_PREFILL = "prefill-\x1b[5mblink\u2028"
EVIL_ORIGIN = "router\x1b]0;t\x07\r"
RAW = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202e]")
"""Anything but a newline of our own that a terminal acts on."""


@pytest.fixture
def hostile(redis_server: RedisServer) -> Iterator[dict[str, str]]:
    namespace = fresh_namespace("inject")
    schema = KeySchema(namespace)
    client = redis_server.client()
    now_ms = int(time.time() * 1000)
    old = now_ms - 300_000  # five minutes without a step: stuck for --older-than 30s
    room = schema.room_key(1)
    client.hset(
        room,
        mapping={
            "prefill-0": "2",
            "reason:prefill-0": HOSTILE,
            "t:prefill-0": f"1@{old} 2+5",
            EVIL_NAME: "0",
            f"reason:{EVIL_NAME}": HOSTILE,
            f"t:{EVIL_NAME}": f"1@{old} 0+7",
            "room:fate": f"{old}:transfer:{EVIL_ORIGIN}:{HOSTILE}",
        },
    )
    client.pexpire(room, 600_000)
    client.hset(schema.room_key(2) + ":t", EVIL_NAME, f"{now_ms - 2000} 4")  # room 2: cleared by EVIL_NAME
    client.pexpire(schema.room_key(2) + ":t", 600_000)
    client.hset(schema.room_key(3), mapping={"decode-9": "1", "prefill-9": "1"})
    client.pexpire(schema.room_key(3), 600_000)
    stuck = schema.room_key(4)  # open, no step for five minutes: stuck on EVIL_PREFILL
    client.hset(
        stuck, mapping={EVIL_PREFILL: "1", f"t:{EVIL_PREFILL}": f"1@{old}", "decode-4": "2", "t:decode-4": f"2@{old}"}
    )
    client.pexpire(stuck, 600_000)
    lease = schema.base + "lease:decode-9"
    client.hset(
        lease,
        mapping={
            "state": "held",
            "deadline": str(old + 5000),
            "inc": HOSTILE,
            "gen": "1",
            "since": str(old),
            "seen": str(old),
            "ttl": "5000",
        },
    )
    client.pexpire(lease, 600_000)
    yield {"KVSTATUS_URL": redis_server.url, "KVSTATUS_NAMESPACE": namespace}
    client.close()


def _assert_escaped(args: tuple[str, ...], stdout: str, stderr: str) -> None:
    for name, text in (("stdout", stdout), ("stderr", stderr)):
        raw = RAW.search(text)
        assert raw is None, (args, name, raw, text)
        assert not any(line.lstrip().startswith("FORGED-ROW") for line in text.splitlines()), (args, name, text)
        assert "Traceback" not in text, (args, name, text)


COMMANDS: list[tuple[tuple[str, ...], tuple[int, ...]]] = [
    (("get", "1"), (0,)),
    (("get", "1", "2"), (1,)),  # room 2 is gone: the error names who cleared it
    (("ls",), (0,)),
    (("ls", "--stuck"), (0,)),
    (("ls", "--lost"), (0,)),
    (("health",), (0, 5)),  # the verdict is not under test here
    (("stats",), (4,)),
    (("participants",), (0,)),
    (("watch", "--count", "1"), (0,)),
    (("doctor",), (0,)),
    (("cancel", "1", "--reason", "operator"), (0,)),  # had already failed: prints the first failure
    (("sweep",), (0,)),
]


def test_no_control_character_from_redis_reaches_the_terminal(hostile: dict[str, str]) -> None:
    outputs = {}
    for args, code in COMMANDS:
        result = run_cli(*args, env=hostile)
        assert result.returncode in code, (args, result.stdout, result.stderr)
        _assert_escaped(args, result.stdout, result.stderr)
        outputs[args[0] if args[0] != "ls" else " ".join(args)] = result.stdout + result.stderr
    assert (
        "\\x1b[2J\\x1b[H\\x1b]0;owned\\x07\\x1b]52;c;cHduZWQ=\\x07\\rhidden\\x9b31m\\x85\\x00\\u202e\\ttail"
        in (outputs["get"])
    )
    assert "\\nFORGED-ROW" in outputs["get"] and "decode-\\x1b[2Jx\\x9b1m\\x00" in outputs["get"]
    assert "router\\x1b]0;t\\x07\\r" in outputs["cancel"]  # the first failure's origin
    assert "prefill-\\x1b[5mblink\\u2028" in outputs["ls --stuck"] and "\\x1b[2J" in outputs["participants"]
    assert "prefill-\\x1b[5mblink" in outputs["stats"] and "decode-\\x1b[2Jx" in outputs["stats"]


def test_watch_shows_a_changed_room_s_names_escaped() -> None:
    snapshot = Snapshot(rooms={}, by_status=Counter(), corrupted=0, at_ms=0)
    change = Change("new", 7, {}, {EVIL_NAME: "Failed", "decode-0\nFORGED-ROW": "Success"})
    shown = _render("ns", snapshot, [change], 2.0)
    assert RAW.search(shown) is None and "FORGED-ROW" not in [line.split()[0] for line in shown.splitlines() if line]
    assert "decode-\\x1b[2Jx\\x9b1m\\x00=Failed, decode-0\\nFORGED-ROW=Success" in shown


def test_a_newline_in_a_value_adds_no_row_to_ls(hostile: dict[str, str]) -> None:
    listed = run_cli("ls", env=hostile)
    lines = listed.stdout.splitlines()
    assert lines[0].split()[:2] == ["ROOM", "PARTICIPANT"]
    # room 1's two entries, room 3's two, room 4.s two: one line each, whatever their reasons hold
    assert sorted(line.split()[0] for line in lines[1:]) == ["1", "1", "3", "3", "4", "4"], listed.stdout


def test_json_keeps_the_values_exact(hostile: dict[str, str]) -> None:
    document = json.loads(run_cli("get", "1", "--json", env=hostile).stdout)
    room = document["rooms"][0]
    assert room["participants"]["prefill-0"]["reason"] == HOSTILE
    assert room["participants"][EVIL_NAME]["status"] == "Failed"
    assert room["failure"]["origin"] == EVIL_ORIGIN and room["failure"]["reason"] == HOSTILE


@pytest.mark.parametrize(
    "raw, shown",
    [
        ("\x1b[31m", "\\x1b[31m"),
        ("a\r\nb\tc", "a\\r\\nb\\tc"),
        ("\x00\x7f\x9b\x85", "\\x00\\x7f\\x9b\\x85"),
        ("\u202eevil\u2066\u2028", "\\u202eevil\\u2066\\u2028"),
        ("\udcff", "\\udcff"),
        ("prefill-0 é 日本 \\x1b", "prefill-0 é 日本 \\x1b"),
    ],
)
def test_safe_shows_every_control_character(raw: str, shown: str) -> None:
    assert safe(raw) == shown


def test_tables_escape_headers_and_cells_and_fit_their_content(capsys: pytest.CaptureFixture[str]) -> None:
    text = table(["A", "\x1bB"], [["x\ny", "z"], ["a-name-of-twenty-one", 1]])
    assert text.splitlines() == [
        "A                     \\x1bB",
        "x\\ny                  z",
        "a-name-of-twenty-one  1",
    ]
    stream = StreamTable(["ROOM", "PARTICIPANT", "STATUS"], block=2)
    stream.add([1, "decode-0", "Success(4)"])
    stream.add([2, "p", "Failed(0)"])
    stream.add([3, "decode-with-a-long-name-0", "Failed(0)"])
    stream.close()
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "ROOM  PARTICIPANT  STATUS"
    assert lines[1] == "1     decode-0     Success(4)"
    assert lines[3] == ""  # a wider block: a blank line and the header again, sized to it
    assert lines[4] == "ROOM  PARTICIPANT                STATUS"
    assert lines[5] == "3     decode-with-a-long-name-0  Failed(0)"
