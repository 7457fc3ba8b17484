"""A griffe extension of the docs site: the docstrings' Sphinx roles rendered as code spans.

The package's docstrings cross-reference with Sphinx roles (``:class:`~kvstatus.errors.KVStatusError```,
``:meth:`from_url```). mkdocstrings' ``sphinx`` style parses the field lists (``:param x:``) but prints inline
roles as they are written. This extension, loaded by mkdocs.yml, rewrites each role into the code span a reader
looks for: the last part of a ``~`` path, else the target as written, with ``()`` after a function or method.
"""

from __future__ import annotations

import re
from typing import Any

try:
    import griffe
except ImportError:  # the test suite's environment (no docs extra): render() alone, which the tests check
    griffe = None  # type: ignore[assignment]

ROLE = re.compile(r":(class|mod|func|data|meth|attr|exc|obj):`(~?)([^`]+)`")
"""A Sphinx role of the Python domain: its kind, the ``~`` that shortens it, and its target."""


def render(text: str) -> str:
    """``text`` with every :data:`ROLE` replaced by a code span of the name it shows."""

    def span(match: re.Match[str]) -> str:
        kind, short, target = match.groups()
        name = target.rsplit(".", 1)[-1] if short else target
        if kind in ("func", "meth") and not name.endswith(")"):
            name += "()"
        return f"`{name}`"

    return ROLE.sub(span, text)


if griffe is not None:

    class SphinxRoles(griffe.Extension):
        """Render the roles of every loaded object's docstring (:func:`render`)."""

        def on_object(self, *, obj: griffe.Object, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
            if obj.docstring is not None:
                obj.docstring.value = render(obj.docstring.value)
