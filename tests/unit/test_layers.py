"""The package's layers: the core imports no layer above it, and no module imports one that imports it back.

Layers, bottom up: the core (``kvstatus/*.py``), then ``admin``, ``demo`` and
the optional ``observe`` / ``sglang`` packages, then ``cli`` on top. A module
may import its own layer and the layers below, never one above.
"""

from __future__ import annotations

import ast
from pathlib import Path

import kvstatus

PACKAGE = Path(kvstatus.__file__).resolve().parent
LAYER = {"": 0, "admin": 1, "demo": 1, "observe": 2, "sglang": 2, "cli": 3}
"""Rank of each sub-package ("" is the core); a module imports only equal or lower ranks (demo uses admin's scan)."""
ALLOWED_SIDEWAYS = {("demo", "admin"), ("demo", "sglang"), ("observe", "admin"), ("sglang", "admin")}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def kvstatus_imports(path: Path) -> set[str]:
    """Every kvstatus module ``path`` imports, at any depth of the file (lazy imports included)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("kvstatus"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("kvstatus"):
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    modules = {module_name(p) for p in PACKAGE.rglob("*.py")}
    return {name for name in found if name in modules}


CORE_PACKAGES = ("_async", "_sync")
"""The core's I/O, written once (``_async``) and generated (``_sync``): part of the core layer."""


def package_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in CORE_PACKAGES:
        return ""
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in LAYER) else ""


def test_every_module_belongs_to_a_known_layer() -> None:
    packages = {package_of(module_name(p)) for p in PACKAGE.rglob("*.py")}
    assert packages <= set(LAYER), packages - set(LAYER)
    assert "" in packages and "cli" in packages  # the walk found the core and the CLI


def test_no_module_imports_a_layer_above_its_own() -> None:
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        mine = package_of(module_name(path))
        for imported in kvstatus_imports(path):
            theirs = package_of(imported)
            if theirs == mine or LAYER[theirs] < LAYER[mine] or (mine, theirs) in ALLOWED_SIDEWAYS:
                continue
            upward.append(f"{module_name(path)} -> {imported}")
    assert not upward, upward


def test_the_module_graph_has_no_cycle() -> None:
    graph = {module_name(p): kvstatus_imports(p) - {module_name(p)} for p in PACKAGE.rglob("*.py")}
    # A package's __init__ re-exporting its own modules is not a cycle of jobs; only count module -> module edges.
    edges = {
        m: {t for t in targets if not m.startswith(t + ".") and not t.startswith(m + ".")}
        for m, targets in graph.items()
    }
    state: dict[str, int] = {}
    cycle: list[str] = []

    def visit(node: str, trail: list[str]) -> bool:
        state[node] = 1
        for target in sorted(edges.get(node, ())):
            if state.get(target) == 1:
                cycle.extend(trail[trail.index(target) :] + [node, target] if target in trail else [node, target])
                return True
            if state.get(target) is None and visit(target, trail + [node]):
                return True
        state[node] = 2
        return False

    for start in sorted(edges):
        if state.get(start) is None and visit(start, []):
            break
    assert not cycle, " -> ".join(cycle)
