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
    begin, end = table.markers("fault")
    target.write_text(f"# top\n{begin}\nold table\n{end}\n## after\n")
    table.paste("| new |\n", target)
    assert target.read_text() == f"# top\n{begin}\n| new |\n{end}\n## after\n"
    table.paste("| newer |\n", target)
    assert target.read_text().count("| newer |") == 1 and "| new |\n" not in target.read_text()


def test_paste_refuses_a_file_without_markers(tmp_path: Path) -> None:
    target = tmp_path / "B.md"
    target.write_text("# no markers\n")
    with pytest.raises(SystemExit, match="no e2e fault table markers"):
        table.paste("| t |\n", target)
    assert target.read_text() == "# no markers\n"


def _cluster_row(fault: str, mode: str, **over: object) -> dict[str, object]:
    row: dict[str, object] = {
        "fault": fault,
        "mode": mode,
        "sent": 32,
        "ok": 31,
        "p50_s": 2.5,
        "p99_s": 7.25,
        "added_p99_s": 0.5,
        "errors": {"502": 1},
        "no_answer": 0,
        "bound_s": 30.0,
        "causes": ["Bad | Gateway"],
        "note": "",
    }
    row.update(over)
    return row


def test_the_cluster_table_keeps_the_fault_order_and_puts_kvstatus_first() -> None:
    rows = [
        _cluster_row("kill a prefill", "upstream", ok=20, errors={"no answer": 12}, no_answer=12, added_p99_s=22.75),
        _cluster_row("kill a prefill", "kvstatus"),
        _cluster_row("pause a prefill", "kvstatus", ok=32, errors={}, causes=[], added_p99_s=-0.25),
    ]
    text = table.cluster_markdown(rows, [{"mode": "upstream", "busy_s": {"prefill-1": 11.3}}], "now", 600, 16384)
    body = [line for line in text.splitlines() if line.startswith("| kill") or line.startswith("| pause")]
    assert [(line.split(" | ")[0], line.split(" | ")[1]) for line in body] == [
        ("| kill a prefill", "with kvstatus (defaults)"),
        ("| kill a prefill", "upstream (plugin off)"),
        ("| pause a prefill", "with kvstatus (defaults)"),
    ]
    assert "| 31 of 32 (97 %) | 2.5 / 7.25 s | +0.5 s | 1 × 502 | 0 (at 30 s) | Bad \\| Gateway |" in body[0]
    assert "| 20 of 32 (62 %)" in body[1] and "12 × no answer | 12 (at 30 s)" in body[1] and "+22.75 s" in body[1]
    assert "| -0.25 s | none |" in body[2]
    assert "| router at its defaults | upstream (plugin off) | prefill-1: 11.3 s |" in text
    assert "the module took 10.0 min" in text and "2 decodes of 16,384 tokens per mode" in text


def test_the_cost_table_gives_kvstatus_as_the_median_of_paired_round_ratios() -> None:
    def row(mode: str, throughputs: list[float], ttfts: list[float]) -> dict[str, object]:
        return {
            "mode": mode,
            "requests": 32,
            "tokens_per_s": 200.0,
            "ttft_p50_s": 0.5,
            "ttft_p99_s": 1.1,
            "round_tokens_per_s": throughputs,
            "round_ttft_p50_s": ttfts,
        }

    rows = [
        row("upstream", [100.0, 200.0, 100.0, 50.0], [1.0, 0.5, 1.0, 2.0]),
        row("kvstatus", [99.0, 196.0, 102.0, 40.0], [1.02, 0.5, 1.0, 3.0]),
    ]
    lines = table.cost_markdown(rows, "now").splitlines()
    assert "(4 rounds of 8 at once" in lines[0]
    assert lines[-3].startswith("| with kvstatus (defaults) | 32 | 200.0 | 0.5 s | 1.1 s |")
    # ratios 0.99, 0.98, 1.02, 0.80: median 0.985, middle half 0.98–0.99; TTFT 1.02, 1.0, 1.0, 1.5
    assert (
        lines[-1]
        == "| kvstatus ÷ upstream, median of the rounds' ratios | | 0.985× (0.98–0.99) | 1.010× (1.00–1.02) | |"
    )


def test_paste_puts_each_table_between_its_own_markers(tmp_path: Path) -> None:
    target = tmp_path / "B.md"
    parts = [f"{a}\nold\n{b}\n" for a, b in (table.markers(name) for name in table.TABLES)]
    target.write_text("".join(parts))
    table.paste("| cluster |\n", target, "cluster")
    text = target.read_text()
    assert text.count("old") == 2 and "| cluster |" in text.split(table.markers("cluster")[0])[1].split("<!--")[0]
