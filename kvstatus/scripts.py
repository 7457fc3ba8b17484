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

READ_ONLY_SHEBANG = "#!lua flags=no-writes"
"""The first line of a read-only script: EVALSHA on replicas and under CLIENT PAUSE WRITE, FCALL_RO as a function."""

ALL: tuple[LuaScript, ...] = (UPDATE, GET_MANY, RECORD_FAILURE, CLEAR, ROOM, LEASE, ROOM_STATUSES, SWEEP)


# Redis 7 functions: the same files, registered as one function library that an admin loads
# once (FUNCTION LOAD), so that a tenant needs FCALL / FCALL_RO only, never SCRIPT LOAD or EVAL (which
# run any Lua). The library is built by plain concatenation: each file's text, its first line dropped
# when it is a "#!lua" shebang (functions declare flags at registration instead), between fixed lines
# that make it the body of a local function and register that function. No value is interpolated but
# the version tag: the first 12 hex digits of the SHA-1 over the files, a function of the files
# themselves and never of a caller's value. It names the library and its functions, so each kvstatus
# version's rule lives under its own names, two versions coexist during a rolling upgrade (as EVALSHA's
# SHA-named scripts do), and a client never runs another version's rule: it finds its functions
# missing and says what an admin runs. The state machine stays in lua/*.lua, and only there.

_FUNCTION_SCRIPTS: tuple[tuple[LuaScript, bool], ...] = tuple(
    (script, script.source.startswith(READ_ONLY_SHEBANG)) for script in ALL)
"""Each script of the library, and whether it is registered read-only (``no-writes``: FCALL_RO, replicas)."""

LIBRARY_TAG: str = hashlib.sha1("".join(s.source for s in ALL).encode("utf-8")).hexdigest()[:12]
LIBRARY_NAME: str = "kvstatus_" + LIBRARY_TAG


def function_name(script: LuaScript) -> str:
    """The FCALL name of ``script`` in :data:`LIBRARY_NAME`, e.g. ``kvstatus_<tag>_update``."""
    return LIBRARY_NAME + "_" + script.name


def _body(script: LuaScript) -> str:
    first, _, rest = script.source.partition("\n")
    return rest if first.startswith("#!") else script.source


def _library() -> str:
    parts = ["#!lua name=" + LIBRARY_NAME + "\n"]
    for script, read_only in _FUNCTION_SCRIPTS:
        parts += [
            "local function " + script.name + "(KEYS, ARGV)\n",
            _body(script),
            "\nend\n",
            "redis.register_function{function_name='" + function_name(script) + "', callback=" + script.name
            + (", flags={'no-writes'}" if read_only else "") + "}\n",
        ]
    return "".join(parts)


LIBRARY: str = _library()
"""The Lua source an admin loads with ``FUNCTION LOAD`` (``kvstatus functions load``)."""
