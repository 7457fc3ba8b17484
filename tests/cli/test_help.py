"""Every command and option has help text, and appears in the command line guide (docs/cli.md)."""

from __future__ import annotations

import re

import click
import pytest

from kvstatus.cli import main
from tests.helpers import ROOT
from tests.helpers.cli import invoke

README = ROOT / "README.md"
CLI_GUIDE = ROOT / "docs" / "cli.md"
COMMANDS = sorted(main.commands)


def cli_section() -> str:
    return CLI_GUIDE.read_text(encoding="utf-8")


def options(command: click.Command) -> list[click.Option]:
    return [p for p in command.params if isinstance(p, click.Option) and p.name != "help"]


def test_there_are_the_commands_of_the_issue() -> None:
    assert COMMANDS == [
        "acl",
        "cancel",
        "clear",
        "demo",
        "doctor",
        "explain",
        "exporter",
        "functions",
        "get",
        "health",
        "ls",
        "participants",
        "serve",
        "set",
        "stats",
        "sweep",
        "watch",
    ]


@pytest.mark.parametrize("name", COMMANDS)
def test_command_and_options_have_help_and_are_in_the_readme(name: str) -> None:
    command = main.commands[name]
    assert command.help and len(command.help) > 20, name
    section = cli_section()
    assert f"`kvstatus {name} " in section or f"`kvstatus {name}`" in section, name
    row = next(line for line in section.splitlines() if line.startswith(f"| `kvstatus {name}"))
    for option in options(command):
        assert option.help, (name, option.name)
        assert option.opts[-1] in row or option.opts[0] in row, (name, option.opts)
    for argument in (p for p in command.params if isinstance(p, click.Argument)):
        shown = (argument.metavar or argument.name.upper()).rstrip(".")
        assert shown in command.help and shown in row, (name, shown)
    result = invoke(lambda url: None, name, "--help")
    assert result.exit_code == 0 and "Usage: kvstatus" in result.output


def test_shared_options_have_help_and_are_in_the_readme() -> None:
    section = cli_section()
    for option in options(main):
        assert option.help, option.name
        if option.name != "version":
            assert f"`{option.opts[0]}" in section, option.opts


def test_readme_starts_with_the_demo_then_the_tests() -> None:
    text = README.read_text(encoding="utf-8")
    first_block = re.search(r"```sh\n(.*?)```", text, re.S).group(1)
    commands = [line.split("#")[0].strip() for line in first_block.splitlines() if line.strip()]
    assert commands == ["./dev demo", "./dev test"]
    assert text.index("```sh") < text.index("\n## ")


def test_readme_shows_output_of_every_command() -> None:
    section = cli_section()
    for name in COMMANDS:
        # demo, watch, exporter and serve cannot be replayed as pasted (timing, concurrent writers, servers): their output is a text block
        # introduced by the command; every other command is in the console transcript tests/test_readme.py runs.
        prefix = {
            "demo": "`./dev demo`",
            "watch": "`kvstatus watch --count",
            "exporter": "`kvstatus exporter ",
            "serve": "`kvstatus serve ",
        }.get(name, f"$ kvstatus {name}")
        assert prefix in section, name
