"""The fault table's Markdown and its paste between markers (no servers: runs in ``./dev test`` too)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e import table


def _row(fault: str, mode: str, **over: object) -> dict[str, object]:
    row: dict[str, object] = {
        "fault": fault,
        "mode": mode,
        "sent": 24,
        "failed": 20,
        "first_error_s": 1.5,
        "last_error_s": 12.25,
        "timed_out": 0,
        "bound_s": 75.0,
        "statuses": [500, 502],
        "causes": ["Decode handshake failed | x", "Bad Gateway"],
        "note": "",
    }
    row.update(over)
    return row


def test_markdown_orders_faults_then_kvstatus_before_upstream_and_says_timeouts() -> None:
    rows = [
        _row(table.KILL_DECODE, "upstream"),
        _row(table.DEAD_PREFILL, "upstream", failed=4, sent=4, timed_out=4, first_error_s=75.0, last_error_s=75.0),
        _row(table.KILL_PREFILL, "kvstatus", first_error_s=3.0, last_error_s=3.0),
    ]
    lines = table.markdown(rows, "now").splitlines()
    body = [line for line in lines if line.startswith(f"| {table.KILL_PREFILL[:10]}") or line.startswith("| SIGKILL")]
    assert [line.split(" | ")[0] for line in body] == [
        f"| {table.KILL_PREFILL}",
        f"| {table.DEAD_PREFILL}",
        f"| {table.KILL_DECODE}",
    ]
    assert "| 3.0 s |" in body[0] and "with kvstatus (defaults)" in body[0]
    assert "> 75 s (timed out at 75)" in body[1] and "4 of 4" in body[1]
    assert "1.5 – 12.25 s" in body[2] and "500, 502" in body[2]
    assert "Decode handshake failed \\| x<br>Bad Gateway" in body[2]


def test_paste_replaces_only_between_the_markers(tmp_path: Path) -> None:
    target = tmp_path / "B.md"
    target.write_text(f"# top\n{table.BEGIN}\nold table\n{table.END}\n## after\n")
    table.paste("| new |\n", target)
    assert target.read_text() == f"# top\n{table.BEGIN}\n| new |\n{table.END}\n## after\n"
    table.paste("| newer |\n", target)
    assert target.read_text().count("| newer |") == 1 and "| new |\n" not in target.read_text()


def test_paste_refuses_a_file_without_markers(tmp_path: Path) -> None:
    target = tmp_path / "B.md"
    target.write_text("# no markers\n")
    with pytest.raises(SystemExit, match="no e2e fault table markers"):
        table.paste("| t |\n", target)
    assert target.read_text() == "# no markers\n"
