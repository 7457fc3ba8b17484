"""Every name of kvstatus the sources and docs cite exists: ``kvstatus/<path>.py`` is a file, and a dotted
``kvstatus.<module>[.<name>...]`` imports and has its attributes. Modules merge and move (issue 34); a comment in
a Lua script or a sentence of the docs that still names the old home sends the reader nowhere.

Read: the Lua scripts, the hand-written package (``kvstatus/_sync`` is generated from ``_async``), the docs, the
READMEs, the benchmarks and tools. Not read: BENCHMARKS.md and CHANGELOG.md, whose dated entries name what was
there then. Logger names (``kvstatus.nearcache``) are names, not modules, and are read from the code."""

from __future__ import annotations

import functools
import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOTTED = re.compile(r"(?<![\w/.-])kvstatus(?:\.[A-Za-z_]\w*)+")
PATH = re.compile(r"(?<![\w/.-])kvstatus/[\w/]+\.py")
SUFFIXES = (".py", ".lua", ".md")


def sources() -> list[Path]:
    found = [
        *ROOT.glob("lua/**/*.lua"),
        *(path for path in ROOT.glob("kvstatus/**/*.py") if "_sync" not in path.parts),
        *ROOT.glob("docs/*.md"),
        *ROOT.glob("benchmarks/**/*.py"),
        *ROOT.glob("tools/*.py"),
        ROOT / "README.md",
        ROOT / "tests" / "README.md",
    ]
    return sorted(found)


@functools.cache
def loggers() -> frozenset[str]:
    code = "".join(path.read_text(encoding="utf-8") for path in ROOT.glob("kvstatus/**/*.py"))
    return frozenset(re.findall(r'getLogger\("([\w.]+)"\)', code))


def resolves(name: str) -> bool:
    """Whether dotted ``name`` is a kvstatus module, or a module and attributes of it (an optional third-party
    package a module imports that is not installed here counts as resolved: the module exists)."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError as exc:
            if exc.name is not None and exc.name.startswith("kvstatus"):
                continue
            return True
        for attribute in parts[cut:]:
            if not hasattr(found, attribute):
                return False
            found = getattr(found, attribute)
        return True
    return False


def dangling(text: str) -> list[str]:
    """The kvstatus names ``text`` cites that do not exist."""
    bad = [match for match in PATH.findall(text) if not (ROOT / match).is_file()]
    for match in DOTTED.findall(text):
        if match not in loggers() and not match.endswith(SUFFIXES) and not resolves(match):
            bad.append(match)
    return bad


def test_every_cited_kvstatus_name_exists() -> None:
    read = sources()
    assert ROOT / "lua" / "update.lua" in read and ROOT / "docs" / "design.md" in read
    bad = [f"{path.relative_to(ROOT)}: {name}" for path in read for name in dangling(path.read_text(encoding="utf-8"))]
    assert not bad, "names of modules or attributes that do not exist:\n" + "\n".join(sorted(set(bad)))


def test_a_name_that_moved_is_caught() -> None:
    assert dangling("-- (kvstatus.rule.shared_status), kvstatus/replies.py, kvstatus.sglang") == []
    assert dangling("-- (kvstatus.fate.shared_status) and kvstatus/keywatch.py") == [
        "kvstatus/keywatch.py",
        "kvstatus.fate.shared_status",
    ]
    assert dangling("kvstatus.model.NoSuchType; the logger kvstatus.nearcache") == ["kvstatus.model.NoSuchType"]
