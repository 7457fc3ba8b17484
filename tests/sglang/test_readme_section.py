"""The SGLang guide (docs/sglang.md): its Python runs as written, and it names the plugin's real settings."""

from __future__ import annotations

import re
from pathlib import Path

from kvstatus.sglang import plugin

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "sglang.md"


def section() -> str:
    return GUIDE.read_text(encoding="utf-8")


def test_python_blocks_run_as_pasted() -> None:
    blocks = re.findall(r"```python\n(.*?)```", section(), re.S)
    assert blocks
    for block in blocks:
        exec(compile(block, str(GUIDE), "exec"), {})


def test_every_setting_is_documented_and_exists() -> None:
    text = section()
    settings = {value for name, value in vars(plugin).items() if name.startswith("ENV_")}
    assert settings == set(re.findall(r"`(KVSTATUS_SGLANG_[A-Z_]+)`", text))
