"""Every fenced code block of README.md and of every guide in docs/ runs as pasted (issue 9, items 11 and 12;
issue 18 item 6; issue 19 items 15 and 19).

- ``python`` blocks run in a subprocess, twice: on an empty namespace, then again on what the first run left
  (a reader pastes an example more than once); ``sh`` blocks through bash, ``redis`` blocks line by line as
  Redis commands, and ``console`` blocks command by command (``$ ...``), their output compared with the block's,
  numbers aside (TTLs, ports and versions differ from run to run), and their exit codes with ``# exit code N``.
- All against a throwaway redis-server, with the environment the guides tell a reader to export.
- Install blocks (a ``<!-- readme-test: fresh-venv -->`` line right before them) run in a new virtualenv, in a
  copy of the checkout, with pip kept offline: their dependencies come from this test run's environment.
- A block that cannot run says why: the info string ``text`` (output, layout: nothing to type), or a
  ``<!-- readme-test: skip REASON -->`` line right before it, REASON one of :data:`SKIP_REASONS`.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

import pytest
import yaml

from kvstatus.cli.app import EXTRAS
from tests.helpers.tiers import require_redis_server, server_is
from tests.servers import RedisServer

ROOT = Path(__file__).resolve().parents[2]
PAGES = {
    path.relative_to(ROOT).as_posix(): path.read_text(encoding="utf-8")
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
}
README = PAGES["README.md"]
NAMESPACE = "prod-a"

RUNNABLE = {"python", "sh", "console", "redis", "yaml"}
NOT_COMMANDS = {"text"}
SKIP_REASONS = {
    "runs-the-suite": "running the whole suite from inside it would recurse",
    "needs-docker": "no Docker daemon in the test environment",
    "needs-sentinel": "the line is for Sentinels, not a data node",
    "serves-until-stopped": "a long-running server; the test named in the comment runs and stops it",
}
CHECKOUT = ("pyproject.toml", "README.md", "LICENSE", "CHANGELOG.md", "kvstatus", "lua")
"""What a checkout holds that building the package reads."""

_BLOCK = re.compile(
    r"(?:<!-- readme-test: (?:skip (?P<skip>[\w-]+)|(?P<venv>fresh-venv))[^\n]*-->\n)?"
    r"^```(?P<info>[^\n`]*)\n(?P<body>.*?)^```$",
    re.S | re.M,
)


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    info: str
    body: str
    skip: Optional[str]
    fresh_venv: bool

    @property
    def id(self) -> str:
        return f"{self.page}:line{self.line}-{self.info or 'none'}"


BLOCKS = [
    Block(
        page,
        text.count("\n", 0, m.start("info")) + 1,
        m.group("info").strip(),
        m.group("body"),
        m.group("skip"),
        m.group("venv") is not None,
    )
    for page, text in PAGES.items()
    for m in _BLOCK.finditer(text)
]
RUN = [b for b in BLOCKS if b.info in RUNNABLE and b.skip is None and not b.fresh_venv]
INSTALLS = [b for b in BLOCKS if b.fresh_venv]


def _commands(block: Block) -> list[str]:
    return [line.split("#")[0].strip() for line in block.body.splitlines() if line.split("#")[0].strip()]


# An install block whose every command another install block also runs (the README's, a guide's extras) is not
# installed again: pip builds the package each time, which is slow on a loaded box.
INSTALLS_RUN = [b for b in INSTALLS if not any(o is not b and set(_commands(b)) < set(_commands(o)) for o in INSTALLS)]


def test_every_guide_is_read() -> None:
    assert {"docs/guide.md", "docs/sglang.md", "docs/cli.md", "docs/security.md", "docs/design.md"} <= set(PAGES)
    assert len(README.splitlines()) <= 250, "README.md is the front door: the details belong in docs/"


@pytest.mark.parametrize("page", sorted(PAGES))
def test_blocks_are_found_and_every_one_runs_or_says_why_not(page: str) -> None:
    found = [b for b in BLOCKS if b.page == page]
    fences = re.findall(r"^[ \t]*```", PAGES[page], re.M)
    # An indented fence (a block inside a list item) is one this harness does not see, so it would never run.
    assert len(found) * 2 == len(fences), f"{page}: an unbalanced or indented fence"
    for block in found:
        assert block.info in RUNNABLE | NOT_COMMANDS, f"{block.id}: give the block an info string"
        if block.skip is not None:
            assert block.skip in SKIP_REASONS, f"{block.id}: unknown skip reason {block.skip!r}"
        if block.fresh_venv:
            assert block.info == "sh", f"{block.id}: an install block is a sh block"
        if block.info in NOT_COMMANDS:
            assert not any(line.startswith("$ ") for line in block.body.splitlines()), (
                f"{block.id}: commands to type belong in a console or sh block"
            )


def test_every_kind_of_block_is_exercised() -> None:
    assert {b.info for b in RUN} == RUNNABLE
    assert INSTALLS_RUN and {"docs/guide.md"} == {b.page for b in INSTALLS_RUN}


def test_every_install_command_of_the_guides_is_run() -> None:
    run = {command for block in INSTALLS_RUN for command in _commands(block)}
    assert [c for block in INSTALLS for c in _commands(block) if c not in run] == []


@pytest.mark.parametrize("page", sorted(p for p, text in PAGES.items() if "$ kvstatus " in text))
def test_pages_say_to_export_the_url_and_namespace_before_their_cli_examples(page: str) -> None:
    text = PAGES[page]
    first_cli_example = text.index("$ kvstatus ")
    for variable in ("KVSTATUS_URL", "KVSTATUS_NAMESPACE"):
        assert f"export {variable}=" in text[:first_cli_example], (page, variable)
    assert f"export KVSTATUS_NAMESPACE={NAMESPACE} " in text


def test_readme_has_a_pip_install_line_for_library_users() -> None:
    assert re.search(r"^pip install \.", README, re.M)


def _sources() -> dict[str, str]:
    return {
        p.relative_to(ROOT).as_posix(): p.read_text(encoding="utf-8") for p in sorted((ROOT / "kvstatus").rglob("*.py"))
    }


def test_nothing_says_to_install_kvstatus_from_a_package_index() -> None:
    """kvstatus is on no index (issue 19 item 15): ``pip install kvstatus`` or ``'kvstatus[web]'`` fails.
    No code block and no message of the package says to type it (the guides' prose says that it fails)."""
    from_index = re.compile(r"pip install\s+['\"]?kvstatus\b")
    wrong = [block.id for block in BLOCKS if from_index.search(block.body)]
    wrong += [name for name, text in _sources().items() if from_index.search(text)]
    assert not wrong


def test_the_cli_install_hints_are_tested_install_commands() -> None:
    tested = {command for block in INSTALLS_RUN for command in _commands(block)}
    hints = []
    for name, text in _sources().items():
        for command in re.findall(r"pip install '[^']*'", text):
            extras = list(EXTRAS) if "{extra}" in command else [None]  # cli.app.require_extra's message
            hints += [(name, command.replace("{extra}", extra or "")) for extra in extras]
    assert len(hints) >= 3, hints  # the exporter, the board and the demo's fakeredis
    assert [hint for hint in hints if hint[1] not in tested] == []


def _slug(heading: str) -> str:
    return re.sub(r"[\s]+", "-", re.sub(r"[^\w\s-]", "", heading.strip().lower()))


def test_the_readme_links_to_guides_and_sections_that_exist() -> None:
    links = re.findall(r"\]\(([^)#]+\.md)(?:#([\w-]+))?\)", README)
    assert links
    for target, anchor in links:
        assert target in PAGES, target
        if anchor:
            headings = re.findall(r"^#+ (.*)$", PAGES[target], re.M)
            assert anchor in {_slug(h) for h in headings}, (target, anchor)


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    require_redis_server()
    with RedisServer() as started:
        yield started


@pytest.fixture
def environment(server: RedisServer) -> dict[str, str]:
    """The reader's shell after the guides' exports, with the kvstatus command running this checkout."""
    with server.client() as admin:
        admin.flushall()
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVSTATUS_")}
    env.update(
        KVSTATUS_URL=server.url,
        KVSTATUS_NAMESPACE=NAMESPACE,
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        PYTHONPATH=str(ROOT),
    )
    return env


def _numbers_aside(text: str) -> list[str]:
    """Lines without their numbers and column padding, in order-free form (SCAN order varies)."""
    lines = (re.sub(r"\d+", "#", " ".join(line.split())) for line in text.splitlines())
    return sorted(line for line in lines if line)


def _on_this_server(expected: str) -> str:
    """The docs show doctor's line on Redis; on Valkey (KVSTATUS_TEST_SERVER=valkey) it names Valkey."""
    if not server_is("valkey"):
        return expected
    return re.sub(r"^(\S+\s+server version\s+)Redis ", r"\1Valkey ", expected, flags=re.M)


def _transcript(body: str) -> Iterator[tuple[str, str, int]]:
    """(command, expected output, expected exit code) of each ``$ `` line of a console block."""
    for chunk in re.split(r"^\$ ", body, flags=re.M)[1:]:
        command, _, output = chunk.partition("\n")
        code = re.search(r"^# exit code (\d+)$", output, re.M)
        yield command, re.sub(r"^# exit code \d+\n?", "", output, flags=re.M), int(code.group(1)) if code else 0


@pytest.mark.real
@pytest.mark.parametrize("block", RUN, ids=lambda b: b.id)
def test_block_runs_as_pasted(block: Block, environment: dict[str, str], server: RedisServer, tmp_path: Path) -> None:
    if block.info == "python":
        for run in ("on an empty namespace", "again, on what the first run left"):
            done = subprocess.run(
                [sys.executable, "-c", block.body],
                cwd=tmp_path,
                env=environment,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert done.returncode == 0, (run, done.stdout + done.stderr)
            if run == "on an empty namespace":
                _check_printed(block.body, done.stdout)
    elif block.info == "sh":
        done = subprocess.run(
            ["bash", "-e", "-u", "-o", "pipefail", "-c", block.body],
            cwd=tmp_path,
            env=environment,
            capture_output=True,
            text=True,
            timeout=120,
        )
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
            done = subprocess.run(
                ["bash", "-c", command], cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=120
            )
            shown = done.stdout + done.stderr
            assert done.returncode == code, (command, shown)
            assert "Traceback" not in shown, (command, shown)
            assert _numbers_aside(shown) == _numbers_aside(_on_this_server(expected)), (command, shown)


PRINT = re.compile(r"^print\(.*\)\s+# (.+)$")
"""A top-level ``print(...)`` whose comment says what it prints."""
SHOWN_AS_IS = re.compile(r"^(\w+\(.*\)|failed\b.*)$")
"""A comment that is the printed text (a repr, a failure's description), not a description of it."""


def _printed_comments(body: str) -> list[Optional[str]]:
    """For each top-level ``print(`` line of a python block, its comment when it is the printed text (else None)."""
    found: list[Optional[str]] = []
    for line in body.splitlines():
        if line.startswith("print("):
            match = PRINT.match(line)
            found.append(match.group(1) if match and SHOWN_AS_IS.match(match.group(1)) else None)
    return found


def _check_printed(body: str, stdout: str) -> None:
    """Each print whose comment is its output printed that (the start of it, where the comment ends in ``...``
    or the text goes on), numbers aside; a block whose prints do not give one line each is not checked."""
    comments, lines = _printed_comments(body), stdout.splitlines()
    if len(comments) != len(lines):
        return
    for comment, line in zip(comments, lines):
        if comment is not None:
            want = re.sub(r"\d+", "#", comment.split(" ...")[0])
            assert re.sub(r"\d+", "#", line).startswith(want), (comment, line)


def test_the_readme_first_examples_printed_lines_are_checked() -> None:
    """The README's first example prints two UpdateResults whose comments are their output (issue 35 item 3)."""
    first = next(b for b in BLOCKS if b.page == "README.md" and b.info == "python")
    comments = [c for c in _printed_comments(first.body) if c]
    assert comments[:2] == [
        "UpdateResult(outcome=<Outcome.CREATED: 1>, status=<KVPoll.Bootstrapping: 1>)",
        "UpdateResult(outcome=<Outcome.ADVANCED: 2>, status=<KVPoll.Transferring: 3>)",
    ]


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new virtualenv whose pip installs offline: dependencies resolve from this test run's site-packages."""
    venv = tmp_path_factory.mktemp("fresh") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    where = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    purelib = subprocess.run(
        [str(venv / "bin" / "python"), "-c", where], check=True, capture_output=True, text=True
    ).stdout.strip()
    Path(purelib, "_outer_site_packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv


@pytest.mark.slow
@pytest.mark.parametrize("block", INSTALLS_RUN, ids=lambda b: b.id)
def test_install_block_runs_as_pasted_in_a_fresh_venv(block: Block, venv: Path, tmp_path: Path) -> None:
    checkout = tmp_path / "checkout"
    for name in CHECKOUT:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, checkout / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            checkout.mkdir(exist_ok=True)
            shutil.copy2(source, checkout / name)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KVSTATUS_", "PYTHON", "PIP_"))}
    # Offline: no index, and the build backend (hatchling) from the environment rather than a download.
    env.update(
        PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}",
        VIRTUAL_ENV=str(venv),
        PIP_NO_INDEX="1",
        PIP_NO_BUILD_ISOLATION="0",
        PIP_DISABLE_PIP_VERSION_CHECK="1",
    )
    done = subprocess.run(
        ["bash", "-e", "-u", "-o", "pipefail", "-c", block.body],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    installed = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import kvstatus; print(kvstatus.__file__)"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert installed.stdout.startswith(str(venv)), installed.stdout + installed.stderr
    version = subprocess.run(
        [str(venv / "bin" / "kvstatus"), "--version"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    assert version.returncode == 0 and version.stdout.startswith("kvstatus "), version.stdout + version.stderr


def test_the_api_reference_covers_the_public_api() -> None:
    import kvstatus
    from kvstatus import errors

    reference = PAGES["docs/api.md"]
    documented = set(re.findall(r"^::: kvstatus(?:\.\w+)*\.(\w+)$", reference, re.M))
    if "::: kvstatus.errors\n" in reference:
        documented |= {name for name, value in vars(errors).items() if isinstance(value, type)}
    assert sorted(set(kvstatus.__all__) - documented) == []
    assert {"NearCacheOptions", "StoreObserver", "RoomStatusMap"} <= documented
