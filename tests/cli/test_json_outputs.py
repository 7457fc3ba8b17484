"""Issue 35 item 2: every ``--json`` output is documented in docs/cli.md ("JSON output") field by field, and
this runs each command against a real Redis, parses its output and holds it to the table: every field it
prints is documented, every field not marked optional is there, and room ids are JSON integers."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Iterator

import pytest

from kvstatus import KVPoll, StatusStore, connection
from tests.helpers.backends import fresh_namespace
from tests.helpers.cli import invoke, json_lines
from tests.servers import RedisServer

pytestmark = pytest.mark.real

GUIDE = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text(encoding="utf-8")
SECTION = GUIDE[GUIDE.index("## JSON output\n") :]
SECTION = SECTION[: SECTION.index("\n## ", 4)]

COMMANDS: dict[str, list[tuple[str, ...]]] = {
    "get --json": [("get", "1", "2")],
    "ls --json": [("ls",)],
    "ls --stuck --json": [("ls", "--stuck", "--older-than", "1ms")],
    "set --json": [("set", "3", "bootstrapping")],
    "clear --json": [("clear", "3")],
    "cancel --json": [("cancel", "2", "4", "--reason", "drain")],
    "stats --json": [("stats",)],
    "health --json": [("health",)],
    "participants --json": [("participants",)],
    "sweep --json": [("sweep",)],
    "watch --json": [("watch", "--count", "1")],
    "explain --json": [("explain", "missing", "failed")],
    "doctor --json": [("doctor",)],
    "acl --json": [("acl",)],
    "functions load --json` and `functions list --json": [("functions", "load"), ("functions", "list")],
}


def documented() -> dict[str, tuple[set[str], set[str]]]:
    """Heading -> (every field, the fields not marked optional)."""
    tables: dict[str, tuple[set[str], set[str]]] = {}
    for part in SECTION.split("\n### `")[1:]:
        heading = part.split("\n", 1)[0].split("` (")[0].rstrip("`")
        rows = [line.split("|") for line in part.splitlines() if line.startswith("| `")]
        every = {row[1].strip().strip("`") for row in rows}
        required = {row[1].strip().strip("`") for row in rows if "optional" not in row[2]}
        tables[heading] = (every, required)
    return tables


def flat(document: dict[str, Any]) -> set[str]:
    """Top-level keys, and ``key[].sub`` for the objects of a top-level array."""
    keys = set(document)
    for key, value in document.items():
        if isinstance(value, list):
            keys.update(f"{key}[].{sub}" for item in value if isinstance(item, dict) for sub in item)
    return keys


@pytest.fixture(scope="module")
def deployment() -> Iterator[dict[str, str]]:
    with RedisServer() as server:
        namespace = fresh_namespace("json")
        with (
            StatusStore.from_url(server.url, namespace=namespace, participant="prefill-0", timeline=True) as prefill,
            StatusStore.from_url(
                server.url, namespace=namespace, participant="decode-0", timeline=True, lease_ttl=3
            ) as decode,
        ):
            prefill.update_status(1, KVPoll.Transferring)
            decode.update_status(1, KVPoll.WaitingForInput)
            prefill.update_status(2, KVPoll.Transferring)
            prefill.update_status(2, KVPoll.Failed)  # room 2 failed: its first failure recorded
            decode.update_status(5, KVPoll.Bootstrapping)
            prefill.clear(1)  # room 1's tombstone
            prefill.update_status(1, KVPoll.Bootstrapping)
        # decode-0's store is closed: its lease released (lost), room 5 open for the sweep
        yield {"url": server.url, "namespace": namespace}


def _holds(args: tuple[str, ...], shown: set[str], table: tuple[set[str], set[str]]) -> None:
    every, required = table
    assert shown <= every, (args, "not documented", shown - every)
    assert required <= shown, (args, "documented, not printed", required - shown)


def test_every_json_command_is_documented_and_its_fields_match(deployment: dict[str, str]) -> None:
    tables = documented()
    assert set(tables) == set(COMMANDS), set(tables) ^ set(COMMANDS)
    for heading, runs in COMMANDS.items():
        for args in runs:
            done = invoke(
                connection.connect, "--url", deployment["url"], "--namespace", deployment["namespace"], *args, "--json"
            )
            assert done.exit_code in (0, 4, 5), (args, done.output)  # 4, 5: stats, health found something
            lines = json_lines(done.stdout)
            assert lines, args
            if heading == "get --json":  # the document, and each of its rooms as an ls --json line
                _holds(args, set(lines[0]), tables[heading])
                for room in lines[0]["rooms"]:
                    _holds(args, set(room), tables["ls --json"])
                continue
            for line in lines:
                if line.get("event") not in (None, "snapshot"):
                    continue  # watch's entry events: their own section, held by tests/cli/test_watch_events.py
                _holds(args, flat(line), tables[heading])


def test_room_ids_are_json_integers_everywhere(deployment: dict[str, str]) -> None:
    url, namespace = deployment["url"], deployment["namespace"]

    def run(*args: str) -> list[Any]:
        return json_lines(invoke(connection.connect, "--url", url, "--namespace", namespace, *args).stdout)

    rooms: list[Any] = []
    rooms += [room["room"] for room in run("get", "1", "2", "--json")[0]["rooms"]]
    rooms += [line["room"] for line in run("ls", "--json")]
    rooms += [line["room"] for line in run("ls", "--stuck", "--older-than", "1ms", "--json")]
    rooms += [room["room"] for room in run("cancel", "2", "--reason", "again", "--json")[0]["rooms"]]
    rooms += [room["room"] for room in run("clear", "9", "--json")[0]["rooms"]]
    rooms += [run("set", "9", "bootstrapping", "--json")[0]["room"]]
    stats = run("stats", "--json")[0]
    rooms += [room["room"] for room in stats["oldest_non_terminal"]]
    assert len(rooms) >= 8 and all(type(room) is int for room in rooms), rooms
    assert re.search(r'"room": \d', json.dumps(run("ls", "--json")[0]))
