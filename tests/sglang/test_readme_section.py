"""README.md's "Using it with SGLang": its Python runs as written, and it names the plugin's real settings."""

from __future__ import annotations

import re
from pathlib import Path

from kvstatus.sglang import plugin

README = Path(__file__).resolve().parents[2] / "README.md"


def section() -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index("## Using it with SGLang")
    return text[start:text.index("\n## ", start + 1)]


def test_python_blocks_run_as_pasted() -> None:
    blocks = re.findall(r"```python\n(.*?)```", section(), re.S)
    assert blocks
    for block in blocks:
        exec(compile(block, str(README), "exec"), {})


def test_every_setting_is_documented_and_exists() -> None:
    text = section()
    settings = {value for name, value in vars(plugin).items() if name.startswith("ENV_")}
    assert settings == set(re.findall(r"`(KVSTATUS_SGLANG_[A-Z_]+)`", text))
