"""Under ``KVSTATUS_REQUIRE_E2E=1`` (what ``./dev test-e2e`` and so CI set) a missing piece fails the tier,
naming it; it is never a silent skip. Runs outside the e2e venv, where those pieces are missing."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

from tests.e2e.conftest import NEEDED
from tests.helpers import ROOT


@pytest.mark.skipif(
    all(importlib.util.find_spec(m) for m in NEEDED),
    reason="this interpreter has the e2e packages: the tier itself runs here instead",
)
def test_the_tier_fails_naming_what_is_missing_when_required() -> None:
    env = {**os.environ, "KVSTATUS_REQUIRE_E2E": "1"}
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-q",
            "tests/e2e/test_e2e.py",
            "-k",
            "serve_with_the_plugin_on",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 1, run.stdout + run.stderr
    assert "1 error" in run.stdout and "skipped" not in run.stdout, run.stdout
    missing = [m for m in NEEDED if importlib.util.find_spec(m) is None]
    assert f"the e2e tier needs {missing[0]} (" in run.stdout, run.stdout
    assert "run ./dev test-e2e" in run.stdout
