"""The docs site's API reference shows the docstrings' Sphinx roles as code spans (tools/docroles.py, loaded by
mkdocs.yml): no reader meets ``:meth:`from_url``` on the page (issue 35 item 3 counted 103)."""

from __future__ import annotations

import ast
import re
import sys

from tests.helpers import ROOT

sys.path.insert(0, str(ROOT / "tools"))
import docroles  # noqa: E402

ANY_ROLE = re.compile(r"(?<![\w`<>]):[a-z]+:`(?!`)")
"""Any inline role, of any kind: what the page must not show."""


def test_a_role_becomes_the_code_span_of_the_name_it_shows() -> None:
    text = (
        "See :class:`~kvstatus.errors.StoreError`, :meth:`from_url`, :func:`kvstatus.sglang.install`, "
        ":data:`~kvstatus.operations.CHUNK_ROOMS`, :mod:`kvstatus.sglang.outage` and :meth:`~A.b(x)`."
    )
    assert docroles.render(text) == (
        "See `StoreError`, `from_url()`, `kvstatus.sglang.install()`, `CHUNK_ROOMS`, "
        "`kvstatus.sglang.outage` and `b(x)`."
    )
    assert docroles.render(":param room: the room id") == ":param room: the room id"  # fields are the style's


def _docstrings() -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    for path in sorted((ROOT / "kvstatus").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc:
                    found.append((f"{path.relative_to(ROOT)}:{getattr(node, 'name', '<module>')}", doc))
    return found


def test_every_role_the_package_uses_is_one_the_extension_renders() -> None:
    docstrings = _docstrings()
    assert sum(1 for _, doc in docstrings if docroles.ROLE.search(doc)) > 100  # the package does use them
    left = [(where, m.group(0)) for where, doc in docstrings for m in ANY_ROLE.finditer(docroles.render(doc))]
    assert left == [], f"roles the docs page would print raw: {left[:10]}"


def test_mkdocs_loads_the_extension() -> None:
    assert "extensions: [tools/docroles.py:SphinxRoles]" in (ROOT / "mkdocs.yml").read_text()
