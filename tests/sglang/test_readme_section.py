"""docs/sglang-readme-section.md: its Python runs as written, and it names the plugin's real settings."""

from __future__ import annotations

import re
from pathlib import Path

from kvstatus.sglang import plugin

SECTION = Path(__file__).resolve().parents[2] / "docs" / "sglang-readme-section.md"


def test_python_blocks_run_as_pasted() -> None:
    blocks = re.findall(r"```python\n(.*?)```", SECTION.read_text(encoding="utf-8"), re.S)
    assert blocks
    for block in blocks:
        exec(compile(block, str(SECTION), "exec"), {})


def test_every_setting_is_documented_and_exists() -> None:
    text = SECTION.read_text(encoding="utf-8")
    settings = {value for name, value in vars(plugin).items() if name.startswith("ENV_")}
    assert settings == set(re.findall(r"`(KVSTATUS_SGLANG_[A-Z_]+)`", text))
