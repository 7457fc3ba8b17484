"""No test is silently dropped: ``./dev test`` and ``./dev test-slow`` together run every test, and CI runs both.

The collection test runs both commands as written in ``dev`` (with ``--collect-only``), so a
change of either ``-m`` expression, or a test that neither selects, fails it. Two collections of
the suite cost ~15 s of CPU, so it is itself in the slow run (CI runs both); the static check of
``dev``'s two command lines runs in the default one.
"""

from __future__ import annotations

import re
import shlex
import subprocess

import pytest

from tests.helpers import ROOT

_SUMMARY = re.compile(r"^(\d+)/(\d+) tests collected \((\d+) deselected\)", re.M)


def _collect(command: str) -> tuple[set[str], int]:
    """The node ids ``./dev COMMAND`` would run, and how many tests the suite has in all."""
    result = subprocess.run(
        ["bash", str(ROOT / "dev"), command, "--collect-only", "-q", "-p", "no:cacheprovider"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = _SUMMARY.search(result.stdout)
    assert summary is not None, result.stdout[-3000:]
    ids = {line for line in result.stdout.splitlines() if "::" in line}
    assert len(ids) == int(summary[1]), f"{command}: {len(ids)} ids listed, {summary[0]}"
    return ids, int(summary[2])


@pytest.mark.slow
def test_the_default_and_the_slow_run_together_hold_every_test_once() -> None:
    default, total = _collect("test")
    slow, total_again = _collect("test-slow")
    assert total == total_again
    assert default and slow  # neither run ends with pytest's "no tests ran" (exit 5)
    assert not default & slow, sorted(default & slow)[:10]
    assert len(default) + len(slow) == total, "a test is in neither run"
    assert any("tests/torture/" in node for node in slow)
    assert not any("tests/torture/" in node for node in default)


def test_ci_runs_both() -> None:
    lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    commands = [line for line in lines if line and not line.startswith("#")]
    assert "set -euo pipefail" in commands, "a failing run must fail CI"
    assert any(re.fullmatch(r"\./dev test( -q)?", line) for line in commands), commands
    assert any(re.fullmatch(r"\./dev test-slow( -q)?", line) for line in commands), commands


def _dev_pytest_args(command: str) -> list[str]:
    """The arguments ``dev`` passes to pytest for ``./dev COMMAND``."""
    match = re.search(
        rf'^\s*{command}\) exec "\$venv/bin/python" -m pytest (.*?) "\$@" ;;$', (ROOT / "dev").read_text(), re.M
    )
    assert match is not None, f"dev has no '{command}' line running pytest"
    return shlex.split(match[1])


def test_the_two_runs_select_complementary_markers_and_nothing_else() -> None:
    default, slow = _dev_pytest_args("test"), _dev_pytest_args("test-slow")
    assert default[default.index("-m") + 1] == f"not {slow[slow.index('-m') + 1]}"
    for args in (default, slow):
        assert args.count("-m") == 1
        assert not {"-k", "--ignore", "--deselect", "-x", "--lf"} & set(args), args
