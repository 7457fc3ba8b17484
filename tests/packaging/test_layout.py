"""The "Layout" section of docs/design.md names every module and folder of the package, and nothing that is not there."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DESIGN = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")


def layout_block() -> str:
    section = DESIGN[DESIGN.index("## Layout") :]
    return re.search(r"```text\n(.*?)```", section, re.S).group(1)


def test_every_module_script_and_folder_is_named() -> None:
    block = layout_block()
    package = ROOT / "kvstatus"
    missing = [
        p.relative_to(ROOT).as_posix()
        for p in sorted(package.rglob("*.py"))
        if p.name not in ("__init__.py", "__main__.py") and p.name not in block
    ]
    missing += [
        f"{p.name}/"
        for p in sorted(package.iterdir())
        if p.is_dir() and not p.name.startswith("__") and f"kvstatus/{p.name}/" not in block
    ]
    missing += [p.name for p in sorted((ROOT / "lua").glob("*.lua")) if p.stem not in block]
    missing += [
        f"tests/{p.name}/"
        for p in sorted((ROOT / "tests").iterdir())
        if p.is_dir() and not p.name.startswith("__") and f"{p.name}/" not in block
    ]
    assert not missing, missing


def test_every_path_it_names_exists() -> None:
    paths = re.findall(r"^((?:kvstatus|lua|tests|benchmarks)/[\w./]*)", layout_block(), re.M)
    assert paths and all((ROOT / path).exists() for path in paths), [p for p in paths if not (ROOT / p).exists()]
