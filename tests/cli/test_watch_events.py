"""``kvstatus watch --json``: one event per entry that changed, the schema of docs/cli.md, ``--hash-rooms``
(issue 20, item 4), against a real Redis; the cluster moves on while watch sleeps between its two refreshes."""

from __future__ import annotations

import functools
import hashlib
import json
import re
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from click.testing import Result

import kvstatus.cli.namespace as namespace_commands
from kvstatus import KVPoll, StatusStore
from kvstatus.admin.reads import server_ms
from kvstatus.admin.watch import EntryEvent, room_hash, watch_changes
from kvstatus.connection import connect
from tests.helpers.backends import fresh_namespace
from tests.helpers.cli import assert_clean_failure, invoke, json_lines, run_cli
from tests.servers import RedisServer

pytestmark = pytest.mark.real

FIELDS = ["event", "room", "participant", "status", "previous_status", "at_ms", "reached_at_ms", "reason", "failure"]
CLI_GUIDE = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


@pytest.fixture
def namespace() -> str:
    return fresh_namespace("watch")


@pytest.fixture
def stores(real_server: RedisServer, namespace: str) -> Iterator[Callable[..., StatusStore]]:
    client = real_server.client()

    def store(participant: str, timeline: bool = True) -> StatusStore:
        return StatusStore(client, namespace=namespace, participant=participant, timeline=timeline)

    yield store
    client.close()


def _watch(
    monkeypatch: pytest.MonkeyPatch,
    server: RedisServer,
    namespace: str,
    meanwhile: Callable[[], None],
    *args: str,
) -> Result:
    """``kvstatus watch --count 2 ARGS``, ``meanwhile`` running while it sleeps between the two refreshes."""
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        meanwhile()

    monkeypatch.setattr(namespace_commands, "watch_changes", functools.partial(watch_changes, sleep=sleep))
    done = invoke(connect, "--namespace", namespace, "watch", "--count", "2", *args, env={"KVSTATUS_URL": server.url})
    assert slept == [2.0], done.output
    return done


def _before(store: Callable[..., StatusStore]) -> Callable[[], None]:
    """Rooms 1 (prefill-0 Bootstrapping, decode-0 waiting), 2 (prefill-1 transferring, no timeline) and 8 (decode-3
    waiting); returns what happens meanwhile: room 1 advances and loses decode-0, room 2 fails, room 3 is new, 8
    is cleared."""
    store("prefill-0").update_status(1, KVPoll.Bootstrapping)
    store("decode-0").update_status(1, KVPoll.WaitingForInput)
    store("prefill-1", timeline=False).update_status(2, KVPoll.Transferring)
    store("decode-3").update_status(8, KVPoll.WaitingForInput)

    def meanwhile() -> None:
        store("prefill-0").update_status(1, KVPoll.Transferring)
        store("decode-0").clear(1)
        failing = store("prefill-1", timeline=False)
        failing.update_status(2, KVPoll.Failed)
        failing.record_failure(2, "NIXL transfer timed out")
        store("decode-2").update_status(3, KVPoll.WaitingForInput)
        store("decode-3").clear(8)

    return meanwhile


