"""A command that needs an optional extra which is not installed says so and exits 1 before it starts anything.

Each module an extra brings is made unimportable in turn (``sys.modules[name] = None``), as on a machine where
``pip install kvstatus`` left it out: ``uvicorn`` alone missing used to pass the check and end ``kvstatus serve``
in a traceback once the board was built.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any, Callable

import fakeredis
import pytest

from kvstatus.cli.app import EXTRAS
from tests.helpers.cli import assert_clean_failure, invoke

COMMANDS = [
    ("web", ["serve", "--port", "0"], "kvstatus serve"),
    ("metrics", ["exporter", "--port", "0"], "kvstatus exporter"),
    ("web", ["demo", "--serve", "0", "--requests", "10"], "--serve"),
]


@pytest.mark.parametrize(
    ("extra", "args", "what", "module"),
    [(extra, args, what, module) for extra, args, what in COMMANDS for module in EXTRAS[extra]],
    ids=lambda value: value if isinstance(value, str) else None,
)
def test_a_missing_extra_is_named_and_nothing_starts(
    monkeypatch: pytest.MonkeyPatch,
    connect: Callable[[str], Any],
    server: fakeredis.FakeServer,
    extra: str,
    args: list[str],
    what: str,
    module: str,
) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # type: ignore[arg-type]  # import then raises ImportError
    result = invoke(connect, "--namespace", "extras", *args)
    assert_clean_failure(
        result.output,
        result.exit_code,
        1,
        f"Error: {what} needs the optional '{extra}' extra ({module} is not installed): "
        f"in a kvstatus checkout, pip install '.[{extra}]'",
    )
    assert fakeredis.FakeRedis(server=server).dbsize() == 0  # nothing was written, no board or exporter ran


def test_every_extra_of_the_package_is_checked_by_its_modules() -> None:
    """EXTRAS checks each extra by the modules pyproject.toml's requirements of it install."""
    project = (Path(__file__).parents[2] / "pyproject.toml").read_text(encoding="utf-8")
    for extra, modules in EXTRAS.items():
        listed = re.search(rf"^{extra} = \[(.*?)\]", project, re.MULTILINE | re.DOTALL)
        assert listed is not None, extra
        requirements = re.findall(r'"([A-Za-z0-9_.-]+)', listed.group(1))
        assert sorted(name.replace("-", "_") for name in requirements) == sorted(modules), extra
