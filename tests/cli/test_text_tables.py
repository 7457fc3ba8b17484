"""Issue 35 item 2: text tables size their columns to their content (``ls`` went out of line for participant
names of 17 or more characters), and counts are said in the right number."""

from __future__ import annotations

from kvstatus import KVPoll, StatusStore
from tests.helpers.cli import cli

LONG = "decode-cluster-b-node-17-tp3-pp0"  # 32 characters


def _aligned(line: str, header: str, names: list[str]) -> None:
    """Each cell of ``line`` starts where its column's name starts in ``header``, after two spaces."""
    for name in names[1:]:
        start = header.index(name)
        assert line[start - 2 : start] == "  " and line[start] != " ", (line, header)


def test_ls_columns_fit_long_participant_names(connect, store: StatusStore) -> None:
    store.for_participant(LONG).update_status(2**63 - 2, KVPoll.WaitingForInput)
    store.for_participant("p-0").update_status(7, KVPoll.Transferring)
    store.for_participant("prefill-0").update_status(7, KVPoll.Transferring)
    store.for_participant("prefill-0").update_status(7, KVPoll.Failed)
    store.for_participant("prefill-0").record_failure(7, "NIXL transfer timed out")
    lines = cli(connect, "ls").stdout.splitlines()
    header = lines[0]
    assert header.split() == ["ROOM", "PARTICIPANT", "STATUS", "TTL", "LEFT", "REASON"]
    for line in lines[1:]:
        _aligned(line, header, ["ROOM", "PARTICIPANT", "STATUS", "TTL LEFT", "REASON"])
    assert any(LONG in line for line in lines) and any(line.endswith("NIXL transfer timed out") for line in lines)


def test_counts_are_said_in_the_right_number(connect, store: StatusStore) -> None:
    store.for_participant("prefill-0").update_status(1, KVPoll.Bootstrapping)
    stats = cli(connect, "stats").stdout
    assert "namespace prod-a: 1 room holding 1 entry (one per participant)" in stats
    store.for_participant("decode-0").update_status(1, KVPoll.WaitingForInput)
    assert "1 room holding 2 entries" in cli(connect, "stats").stdout
    health = cli(connect, "health").stdout
    assert "1 pair, " in health and "1 pairs" not in health
    cancelled = cli(connect, "cancel", "1", "--reason", "drain").stdout
    assert cancelled == "room 1: cancelled, 2 open entries failed\n"
