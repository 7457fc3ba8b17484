"""Every fenced code block of README.md runs as pasted (issue 9, items 11 and 12).

- ``python`` blocks run in a subprocess, ``sh`` blocks through bash, ``redis`` blocks line by line as Redis
  commands, and ``console`` blocks command by command (``$ ...``), their output compared with the block's,
  numbers aside (TTLs, ports and versions differ from run to run), and their exit codes with ``# exit code N``.
- All against a throwaway redis-server, with the environment the README tells a reader to export.
- A block that cannot run says why: the info string ``text`` (output, layout: nothing to type), or a
  ``<!-- readme-test: skip REASON -->`` line right before it, REASON one of :data:`SKIP_REASONS`.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

import pytest
import yaml

from tests.servers import RedisServer
from tests.helpers.tiers import require_redis_server

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
NAMESPACE = "prod-a"

RUNNABLE = {"python", "sh", "console", "redis", "yaml"}
NOT_COMMANDS = {"text"}
SKIP_REASONS = {
    "runs-the-suite": "running the whole suite from inside it would recurse",
    "installs": "it changes the Python environment the suite runs in",
    "needs-docker": "no Docker daemon in the test environment",
    "needs-sentinel": "the line is for Sentinels, not a data node",
    "serves-until-stopped": "a long-running server; the test named in the comment runs and stops it",
}

_BLOCK = re.compile(r"(?:<!-- readme-test: skip (?P<skip>[\w-]+)[^\n]*-->\n)?^```(?P<info>[^\n`]*)\n(?P<body>.*?)^```$",
                    re.S | re.M)


@dataclass(frozen=True)
class Block:
    line: int
    info: str
    body: str
    skip: Optional[str]

    @property
    def id(self) -> str:
        return f"line{self.line}-{self.info or 'none'}"


BLOCKS = [Block(README.count("\n", 0, m.start("info")) + 1, m.group("info").strip(), m.group("body"), m.group("skip"))
          for m in _BLOCK.finditer(README)]
RUN = [b for b in BLOCKS if b.info in RUNNABLE and b.skip is None]


def test_blocks_are_found_and_every_one_runs_or_says_why_not() -> None:
    assert len(BLOCKS) == README.count("\n```") // 2, "an unbalanced fence"
    for block in BLOCKS:
        assert block.info in RUNNABLE | NOT_COMMANDS, f"{block.id}: give the block an info string"
        if block.skip is not None:
            assert block.skip in SKIP_REASONS, f"{block.id}: unknown skip reason {block.skip!r}"
        if block.info in NOT_COMMANDS:
            assert not any(line.startswith("$ ") for line in block.body.splitlines()), \
                f"{block.id}: commands to type belong in a console or sh block"
    assert {b.info for b in RUN} == RUNNABLE  # every kind of block is exercised


def test_readme_says_to_export_the_url_and_namespace_before_the_cli_examples() -> None:
    first_cli_example = README.index("$ kvstatus ")
    for variable in ("KVSTATUS_URL", "KVSTATUS_NAMESPACE"):
        assert f"export {variable}=" in README[:first_cli_example], variable
    assert f"export KVSTATUS_NAMESPACE={NAMESPACE} " in README


def test_readme_has_a_pip_install_line_for_library_users() -> None:
    assert re.search(r"^pip install \.", README, re.M)


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    require_redis_server()
    with RedisServer() as started:
        yield started


@pytest.fixture
def environment(server: RedisServer) -> dict[str, str]:
    """The reader's shell after the README's exports, with the kvstatus command running this checkout."""
    with server.client() as admin:
        admin.flushall()
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVSTATUS_")}
    env.update(KVSTATUS_URL=server.url, KVSTATUS_NAMESPACE=NAMESPACE,
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}", PYTHONPATH=str(ROOT))
    return env


def _numbers_aside(text: str) -> list[str]:
    """Lines without their numbers and column padding, in order-free form (SCAN order varies)."""
    lines = (re.sub(r"\d+", "#", " ".join(line.split())) for line in text.splitlines())
    return sorted(line for line in lines if line)


def _transcript(body: str) -> Iterator[tuple[str, str, int]]:
    """(command, expected output, expected exit code) of each ``$ `` line of a console block."""
    for chunk in re.split(r"^\$ ", body, flags=re.M)[1:]:
        command, _, output = chunk.partition("\n")
        code = re.search(r"^# exit code (\d+)$", output, re.M)
        yield command, re.sub(r"^# exit code \d+\n?", "", output, flags=re.M), int(code.group(1)) if code else 0


@pytest.mark.real
@pytest.mark.parametrize("block", RUN, ids=lambda b: b.id)
def test_block_runs_as_pasted(block: Block, environment: dict[str, str], server: RedisServer,
                              tmp_path: Path) -> None:
    if block.info == "python":
        done = subprocess.run([sys.executable, "-c", block.body], cwd=tmp_path, env=environment,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
    elif block.info == "sh":
        done = subprocess.run(["bash", "-e", "-u", "-o", "pipefail", "-c", block.body], cwd=tmp_path,
                              env=environment, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
    elif block.info == "yaml":
        document = yaml.safe_load(block.body)  # a Prometheus scrape config: it must at least parse as pasted
        assert isinstance(document, dict) and document, block.id
    elif block.info == "redis":
        with server.client() as admin:
            for line in filter(None, map(str.strip, block.body.splitlines())):
                admin.execute_command(*shlex.split(line))
    else:
        for command, expected, code in _transcript(block.body):
            done = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=environment, capture_output=True,
                                  text=True, timeout=120)
            shown = done.stdout + done.stderr
            assert done.returncode == code, (command, shown)
            assert "Traceback" not in shown, (command, shown)
            assert _numbers_aside(shown) == _numbers_aside(expected), (command, shown)
