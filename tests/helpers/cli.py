"""Running the CLI in tests: through CliRunner with an injected client, or as a real subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any, Callable, Optional

from click.testing import CliRunner, Result

from kvstatus.cli import CliEnv, main
from kvstatus.url import DEFAULT_URL

NS = "prod-a"
"""The namespace of the CLI tests' fakeredis rooms (tests/cli/conftest.py)."""


def invoke(connect: Callable[[str], Any], *args: str, env: Optional[dict[str, str]] = None) -> Result:
    """Run ``kvstatus ARGS`` in-process; ``connect`` builds the Redis client (the CLI's seam)."""
    # An explicit URL (the injected client ignores it) keeps the "no URL given" notice out of the output.
    environment = {"KVSTATUS_URL": DEFAULT_URL, "KVSTATUS_NAMESPACE": None, **(env or {})}
    return CliRunner().invoke(
        main, list(args), obj=CliEnv(connect=connect), env=environment, catch_exceptions=False, prog_name="kvstatus"
    )


def cli(connect: Callable[[str], Any], *args: str, env: Optional[dict[str, str]] = None) -> Result:
    """:func:`invoke` in namespace :data:`NS`."""
    return invoke(connect, "--namespace", NS, *args, env=env)


def run_cli(*args: str, env: Optional[dict[str, str]] = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``python -m kvstatus.cli ARGS`` in a subprocess, as an operator would."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("KVSTATUS_")}
    environment.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "kvstatus.cli", *args], capture_output=True, text=True, env=environment, timeout=timeout
    )


def json_lines(text: str) -> list[Any]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def assert_clean_failure(
    output: str, code: int, expected_code: int, *needles: str, secrets: tuple[str, ...] = ()
) -> None:
    assert code == expected_code, output
    assert "Traceback" not in output, output
    for needle in needles:
        assert needle in output, (needle, output)
    for secret in secrets:
        assert secret not in output, output
