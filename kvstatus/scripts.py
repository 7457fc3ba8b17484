"""The Lua scripts of ``lua/``, read once at import.

Scripts run by EVALSHA; a server that does not know one (``NOSCRIPT``: a
restart, ``SCRIPT FLUSH``, a new cluster node) is sent ``SCRIPT LOAD`` and the
call is repeated, so each client registers a script the first time it needs it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Union

_Source = Union[Path, "resources.abc.Traversable"]


@dataclass(frozen=True)
class LuaScript:
    """A Lua script's name, source and SHA1 (the EVALSHA handle)."""

    name: str
    source: str
    sha: str


def _lua_dir() -> _Source:
    packaged = resources.files("kvstatus").joinpath("lua")
    if packaged.is_dir():
        return packaged
    # A source checkout: the scripts live in the repository's top-level lua/.
    return Path(__file__).resolve().parent.parent / "lua"


def _load(name: str) -> LuaScript:
    source = _lua_dir().joinpath(f"{name}.lua").read_text(encoding="utf-8")
    return LuaScript(name, source, hashlib.sha1(source.encode("utf-8")).hexdigest())


UPDATE: LuaScript = _load("update")
GET_MANY: LuaScript = _load("get_many")
RECORD_FAILURE: LuaScript = _load("record_failure")
CLEAR: LuaScript = _load("clear")
ROOM: LuaScript = _load("room")
LEASE: LuaScript = _load("lease")
ROOM_STATUSES: LuaScript = _load("room_statuses")
SWEEP: LuaScript = _load("sweep")

ALL: tuple[LuaScript, ...] = (UPDATE, GET_MANY, RECORD_FAILURE, CLEAR, ROOM, LEASE, ROOM_STATUSES, SWEEP)
