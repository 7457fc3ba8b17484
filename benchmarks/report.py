"""The machine description and the Markdown that ``BENCHMARKS.md`` holds between its results markers."""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

from benchmarks.cases import Results

BEGIN = "<!-- results: begin (written by ./dev bench; edits here are overwritten) -->"
END = "<!-- results: end -->"


def machine() -> dict[str, str]:
    """CPU model, cores, load, Python, redis-py, hiredis and redis-server versions."""
    import redis

    try:
        import hiredis

        hiredis_version = hiredis.__version__
    except ImportError:
        hiredis_version = "not installed (pure-Python parser)"
    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    server = subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout
    match = re.search(r"v=(\S+)", server)
    return {
        "CPU": cpu,
        "cores": str(os.cpu_count()),
        "load average at start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "OS": f"{platform.system()} {platform.release()}",
        "Python": sys.version.split()[0],
        "redis-py": redis.__version__,
        "hiredis": hiredis_version,
        "redis-server": match.group(1) if match else server.strip(),
    }


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table of ``rows`` (cells already formatted) under ``header``; the scripts that print theirs."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def render(results: Results, host: dict[str, str], command: str, seconds: float) -> str:
    lines = [
        f"Run {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC in {seconds:.0f} s, reproduced by:",
        "",
        "```sh",
        command,
        "```",
        "",
        "Machine: " + "; ".join(f"{k} {v}" for k, v in host.items()) + ".",
        "",
        "### Budgets",
        "",
        "| budget | measured | limit | result | detail |",
        "|---|---|---|---|---|",
    ]
    for b in results.budgets:
        measured = f"{b.measured:.0f} {b.unit}" if b.unit == "bytes" else f"{b.measured:.2f}{b.unit}"
        limit = f"{b.op} {b.limit:g}{'' if b.unit == '×' else ' '}{b.unit}"
        lines.append(f"| {b.name} | {measured} | {limit} | {'PASS' if b.met else '**MISS**'} | {b.detail} |")
    section = None
    for row in results.rows:
        if row.section != section:
            section = row.section
            lines += ["", f"### {section}", "", "| variant | value | p99 | note |", "|---|---|---|---|"]
        p99 = f"{row.p99:,.1f} µs" if row.p99 is not None else ""
        lines.append(f"| {row.variant} | {row.value:,.1f} {row.unit} | {p99} | {row.note} |")
    if results.notes:
        lines += ["", "Notes:", ""] + [f"- {note}" for note in results.notes]
    return "\n".join(lines) + "\n"


def write(path: Path, body: str) -> None:
    """Replace the text between the results markers of ``path`` (appending them when absent)."""
    text = path.read_text(encoding="utf-8") if path.exists() else "# Benchmarks\n"
    block = f"{BEGIN}\n{body}{END}"
    if BEGIN in text and END in text:
        start, end = text.index(BEGIN), text.index(END) + len(END)
        text = text[:start] + block + text[end:]
    else:
        text = text.rstrip("\n") + "\n\n## Results\n\n" + block + "\n"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
