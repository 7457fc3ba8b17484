"""The guides' cost tables are BENCHMARKS.md's, copied by tools/costtables.py (issue 35 item 3: docs/sglang.md's
poll table said 1.72 s / 67 µs where BENCHMARKS.md said 3.88 s / 152 µs, and left out the default row)."""

from __future__ import annotations

import subprocess
import sys

from tests.helpers import ROOT

sys.path.insert(0, str(ROOT / "tools"))
import costtables  # noqa: E402


def test_every_marked_table_of_the_guides_is_the_one_in_benchmarks() -> None:
    run = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "costtables.py"), "--check"], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stdout + run.stderr


def test_the_sglang_guide_copies_the_poll_tables_with_the_default_row() -> None:
    guide = (ROOT / "docs" / "sglang.md").read_text()
    assert guide.count("<!-- benchmarks-table: ") == 2
    assert "| kvstatus, the SGLang plugin's defaults (10 s lease, shared fate, near cache) |" in guide


def test_a_table_that_differs_is_found_and_copied_again() -> None:
    benchmarks = "## x\n\n### Poll: 2 rooms\n\nprose\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n### Next\n"
    stale = "before\n<!-- benchmarks-table: Poll -->\n| a | b |\n| 9 | 9 |\n<!-- /benchmarks-table -->\nafter\n"
    fresh = costtables.refresh(stale, benchmarks)
    assert (
        fresh
        == "before\n<!-- benchmarks-table: Poll -->\n| a | b |\n|---|---|\n| 1 | 2 |\n<!-- /benchmarks-table -->\nafter\n"
    )
    assert costtables.refresh(fresh, benchmarks) == fresh
