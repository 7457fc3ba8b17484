"""Keeping passwords out of text: every message kvstatus prints about a URL goes through :func:`mask_url`."""

from __future__ import annotations

import re

# Up to the LAST "@": an unencoded "@", "/", "?" or "#" in a password must not leave part of it visible.
_PASSWORD = re.compile(r"(?P<head>://[^:@\s]*:)\S*(?=@)")
_QUERY_PASSWORD = re.compile(r"(?P<head>[?&;]\w*password=)[^&#\s]*", re.IGNORECASE)


def mask_url(url: str) -> str:
    """``url`` with any password (user info or a ``*password=`` option) replaced by ``***``; safe to print."""
    masked = _PASSWORD.sub(lambda m: m.group("head") + "***", str(url))
    return _QUERY_PASSWORD.sub(lambda m: m.group("head") + "***", masked)
