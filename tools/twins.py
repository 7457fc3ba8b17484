"""Measure how much hand-written sync/async code is still written twice.

    python tools/twins.py [--max-share 0.05]

For every hand-written module of the core (kvstatus/*.py and kvstatus/_async/; kvstatus/_sync/ is
generated), each
class or function ``AsyncX`` / ``async_x`` that has a twin ``X`` / ``x`` in the same module is compared
with it, ``async``/``await`` stripped and the names mapped: the identical non-blank lines are counted.
Prints each pair and the share of identical lines over all non-blank lines of the core; exits 1 when the share exceeds ``--max-share``.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "kvstatus"
_KEYWORDS = re.compile(r"\b(await|async) ")


def _normal(lines: list[str], names: dict[str, str]) -> list[str]:
    out = []
    for line in lines:
        text = _KEYWORDS.sub("", line).strip()
        for old, new in names.items():
            text = re.sub(rf"\b{re.escape(old)}\b", new, text)
        if text and not text.startswith("#"):
            out.append(text)
    return out


def twin_of(name: str) -> str | None:
    if name.startswith("Async") and len(name) > 5:
        return name[5:]
    if name.startswith("async_"):
        return name[6:]
    return None


def pairs(path: Path) -> list[tuple[str, str, int, int]]:
    """(async name, sync name, identical lines, lines of the async one) for every twin pair in ``path``."""
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()
    tree = ast.parse(source)
    defs = {
        node.name: node for node in tree.body if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
    }
    found = []
    for name, node in defs.items():
        other = twin_of(name)
        if other is None or other not in defs:
            continue
        twin = defs[other]
        names = {name: other}
        a = _normal(lines[node.lineno - 1 : node.end_lineno], names)
        b = _normal(lines[twin.lineno - 1 : twin.end_lineno], names)
        common = sum(1 for line in set(a) if line in set(b))
        found.append((name, other, common, len(a)))
    return found


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-share", type=float, default=None)
    args = parser.parse_args(argv)
    total = identical = 0
    for path in sorted([*PACKAGE.glob("*.py"), *(PACKAGE / "_async").glob("*.py")]):
        total += sum(1 for line in path.read_text(encoding="utf-8").splitlines() if line.strip())
        for name, other, common, size in pairs(path):
            identical += common
            print(f"{path.relative_to(ROOT)}: {name} / {other}: {common} of {size} lines identical")
    share = identical / total if total else 0.0
    print(f"twins: {identical} identical lines of {total} hand-written lines of the core ({share:.1%})")
    return 1 if args.max_share is not None and share > args.max_share else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
