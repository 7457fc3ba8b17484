"""Every setting a user can turn is listed where users look, with the default the code has.

The user guide's Configuration table names each store argument and each connection option (a field of
``ConnectionOptions``, which the URL's query takes too) with its default; the SGLang guide's table names each
``KVSTATUS_SGLANG_*`` variable the plugin reads. A knob added to the code but not to the table, or a default
changed in one place only, fails here.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path

from kvstatus import ConnectionOptions, StatusStore
from kvstatus.model import Policy
from kvstatus.sglang import plugin
from kvstatus.url import _QUERY_OPTIONS

ROOT = Path(__file__).resolve().parents[2]


def _section(page: str, heading: str) -> str:
    text = (ROOT / "docs" / page).read_text()
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start : end if end != -1 else len(text)]


def _table_rows(section: str) -> list[list[str]]:
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows]


def configuration_table() -> dict[str, tuple[str, str]]:
    """knob -> (where, default cell), a row naming several knobs split with their defaults."""
    table: dict[str, tuple[str, str]] = {}
    for knob, where, default, *_ in _table_rows(_section("guide.md", "## Configuration")):
        names = re.findall(r"`(\w+)`", knob)
        defaults = [d.strip() for d in default.split(",")] if len(names) > 1 else [default]
        if len(defaults) != len(names):
            defaults = [default] * len(names)
        for name, value in zip(names, defaults):
            table[name] = (where, value)
    return table


def _shown(default: object) -> set[str]:
    """How the table may write ``default``: its first backticked value, or a word for none."""
    if default is None:
        return {"unset", "none", "off", "required"}
    if isinstance(default, bool):
        return {str(default).lower()}
    if isinstance(default, Policy):
        return {default.value}
    if isinstance(default, float) and default.is_integer():
        return {f"{default:g}", str(default)}
    return {str(default)}


def _value(cell: str) -> str:
    found = re.search(r"`([^`]*)`", cell)
    return found.group(1) if found else cell.split()[0]


def test_every_connection_option_is_listed_with_its_default() -> None:
    table = configuration_table()
    for field in dataclasses.fields(ConnectionOptions):
        assert field.name in table, f"ConnectionOptions.{field.name} is missing from the guide's Configuration table"
        where, cell = table[field.name]
        assert where == "connection", (field.name, where)
        assert _value(cell) in _shown(field.default), (field.name, cell, field.default)


def test_every_store_argument_is_listed_with_its_default() -> None:
    table = configuration_table()
    for name, parameter in inspect.signature(StatusStore.__init__).parameters.items():
        if name in ("self", "client"):
            continue
        assert name in table, f"StatusStore({name}=...) is missing from the guide's Configuration table"
        where, cell = table[name]
        assert where == "store", (name, where)
        default = parameter.default
        if name == "participant":
            default = "default"  # None names the field "default"
        elif name == "options":
            assert _value(cell) == "ConnectionOptions()", cell
            continue
        shown = "required" if default is inspect.Parameter.empty else _value(cell)
        assert shown in (_shown(None) if default is inspect.Parameter.empty else _shown(default)), (name, cell)


def test_every_sglang_variable_is_listed() -> None:
    names = {value for key, value in vars(plugin).items() if key.startswith("ENV_") and isinstance(value, str)}
    rows = {re.findall(r"`(\w+)`", row[0])[0] for row in _table_rows(_section("sglang.md", "KVSTATUS_SGLANG_URL"))}
    assert names and names <= rows, sorted(names - rows)


def test_the_knob_count_is_what_the_docs_list() -> None:
    """The store's arguments, the connection options and the SGLang variables: the settings a user can turn
    (issue 34's budget is 35). The URL adds its database and the Sentinel credentials, and nothing of the store's:
    its query options are the connection options (``kvstatus.url``)."""
    store = [n for n in inspect.signature(StatusStore.__init__).parameters if n not in ("self", "client", "options")]
    connection = [field.name for field in dataclasses.fields(ConnectionOptions)]
    sglang = [key for key in vars(plugin) if key.startswith("ENV_")]
    assert len(configuration_table()) == len(store) + 1 + len(connection)  # + options itself
    assert (len(store), len(connection), len(sglang)) == (12, 9, 10)
    assert len(store) + 1 + len(connection) + len(sglang) + 3 <= 35  # + options, + the URL's three: issue 34's budget
    assert set(_QUERY_OPTIONS) == {*connection, "db", "sentinel_username", "sentinel_password"}
    total = len(store) + 1 + len(connection) + 3 + len(sglang)
    design = " ".join((ROOT / "docs" / "design.md").read_text(encoding="utf-8").split())
    stated = f"Today: {len(store)} store arguments and `options`, {len(connection)} connection options, the URL's own"
    assert stated in design and f"{len(sglang)} SGLang variables: {total}." in design, "docs/design.md's count is stale"
