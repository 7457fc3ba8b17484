"""Raw RESP for the attack tests: a hostile tenant's commands with no kvstatus or redis-py code in between."""

from __future__ import annotations

from typing import Any


def resp(*args: Any) -> bytes:
    """``args`` as one RESP command (an array of bulk strings)."""
    out = b"*%d\r\n" % len(args)
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        out += b"$%d\r\n%s\r\n" % (len(data), data)
    return out
