"""The Lua scripts of ``lua/``, read once at import, with the helpers of ``lua/lib/`` spliced in: a line
``-- @include NAME`` becomes ``lua/lib/NAME.lua`` (BullMQ's convention) at its indentation (an include inside a block
scopes the lib's locals there), so every script is one self-contained text whose SHA is the spliced text's
(``python -m kvstatus.expand NAME`` prints it). A lib may not include another, and a script includes each lib at
most once (else :class:`LuaIncludeError`, naming the file and line)."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from importlib import resources
from importlib.abc import Traversable
from pathlib import Path
from typing import Callable, Optional

READ_ONLY_SHEBANG = "#!lua flags=no-writes"
"""The first line of a read-only script: EVALSHA_RO (on replicas, under CLIENT PAUSE WRITE), FCALL_RO as a function."""

_INCLUDE = re.compile(r"^([ \t]*)--\s*@include\b(.*)$", re.M)
_INCLUDE_LINE = re.compile(r"^[ \t]*--\s*@include\b.*\n", re.M)
_LIB_NAME = re.compile(r"[a-z][a-z0-9_]*")


class LuaIncludeError(ValueError):
    """An ``-- @include`` line that cannot be spliced: a missing lib file, a nested or repeated include."""


@dataclass(frozen=True)
class LuaScript:
    """A Lua script's name, spliced source and SHA1 (the EVALSHA handle), and whether it writes nothing;
    ``own``, its file's text without its include lines, and ``libs``, the libs it includes (for :data:`LIBRARY`)."""

    name: str
    source: str
    sha: str
    read_only: bool = False
    own: str = ""
    libs: tuple[str, ...] = ()


def _lua_dir() -> Traversable:
    packaged = resources.files("kvstatus").joinpath("lua")
    if packaged.is_dir():
        return packaged
    # A source checkout: the scripts live in the repository's top-level lua/.
    return Path(__file__).resolve().parent.parent / "lua"


def splice(name: str, text: str, read_lib: Callable[[str], Optional[str]]) -> str:
    """``text`` of ``lua/<name>.lua`` with each ``-- @include LIB`` line replaced by ``read_lib(LIB)`` (None: no such
    file); raises :class:`LuaIncludeError` for a malformed, missing, repeated or nested include."""
    seen: set[str] = set()

    def replace(match: re.Match[str]) -> str:
        line = text.count("\n", 0, match.start()) + 1
        where = f"lua/{name}.lua line {line}"
        indent, lib = match.group(1), match.group(2).strip()
        if not _LIB_NAME.fullmatch(lib):
            raise LuaIncludeError(
                f"{where}: expected '-- @include NAME' (NAME of lua/lib/NAME.lua: a-z, 0-9, _), got {match.group(0)!r}"
            )
        if lib in seen:
            raise LuaIncludeError(f"{where}: lua/lib/{lib}.lua is included twice")
        seen.add(lib)
        body = read_lib(lib)
        if body is None:
            raise LuaIncludeError(f"{where}: no such file lua/lib/{lib}.lua")
        nested = _INCLUDE.search(body)
        if nested:
            raise LuaIncludeError(
                f"lua/lib/{lib}.lua (included by {where}) has an @include of its own: lib files "
                f"are spliced once and may not include ({nested.group(0)!r})"
            )
        lines = [
            f"-- >>> lua/lib/{lib}.lua (-- @include {lib})",
            *body.rstrip("\n").split("\n"),
            f"-- <<< lua/lib/{lib}.lua",
        ]
        return "\n".join(indent + line if line else line for line in lines)

    return _INCLUDE.sub(replace, text)


def read_lib(lib: str) -> Optional[str]:
    """The text of ``lua/lib/<lib>.lua``, or None when there is no such file (the ``read_lib`` of :func:`splice`)."""
    path = _lua_dir().joinpath("lib").joinpath(f"{lib}.lua")
    return path.read_text(encoding="utf-8") if path.is_file() else None


def _load(name: str) -> LuaScript:
    text = _lua_dir().joinpath(f"{name}.lua").read_text(encoding="utf-8")
    source = splice(name, text, read_lib)
    sha = hashlib.sha1(source.encode("utf-8")).hexdigest()
    read_only = source.startswith(READ_ONLY_SHEBANG + "\n")
    libs = tuple(match.group(2).strip() for match in _INCLUDE.finditer(text))
    return LuaScript(name, source, sha, read_only, own=_INCLUDE_LINE.sub("", text), libs=libs)


ALL: tuple[LuaScript, ...] = tuple(
    map(_load, ("update", "get_many", "record_failure", "clear", "room", "lease", "room_statuses", "sweep", "cancel"))
)
UPDATE, GET_MANY, RECORD_FAILURE, CLEAR, ROOM, LEASE, ROOM_STATUSES, SWEEP, CANCEL = ALL
BY_NAME: dict[str, LuaScript] = {script.name: script for script in ALL}


# Redis 7 functions: the same scripts as one library an admin loads once (docs/security.md, "The tenant recipe"):
# each lua/lib/ file once at the top level, in LIB_ORDER, then each script's own text (no shebang, no include lines)
# as the body of a local function it registers. Nothing is interpolated but the version tag, a hash of the scripts.

LIB_ORDER: tuple[str, ...] = ("acl", "time", "keys", "fate", "stored", "stored_text", "timeline")
"""The libs in the order the function library defines them: a lib uses only the names of libs above it
(``stored_text`` uses ``stored``'s). A lib's helpers take what differs per call as arguments (the script's
``KEYS``, its ``SCRIPT`` name), never a name of the including script."""

LIBRARY_TAG: str = hashlib.sha1("".join(s.source for s in ALL).encode("utf-8")).hexdigest()[:12]
LIBRARY_NAME: str = "kvstatus_" + LIBRARY_TAG


def function_name(script: LuaScript) -> str:
    """The FCALL name of ``script`` in :data:`LIBRARY_NAME`, e.g. ``kvstatus_<tag>_update``."""
    return LIBRARY_NAME + "_" + script.name


def _library() -> str:
    unordered = {lib for script in ALL for lib in script.libs} - set(LIB_ORDER)
    if unordered:
        raise LuaIncludeError(f"lua/lib/{min(unordered)}.lua is included but not in kvstatus.scripts.LIB_ORDER")
    parts = ["#!lua name=" + LIBRARY_NAME + "\n"]
    for lib in LIB_ORDER:
        text = read_lib(lib)
        if text is None:
            raise LuaIncludeError(f"no such file lua/lib/{lib}.lua (kvstatus.scripts.LIB_ORDER)")
        parts += ["-- >>> lua/lib/" + lib + ".lua\n", text.rstrip("\n"), "\n-- <<< lua/lib/" + lib + ".lua\n"]
    for script in ALL:
        first, _, rest = script.own.partition("\n")
        body = rest if first.startswith("#!") else script.own  # functions declare their flags at registration
        flags = ", flags={'no-writes'}" if script.read_only else ""
        parts += [
            f"local function {script.name}(KEYS, ARGV)\n{body}\nend\n",
            f"redis.register_function{{function_name='{function_name(script)}', callback={script.name}{flags}}}\n",
        ]
    return "".join(parts)


LIBRARY: str = _library()
"""The Lua source an admin loads with ``FUNCTION LOAD`` (``kvstatus functions load``)."""
