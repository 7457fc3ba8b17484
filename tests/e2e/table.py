"""The e2e tier's fault table: written by the tier, pasted into BENCHMARKS.md and docs/e2e.md by ``--paste``.

``python -m tests.e2e.table --paste [DIR]`` replaces the part of each of :data:`PASTE_INTO` between
:data:`BEGIN` and :data:`END` with ``DIR/fault-table.md`` (default build/e2e, what the last
``./dev test-e2e`` wrote).
"""

from __future__ import annotations

import json
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
BEGIN = "<!-- e2e-fault-table:begin -->"
END = "<!-- e2e-fault-table:end -->"
ROOT = Path(__file__).resolve().parents[2]
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


def write(
    directory: Path, rows: list[dict[str, Any]], elapsed_s: float | None = None, plugin: str = "defaults"
) -> Path:
    """Write fault-table.json and fault-table.md into ``directory``; returns the .md path.

    ``elapsed_s``: the tier's wall-clock seconds so far (model, servers, scenarios); ``plugin``: as in
    :func:`markdown`.
    """
    directory.mkdir(parents=True, exist_ok=True)
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    record = {"measured": when, "elapsed_s": elapsed_s, "plugin": plugin, "rows": rows}
    (directory / "fault-table.json").write_text(json.dumps(record, indent=1) + "\n")
    path = directory / "fault-table.md"
    path.write_text(markdown(rows, when, elapsed_s, plugin))
    return path


def paste(table_md: str, benchmarks: Path) -> None:
    """Replace the text between :data:`BEGIN` and :data:`END` in ``benchmarks`` with ``table_md``."""
    text = benchmarks.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{benchmarks} has no e2e fault table markers ({BEGIN} ... {END})")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    benchmarks.write_text(f"{head}{BEGIN}\n{table_md}{END}{tail}")


if __name__ == "__main__":
    args = sys.argv[1:]
    if not args or args[0] != "--paste" or len(args) > 2:
        raise SystemExit("usage: python -m tests.e2e.table --paste [DIR]   (DIR default: build/e2e)")
    source = Path(args[1]) if len(args) == 2 else ROOT / "build" / "e2e"
    md = source / "fault-table.md"
    if not md.exists():
        raise SystemExit(f"{md} does not exist: run ./dev test-e2e first")
    for target in PASTE_INTO:
        paste(md.read_text(), target)
        print(f"pasted {md} into {target}")