def test_each_entry_that_changed_is_one_event_with_the_documented_fields(
    monkeypatch: pytest.MonkeyPatch, real_server: RedisServer, namespace: str, stores: Callable[..., StatusStore]
) -> None:
    start = server_ms(real_server.client())
    done = _watch(monkeypatch, real_server, namespace, _before(stores), "--json")
    assert done.exit_code == 0, done.output
    lines = json_lines(done.output)
    snapshots = [line for line in lines if line["event"] == "snapshot"]
    events = [line for line in lines if line["event"] != "snapshot"]
    assert len(snapshots) == 2 and lines[0] is snapshots[0] and lines[1] is snapshots[1]  # no event after the first
    assert snapshots[1]["rooms"] == 3 and snapshots[1]["by_status"]["Failed"] == 1
    assert all(isinstance(s["at_ms"], int) and s["at_ms"] >= start for s in snapshots)
    assert all(list(event) == FIELDS for event in events)
    assert all(event["at_ms"] == snapshots[1]["at_ms"] for event in events)
    shown = [(e["event"], e["room"], e["participant"], e["status"], e["previous_status"]) for e in events]
    assert shown == [
        ("cleared", 1, "decode-0", None, "WaitingForInput"),
        ("status", 1, "prefill-0", "Transferring", "Bootstrapping"),
        ("status", 2, "prefill-1", "Failed", "Transferring"),
        ("status", 3, "decode-2", "WaitingForInput", None),
        ("cleared", 8, "decode-3", None, "WaitingForInput"),
    ]
    assert all(type(event["room"]) is int for event in events)  # a JSON integer, as in ls / get / cancel --json
    cleared, advanced, failed, new, gone = events
    assert snapshots[0]["at_ms"] <= advanced["reached_at_ms"] <= advanced["at_ms"]  # from the timeline: exact
    assert snapshots[0]["at_ms"] <= new["reached_at_ms"] <= new["at_ms"]
    assert failed["reached_at_ms"] is None  # its writer records no timeline
    assert cleared["reached_at_ms"] is None and gone["reached_at_ms"] is None
    assert failed["reason"] == "NIXL transfer timed out"
    assert failed["failure"]["stage"] == "transfer" and failed["failure"]["origin"] == "prefill-1"
    assert failed["failure"]["reason"] == "NIXL transfer timed out"
    assert all(e["reason"] is None and e["failure"] is None for e in (cleared, advanced, new, gone))


def test_hash_rooms_shows_a_stable_hash_in_json_and_text(
    monkeypatch: pytest.MonkeyPatch, real_server: RedisServer, namespace: str, stores: Callable[..., StatusStore]
) -> None:
    stores("prefill-0").update_status(123456789, KVPoll.Bootstrapping)
    advance = lambda: stores("prefill-0").update_status(123456789, KVPoll.Transferring)  # noqa: E731
    events = json_lines(_watch(monkeypatch, real_server, namespace, advance, "--json", "--hash-rooms").output)
    expected = hashlib.sha256(b"123456789").hexdigest()[:16]
    assert room_hash(123456789) == expected and re.fullmatch(r"[0-9a-f]{16}", expected)
    assert [e["room"] for e in events if e["event"] != "snapshot"] == [expected]
    again = lambda: stores("prefill-0").update_status(123456789, KVPoll.Success)  # noqa: E731
    text = _watch(monkeypatch, real_server, namespace, again, "--hash-rooms").output
    assert f"  advanced  room {expected}  prefill-0=Success" in text and "123456789" not in text


def test_the_text_view_is_unchanged(
    monkeypatch: pytest.MonkeyPatch, real_server: RedisServer, namespace: str, stores: Callable[..., StatusStore]
) -> None:
    done = _watch(monkeypatch, real_server, namespace, _before(stores))
    assert done.exit_code == 0
    assert "since last refresh: new 1  advanced 0  failed 1  cleared 2" in done.output  # room 1 lost an entry
    assert "  failed    room 2  prefill-1=Failed" in done.output
    assert "  cleared   room 8  -" in done.output
    assert "{" not in done.output


def test_the_guide_documents_every_field() -> None:
    guide = CLI_GUIDE.read_text(encoding="utf-8")
    section = guide[guide.index("## `kvstatus watch --json` events") :]
    section = section[: section.index("\n## ")]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    assert [row.split("`")[1] for row in rows] == FIELDS
    example = [json.loads(line) for line in section.split("```text\n")[1].split("```")[0].splitlines()]
    assert all(list(line) == FIELDS for line in example if line["event"] != "snapshot")
    assert list(EntryEvent(1, "p", "Success", None, 5).to_json()) == FIELDS


def test_watch_help_and_bad_options_as_an_operator_types_them(real_server: RedisServer, namespace: str) -> None:
    env: dict[str, Any] = {"KVSTATUS_URL": real_server.url, "KVSTATUS_NAMESPACE": namespace}
    helped = run_cli("watch", "--help", env=env)
    assert helped.returncode == 0
    shown = " ".join(helped.stdout.split())
    assert "--hash-rooms" in shown and "SHA-256" in shown and "previous_status" in shown
    once = run_cli("watch", "--count", "1", "--json", "--hash-rooms", env=env)
    assert once.returncode == 0, once.stderr
    assert [line["event"] for line in json_lines(once.stdout)] == ["snapshot"]
    bad = run_cli("watch", "--hash-rooms=yes", env=env)
    assert_clean_failure(bad.stderr, bad.returncode, 2, "--hash-rooms")
