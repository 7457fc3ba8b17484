"""The e2e tier's fault table: written by the tier, pasted into BENCHMARKS.md and docs/e2e.md by ``--paste``.

``python -m tests.e2e.table --paste [DIR]`` replaces, in each of :data:`PASTE_INTO`, the part between each
table's :func:`markers` with ``DIR/<name>-table.md`` (default build/e2e, what the last ``./dev test-e2e`` wrote).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

KILL_PREFILL = "SIGKILL the prefill, requests in flight"
DEAD_PREFILL = "SIGKILL the prefill, then send"
RESTART_PREFILL = "SIGKILL the prefill, restart it under the same name at once, requests in flight"
KILL_DECODE = "SIGKILL the decode, requests in flight"
CANCEL = "`kvstatus cancel` of every room in flight, router without retries and circuit breaker"
CANCEL_RETRIED = "`kvstatus cancel` of every room in flight, router at its defaults (5 retries, circuit breaker)"
FAULTS = (KILL_PREFILL, DEAD_PREFILL, RESTART_PREFILL, KILL_DECODE, CANCEL, CANCEL_RETRIED)
MODES = ("kvstatus", "upstream")
TABLES = ("fault", "cluster", "cost")
"""The tier's tables: ``<name>-table.{json,md}`` in :data:`OUT`, each pasted between its own markers."""


def markers(name: str) -> tuple[str, str]:
    """The begin and end markers of table ``name`` (one of :data:`TABLES`)."""
    return f"<!-- e2e-{name}-table:begin -->", f"<!-- e2e-{name}-table:end -->"


ROOT = Path(__file__).resolve().parents[2]
OUT = Path(os.environ.get("KVSTATUS_E2E_OUT", ROOT / "build" / "e2e"))
"""Where the tier writes its tables and its servers' logs."""
PASTE_INTO = (ROOT / "BENCHMARKS.md", ROOT / "docs" / "e2e.md")


def _time(row: dict[str, Any]) -> str:
    first, last, bound = row["first_error_s"], row["last_error_s"], row["bound_s"]
    if row["failed"] == 0:
        return "no error"
    if row["timed_out"] == row["failed"]:
        return f"> {bound:.0f} s (timed out at {bound:.0f})"
    text = f"{first} s" if first == last else f"{first} – {last} s"
    if row["timed_out"]:
        text += f"; {row['timed_out']} > {bound:.0f} s (timed out at {bound:.0f})"
    return text


def markdown(rows: list[dict[str, Any]], when: str, elapsed_s: float | None = None, plugin: str = "defaults") -> str:
    """The table: one line per fault and mode, in :data:`FAULTS` order, kvstatus first; ``plugin``: how the
    plugin-on deployment was configured (:func:`tests.e2e.deploy.plugin_label`)."""
    took = f"; the tier took {elapsed_s / 60:.1f} min" if elapsed_s is not None else ""
    lines = [
        f"Measured {when} by `./dev test-e2e` (both modes in the same run, same machine{took}).",
        "",
        "| fault | sglang | requests failed | time to the client's error (first – last) | HTTP status | cause shown to the client |",
        "|---|---|---|---|---|---|",
    ]
    order = {(f, m): i for i, (f, m) in enumerate((f, m) for f in FAULTS for m in MODES)}
    for row in sorted(rows, key=lambda r: order.get((r["fault"], r["mode"]), len(order))):
        mode = f"with kvstatus ({plugin})" if row["mode"] == "kvstatus" else "upstream (plugin off)"
        statuses = ", ".join(str(s) for s in row["statuses"]) or "—"
        causes = "<br>".join(c.replace("|", "\\|") for c in row["causes"]) or "—"
        lines.append(
            f"| {row['fault']} | {mode} | {row['failed']} of {row['sent']} | {_time(row)} | {statuses} | {causes} |"
        )
    return "\n".join(lines) + "\n"


def _save(directory: Path, name: str, record: dict[str, Any], md: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}-table.json").write_text(json.dumps(record, indent=1) + "\n")
    path = directory / f"{name}-table.md"
    path.write_text(md)
    return path


def _now() -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())


def write(
    directory: Path, rows: list[dict[str, Any]], elapsed_s: float | None = None, plugin: str = "defaults"
) -> Path:
    """Write fault-table.json and fault-table.md into ``directory``; returns the .md path.

    ``elapsed_s``: the tier's wall-clock seconds so far (model, servers, scenarios); ``plugin``: as in
    :func:`markdown`.
    """
    when = _now()
    record = {"measured": when, "elapsed_s": elapsed_s, "plugin": plugin, "rows": rows}
    return _save(directory, "fault", record, markdown(rows, when, elapsed_s, plugin))


def _mode(mode: str) -> str:
    return "with kvstatus (defaults)" if mode == "kvstatus" else "upstream (plugin off)"


