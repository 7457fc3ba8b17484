"""The guides' cost tables, copied from BENCHMARKS.md: one source, so no two pages disagree.

A guide marks a copied table with ``<!-- benchmarks-table: HEADING -->`` and ``<!-- /benchmarks-table -->``;
between them goes the first Markdown table under the BENCHMARKS.md heading whose text is HEADING (its
``### `` line without the hashes, up to its first ``:``, so a heading that states its run's size matches).

    python tools/costtables.py           # copy every marked table again (after ./dev bench or a benchmark)
    python tools/costtables.py --check   # exit 1, naming each table that differs (tests run this)
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "BENCHMARKS.md"
GUIDES = sorted((ROOT / "docs").glob("*.md"))
MARKED = re.compile(
    r"(<!-- benchmarks-table: (?P<heading>[^>]+?) -->\n)(?P<table>.*?)(<!-- /benchmarks-table -->)", re.S
)


def table_under(heading: str, benchmarks: str) -> str:
    """The first table (its ``|`` lines) under the ``###`` heading whose text up to ``:`` is ``heading``."""
    lines = benchmarks.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("#") and line.lstrip("#").strip().split(":")[0].strip() == heading:
            rows: list[str] = []
            for row in lines[i + 1 :]:
                if row.startswith("|"):
                    rows.append(row)
                elif rows or row.startswith("#"):
                    break
            if rows:
                return "\n".join(rows) + "\n"
    raise SystemExit(f"BENCHMARKS.md has no table under a heading {heading!r}")


def refresh(text: str, benchmarks: str) -> str:
    """``text`` with every marked table replaced by its copy from ``benchmarks``."""
    return MARKED.sub(lambda m: m.group(1) + table_under(m.group("heading"), benchmarks) + m.group(4), text)


def main(argv: list[str]) -> int:
    check = argv == ["--check"]
    if argv and not check:
        print("usage: python tools/costtables.py [--check]", file=sys.stderr)
        return 2
    benchmarks = BENCHMARKS.read_text()
    stale = []
    for guide in GUIDES:
        text = guide.read_text()
        fresh = refresh(text, benchmarks)
        if fresh != text:
            stale.append(guide.relative_to(ROOT).as_posix())
            if not check:
                guide.write_text(fresh)
    if check and stale:
        print(f"cost tables differ from BENCHMARKS.md in {', '.join(stale)}: run python tools/costtables.py")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
