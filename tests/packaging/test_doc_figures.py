"""A figure the docs give beside a constant's name is that constant's value: "after 30 s (`ORPHAN_SECONDS`)" fails
here the day ORPHAN_SECONDS changes and the page does not. Read from the source with ``ast`` (nothing is imported)."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
NAMED = re.compile(r"\(`(?:[\w.]+\.)?([A-Z][A-Z0-9_]+)`")
FIGURE = re.compile(r"\d[\d,]*(?:\.\d+)?")
REACH = 40
"""How many characters before a constant's name a figure may stand ("at most 64 such rooms (`MAX_ORPHANS_A_LOOK`)")."""


@functools.cache
def constants() -> dict[str, set[float]]:
    """Every module-level UPPER_CASE name of kvstatus/ bound to a number, with the values it is given."""
    found: dict[str, set[float]] = {}
    for path in (ROOT / "kvstatus").rglob("*.py"):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            targets = (
                node.targets
                if isinstance(node, ast.Assign)
                else [node.target]
                if isinstance(node, ast.AnnAssign)
                else []
            )
            value = getattr(node, "value", None)
            number = value.value if isinstance(value, ast.Constant) else None
            if not isinstance(number, (int, float)) or isinstance(number, bool):
                continue
            for target in targets:
                if isinstance(target, ast.Name) and target.id.isupper():
                    found.setdefault(target.id, set()).add(float(number))
    return found


def mismatches(text: str, where: str) -> list[str]:
    """The figures of ``text`` that stand before a constant's name and differ from its value."""
    bad = []
    for named in NAMED.finditer(text):
        values = constants().get(named.group(1))
        figures = FIGURE.findall(text[max(0, named.start() - REACH) : named.start()])
        if values and figures and float(figures[-1].replace(",", "")) not in values:
            bad.append(f"{where}: {figures[-1]} before {named.group(1)} = {', '.join(map(str, sorted(values)))}")
    return bad


def test_the_docs_give_each_constant_its_value() -> None:
    checked = [page for page in PAGES if NAMED.search(page.read_text(encoding="utf-8"))]
    assert ROOT / "docs" / "design.md" in checked  # the peer watch's figures are there
    bad = [line for page in checked for line in mismatches(page.read_text(encoding="utf-8"), page.name)]
    assert not bad, "\n".join(bad)


def test_a_stale_figure_is_caught() -> None:
    assert mismatches("fails after 30 s (`ORPHAN_SECONDS`)", "page") == []
    assert mismatches("fails after 45 s (`ORPHAN_SECONDS`)", "page") == ["page: 45 before ORPHAN_SECONDS = 30.0"]
    assert mismatches("at most 1,024 rooms (`kvstatus.sglang.manager.MAX_NOTED_ROOMS`)", "page") == []
    assert mismatches("every second (`WATCH_SECONDS`)", "page") == []  # no figure: nothing to hold