def cluster_markdown(
    rows: list[dict[str, Any]],
    disconnects: list[dict[str, Any]],
    when: str,
    elapsed_s: float | None = None,
    decode_tokens: int | None = None,
) -> str:
    """The cluster table (one line per fault and mode, in the order measured, kvstatus first) and the table of
    how long each server worked on after its clients left; ``decode_tokens``: each decode's KV pool."""
    took = f"; the module took {elapsed_s / 60:.1f} min" if elapsed_s is not None else ""
    pool = f" of {decode_tokens:,} tokens" if decode_tokens is not None else ""
    lines = [
        f"Measured {when} by `./dev test-e2e` (2 prefills and 2 decodes{pool} per mode, both modes in the same "
        f"run{took}).",
        "",
        "| fault (2 prefills, 2 decodes, router at its defaults) | sglang | answered 200 | time to answer p50 / p99 "
        "| p99 added (vs no fault) | errors | no answer at the bound | first errors shown |",
        "|---|---|---|---|---|---|---|---|",
    ]
    order = {mode: i for i, mode in enumerate(MODES)}
    faults: list[str] = []
    for row in rows:
        if row["fault"] not in faults:
            faults.append(row["fault"])
    for row in sorted(rows, key=lambda r: (faults.index(r["fault"]), order.get(r["mode"], 9))):
        errors = ", ".join(f"{count} × {status}" for status, count in row["errors"].items()) or "none"
        causes = "<br>".join(c.replace("|", "\\|") for c in row["causes"]) or "—"
        share = 100 * row["ok"] / row["sent"] if row["sent"] else 0
        lines.append(
            f"| {row['fault']} | {_mode(row['mode'])} | {row['ok']} of {row['sent']} ({share:.0f} %) "
            f"| {row['p50_s']} / {row['p99_s']} s | {row['added_p99_s']:+} s | {errors} "
            f"| {row['no_answer']} (at {row['bound_s']:.0f} s) | {causes} |"
        )
    if disconnects:
        lines += [
            "",
            "| clients leave mid-request (8 long requests, connections closed after 1 s) | sglang "
            "| seconds each server went on working for them |",
            "|---|---|---|",
        ]
        for item in sorted(disconnects, key=lambda d: order.get(d["mode"], 9)):
            busy = ", ".join(f"{server}: {seconds} s" for server, seconds in item["busy_s"].items())
            lines.append(f"| router at its defaults | {_mode(item['mode'])} | {busy} |")
    return "\n".join(lines) + "\n"


def write_cluster(
    directory: Path,
    rows: list[dict[str, Any]],
    disconnects: list[dict[str, Any]],
    elapsed_s: float | None = None,
    decode_tokens: int | None = None,
) -> Path:
    """Write cluster-table.json and cluster-table.md into ``directory``; returns the .md path."""
    when = _now()
    record = {
        "measured": when,
        "elapsed_s": elapsed_s,
        "decode_tokens": decode_tokens,
        "rows": rows,
        "disconnects": disconnects,
    }
    return _save(directory, "cluster", record, cluster_markdown(rows, disconnects, when, elapsed_s, decode_tokens))


def _paired(on: list[float], off: list[float]) -> str:
    """The median of the per-round ratios ``on[i] / off[i]``, with the middle half of them."""
    ratios = sorted(a / b for a, b in zip(on, off) if b)
    if not ratios:
        return "—"
    quart = len(ratios) // 4
    return f"{statistics.median(ratios):.3f}× ({ratios[quart]:.2f}–{ratios[-1 - quart]:.2f})"


def cost_markdown(rows: list[dict[str, Any]], when: str) -> str:
    """The plugin's cost: one line per mode (every request), then kvstatus' figures as multiples of upstream's,
    the median of the rounds' paired ratios (the middle half of them in brackets)."""
    by_mode = {row["mode"]: row for row in rows}
    rounds = len(next(iter(by_mode.values()))["round_tokens_per_s"]) if by_mode else 0
    lines = [
        f"Measured {when} by `./dev test-e2e`: a 1+1 pair with the plugin and one without, side by side, the same "
        f"streamed requests sent to each in turn ({rounds} rounds of 8 at once, 200-word prompts, 32 tokens each), "
        "the order flipped every round.",
        "",
        "| sglang | requests | throughput (tokens/s) | TTFT p50 | TTFT p99 |",
        "|---|---|---|---|---|",
    ]
    for mode in MODES:
        if mode in by_mode:
            row = by_mode[mode]
            lines.append(
                f"| {_mode(mode)} | {row['requests']} | {row['tokens_per_s']} | {row['ttft_p50_s']} s "
                f"| {row['ttft_p99_s']} s |"
            )
    if all(mode in by_mode for mode in MODES):
        on, off = by_mode["kvstatus"], by_mode["upstream"]
        lines.append(
            f"| kvstatus ÷ upstream, median of the rounds' ratios | | "
            f"{_paired(on['round_tokens_per_s'], off['round_tokens_per_s'])} "
            f"| {_paired(on['round_ttft_p50_s'], off['round_ttft_p50_s'])} | |"
        )
    return "\n".join(lines) + "\n"


def write_cost(directory: Path, rows: list[dict[str, Any]], elapsed_s: float | None = None) -> Path:
    """Write cost-table.json and cost-table.md into ``directory``; returns the .md path."""
    when = _now()
    return _save(directory, "cost", {"measured": when, "elapsed_s": elapsed_s, "rows": rows}, cost_markdown(rows, when))


def paste(table_md: str, target: Path, name: str = "fault") -> None:
    """Replace the text between table ``name``'s :func:`markers` in ``target`` with ``table_md``."""
    begin, end = markers(name)
    text = target.read_text()
    if begin not in text or end not in text:
        raise SystemExit(f"{target} has no e2e {name} table markers ({begin} ... {end})")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    target.write_text(f"{head}{begin}\n{table_md}{end}{tail}")


if __name__ == "__main__":
    args = sys.argv[1:]
    if not args or args[0] != "--paste" or len(args) > 2:
        raise SystemExit("usage: python -m tests.e2e.table --paste [DIR]   (DIR default: build/e2e)")
    source = Path(args[1]) if len(args) == 2 else OUT
    found = [name for name in TABLES if (source / f"{name}-table.md").exists()]
    if not found:
        raise SystemExit(f"{source} holds no {{fault,cluster,cost}}-table.md: run ./dev test-e2e first")
    for name in found:
        md = source / f"{name}-table.md"
        for target in PASTE_INTO:
            paste(md.read_text(), target, name)
            print(f"pasted {md} into {target}")
