"""Keeping passwords out of text: every message kvstatus prints about a URL goes through :func:`mask_url`.

Masking works by parsing, not by a pattern that stops at some character: a
password pasted unencoded may hold any character (whitespace, ``@ / ? # : &``,
unicode), so for every ``scheme://`` in the text

- the user info runs from ``://`` to the *last* ``@`` of the text; the user
  name (up to the first ``:``) stays, everything after it becomes ``***``
  (user info without a ``:`` may be a password alone and is masked whole);
- from the first query option whose (percent-decoded) name ends in
  ``password``, everything to the end of the text becomes ``***``.

Masking too much is the safe direction: the text shown may lose the part of a
URL after its password, never a part of the password.
"""

from __future__ import annotations

from urllib.parse import unquote_plus

MASK = "***"
_QUERY_SEPARATORS = "?&;"


def _userinfo_span(text: str, start: int) -> tuple[int, int] | None:
    """The span to mask in the user info of the URL whose authority starts at ``start``, or None."""
    at = text.rfind("@", start)
    if at < 0:
        return None
    colon = text.find(":", start, at)
    return (colon + 1 if colon >= 0 else start), at


def _query_password_span(text: str, start: int) -> tuple[int, int] | None:
    """From the value of the first ``*password=`` query option after ``start`` to the end of the text, or None."""
    for i in range(start, len(text)):
        if text[i] not in _QUERY_SEPARATORS:
            continue
        equals = text.find("=", i + 1)
        if equals < 0:
            return None
        name = text[i + 1 : equals]
        if any(sep in name for sep in _QUERY_SEPARATORS):
            continue  # no "=" before the next option: this one has no value
        if unquote_plus(name).strip().lower().endswith("password"):
            return equals + 1, len(text)
    return None


def mask_url(text: str) -> str:
    """``text`` (a URL, or a message holding URLs) with every password replaced by ``***``; safe to print."""
    text = str(text)
    spans: list[tuple[int, int]] = []
    start = text.find("://")
    while start >= 0:
        authority = start + 3
        for span in (_userinfo_span(text, authority), _query_password_span(text, authority)):
            if span is not None and span[0] < span[1]:
                spans.append(span)
        start = text.find("://", authority)
    if not spans:
        return text
    spans.sort()
    merged: list[list[int]] = []
    for low, high in spans:
        if merged and low <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], high)
        else:
            merged.append([low, high])
    pieces, last = [], 0
    for low, high in merged:
        pieces += [text[last:low], MASK]
        last = high
    pieces.append(text[last:])
    return "".join(pieces)
