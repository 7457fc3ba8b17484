"""fakeredis runs kvstatus' Lua scripts: it is taught the script shebang of Redis 7.

Redis strips a first line ``#!lua flags=...`` before compiling a script;
fakeredis (up to 2.41 at least) hands the whole text to Lua, which rejects the
``#``. The demo's fakeredis fallback and the tests call :func:`accept_script_shebang`
once; it turns that line into a Lua comment of the same length (line numbers
stay) and leaves the script's SHA, taken from the text as sent, unchanged.
"""

from __future__ import annotations

import hashlib
from typing import Any

_PATCHED = "_kvstatus_accepts_shebang"


def accept_script_shebang() -> None:
    """Patch fakeredis' EVAL (and so EVALSHA) to accept a ``#!`` first line; idempotent."""
    from fakeredis.commands_mixins.scripting_mixin import ScriptingCommandsMixin

    original = ScriptingCommandsMixin.eval
    if getattr(original, _PATCHED, False):
        return

    def eval_with_shebang(self: Any, script: bytes, numkeys: int, *keys_and_args: bytes) -> Any:
        if script.startswith(b"#!"):
            self._server.script_cache.setdefault(_sha1(script), script)
            script = b"--" + script[2:]
        return original(self, script, numkeys, *keys_and_args)

    setattr(eval_with_shebang, _PATCHED, True)
    ScriptingCommandsMixin.eval = eval_with_shebang  # type: ignore[method-assign]


def _sha1(script: bytes) -> bytes:
    return hashlib.sha1(script).hexdigest().encode()
