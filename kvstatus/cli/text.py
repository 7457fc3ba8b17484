"""The CLI's text output: :func:`safe`, the one escaping of every value read from Redis, and the tables."""

from __future__ import annotations

import re
from typing import Any, Optional

import click

_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ufeff\ud800-\udfff]")
_NAMED_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    code = ord(char)
    return _NAMED_ESCAPES.get(char) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def safe(value: object) -> str:
    """``value`` as text a terminal shows as it is: every control character visible as an escape.

    C0 controls, DEL and C1 controls (``\\x1b``, ``\\x9b``, ``\\x00`` ...), CR, LF and TAB (``\\r``, ``\\n``,
    ``\\t``), the Unicode line/paragraph separators and bidirectional overrides (``\\u2028``, ``\\u202e`` ...)
    and lone surrogates are escaped, so no value read from Redis can move the cursor, clear the screen, set the
    title or clipboard (OSC 52), hide text, or add a line. Everything else, backslashes included, is kept.
    The one escaping of the CLI's text output: every value from Redis goes through it (``--json`` escapes by
    JSON's rules)."""
    return _UNSAFE.sub(_escape, str(value))


def table(headers: list[str], rows: list[list[Any]]) -> str:
    """A plain left-aligned text table, each column as wide as its widest cell; every cell and header through
    :func:`safe`."""
    headers = [safe(h) for h in headers]  # a header may be a name from Redis (stats' participants)
    cells = [[safe(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    return "\n".join([_line(headers, widths)] + [_line(row, widths) for row in cells])


def plural(count: int, singular: str, plural_form: Optional[str] = None) -> str:
    """``count`` and the noun, in the right number: "1 room", "2 rooms", "1 entry", "0 entries"."""
    return f"{count} {singular if count == 1 else (plural_form or singular + 's')}"


class StreamTable:
    """A table printed as its rows come, in blocks of up to ``block`` rows (bounded memory).

    Each column is as wide as its widest cell so far; the header is printed with the first block, and again after
    a blank line when a later block widens a column. Nothing is printed before the first row, or :meth:`close`.
    """

    def __init__(self, headers: list[str], block: int = 1000) -> None:
        self.headers = [safe(h) for h in headers]
        self.block = block
        self.widths: Optional[list[int]] = None
        self.pending: list[list[str]] = []

    def add(self, row: list[Any]) -> None:
        self.pending.append([safe(c) for c in row])
        if len(self.pending) >= self.block:
            self.flush()

    def flush(self) -> None:
        """Print the pending rows (with a header when the columns are new or wider)."""
        if not self.pending:
            return
        widths = [max([len(h)] + [len(r[i]) for r in self.pending]) for i, h in enumerate(self.headers)]
        if self.widths is not None:
            widths = [max(a, b) for a, b in zip(widths, self.widths)]
        if widths != self.widths:
            if self.widths is not None:
                click.echo("")
            click.echo(_line(self.headers, widths))
            self.widths = widths
        for row in self.pending:
            click.echo(_line(row, widths))
        self.pending = []

    def close(self) -> None:
        """Print what is pending; with no row at all, the header alone."""
        self.flush()
        if self.widths is None:
            click.echo(_line(self.headers, [len(h) for h in self.headers]))


def _line(cells: list[str], widths: list[int]) -> str:
    return "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()
