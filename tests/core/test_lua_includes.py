"""lua/lib/ helpers spliced in at ``-- @include``: every include resolved once, clear errors, and the spliced
text is what Redis runs (EVALSHA, the function library, and ``redis-cli --eval`` of the expanded file)."""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import redis

from kvstatus import KVPoll, StatusStore, scripts
from kvstatus.admin.functions import load_functions, loaded_libraries
from kvstatus.scripts import LuaIncludeError
from tests.helpers.backends import fresh_namespace
from tests.servers import RedisServer
from tests.servers.launch import find_redis_cli

LUA = Path(__file__).resolve().parents[2] / "lua"
FILES = {path.stem: path.read_text() for path in sorted(LUA.glob("*.lua"))}
LIBS = {path.stem: path.read_text() for path in sorted((LUA / "lib").glob("*.lua"))}
INCLUDE = re.compile(r"^([ \t]*)-- @include (\w+)$", re.M)


def test_every_include_is_spliced_with_the_lib_text() -> None:
    used = set()
    for script in scripts.ALL:
        includes = INCLUDE.findall(FILES[script.name])
        assert includes, f"{script.name}.lua includes nothing (every script runs the ACL pre-check of lib/acl.lua)"
        assert not re.search(r"^--\s*@include", script.source, re.M), script.name
        for indent, lib in includes:
            assert textwrap.indent(LIBS[lib].rstrip("\n"), indent) in script.source, (script.name, lib)
            assert script.source.count(f"-- >>> lua/lib/{lib}.lua") == 1
        # Outside the spliced parts, the source is the file's own text, line for line.
        own = re.sub(
            r"^([ \t]*)-- >>> lua/lib/(\w+)\.lua.*?^[ \t]*-- <<< lua/lib/\2\.lua$",
            lambda m: f"{m.group(1)}-- @include {m.group(2)}",
            script.source,
            flags=re.M | re.S,
        )
        assert own == FILES[script.name]
        used |= {lib for _, lib in includes}
    assert used == set(LIBS), f"lib files no script includes: {set(LIBS) - used}"


def test_lib_files_include_nothing_and_define_only_locals() -> None:
    for name, text in LIBS.items():
        assert not re.search(r"^--\s*@include", text, re.M), name
        assert not re.search(r"^(?!local |end|--|\s|$)", text, re.M), f"lib/{name}.lua has a statement at top level"


def test_scripts_name_themselves_before_the_acl_helper() -> None:
    """lib/acl.lua names the script in its NOPERM errors from the including script's SCRIPT local."""
    for name, text in FILES.items():
        declared = text.find(f'local SCRIPT = "{name}"\n')
        assert 0 <= declared < text.index("-- @include acl\n"), name


def test_the_sha_is_the_sha_of_the_spliced_source() -> None:
    for script in scripts.ALL:
        assert script.sha == hashlib.sha1(script.source.encode()).hexdigest()
        assert script.read_only is script.source.startswith(scripts.READ_ONLY_SHEBANG + "\n")
        assert scripts.LIBRARY.count(f"function_name='{scripts.function_name(script)}'") == 1


def _lua_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, files: dict[str, str]) -> None:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    monkeypatch.setattr(scripts, "_lua_dir", lambda: tmp_path)


def test_a_missing_include_names_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _lua_dir(tmp_path, monkeypatch, {"x.lua": "local SCRIPT = 'x'\n-- @include nothere\nreturn 1\n"})
    with pytest.raises(LuaIncludeError, match=r"lua/x\.lua line 2: no such file lua/lib/nothere\.lua"):
        scripts._load("x")


@pytest.mark.parametrize(
    "files, error",
    [
        (
            {"x.lua": "-- @include a\n", "lib/a.lua": "-- @include b\n", "lib/b.lua": "local B = 1\n"},
            r"lua/lib/a\.lua \(included by lua/x\.lua line 1\) has an @include of its own",
        ),
        (
            {"x.lua": "-- @include a\n-- @include a\n", "lib/a.lua": "local A = 1\n"},
            r"lua/x\.lua line 2: lua/lib/a\.lua is included twice",
        ),
        (
            {"x.lua": '-- @include "a"\n', "lib/a.lua": "local A = 1\n"},
            r"lua/x\.lua line 1: expected '-- @include NAME'",
        ),
        (
            {"x.lua": "--@include ../a\n", "lib/a.lua": "local A = 1\n"},
            r"lua/x\.lua line 1: expected '-- @include NAME'",
        ),
    ],
)
def test_nested_repeated_and_malformed_includes_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, files: dict[str, str], error: str
) -> None:
    _lua_dir(tmp_path, monkeypatch, files)
    with pytest.raises(LuaIncludeError, match=error):
        scripts._load("x")


def test_an_include_is_spliced_where_it_stands(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _lua_dir(
        tmp_path,
        monkeypatch,
        {"x.lua": "#!lua flags=no-writes\nlocal A = 1\n-- @include b\nreturn A + B\n", "lib/b.lua": "local B = 2\n"},
    )
    script = scripts._load("x")
    assert script.source == (
        "#!lua flags=no-writes\nlocal A = 1\n-- >>> lua/lib/b.lua (-- @include b)\nlocal B = 2\n"
        "-- <<< lua/lib/b.lua\nreturn A + B\n"
    )
    assert script.read_only and script.sha == hashlib.sha1(script.source.encode()).hexdigest()


def test_an_indented_include_is_spliced_with_its_indentation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Inside a block, the lib's locals are defined only when the block runs (update.lua's key checks)."""
    _lua_dir(
        tmp_path,
        monkeypatch,
        {"x.lua": "if #KEYS > 1 then\n  -- @include b\n  return B\nend\n", "lib/b.lua": "local B = 2\n\nlocal C = 3\n"},
    )
    assert scripts._load("x").source == (
        "if #KEYS > 1 then\n  -- >>> lua/lib/b.lua (-- @include b)\n  local B = 2\n\n"
        "  local C = 3\n  -- <<< lua/lib/b.lua\n  return B\nend\n"
    )


def _expand(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvstatus.expand", *args], capture_output=True, text=True, timeout=60)


def test_expand_prints_the_spliced_script_and_refuses_an_unknown_name() -> None:
    for script in scripts.ALL:
        run = _expand(script.name)
        assert run.returncode == 0 and run.stderr == "", run.stderr
        assert run.stdout == script.source
    assert _expand("--library").stdout == scripts.LIBRARY
    assert _expand("--list").stdout.splitlines()[0] == f"update\t{scripts.UPDATE.sha}\twrites"
    bad = _expand("updat")
    assert bad.returncode == 2 and "no script 'updat': expected one of update, get_many" in bad.stderr
    assert "Traceback" not in bad.stderr
    assert _expand().returncode == 2


@pytest.mark.real
def test_the_spliced_script_is_what_redis_runs(redis_server: RedisServer) -> None:
    """A store's first call on a flushed server loads exactly the spliced text: its SHA is the one sent."""
    with redis_server.client() as admin:
        admin.script_flush()
        store = StatusStore(redis_server.client(), namespace=fresh_namespace("splice"), participant="p")
        store.update_status(1, KVPoll.Bootstrapping)
        store.get_many([1, 2])
        assert admin.script_exists(scripts.UPDATE.sha, scripts.GET_MANY.sha) == [True, True]
        for script in scripts.ALL:
            assert admin.script_load(_expand(script.name).stdout) == script.sha
        load_functions(admin)  # FUNCTION LOAD compiles the library of the spliced scripts
        assert scripts.LIBRARY_NAME in loaded_libraries(admin)[f"{redis_server.host}:{redis_server.port}"]
        store.close()


@pytest.mark.real
def test_redis_cli_eval_runs_the_expanded_files(redis_server: RedisServer, tmp_path: Path) -> None:
    """What a person pastes: expand a script to a file, run it with redis-cli --eval against a real server."""
    cli = find_redis_cli()
    if cli is None:
        pytest.skip("redis-cli is not on PATH")
    namespace = fresh_namespace("cli")
    room, other = f"kvstatus:{namespace}:{{1}}", f"kvstatus:{namespace}:{{2}}"

    def run_file(name: str, *keys_then_args: str) -> list[str]:
        path = tmp_path / f"{name}.lua"
        path.write_text(_expand(name).stdout)
        done = subprocess.run(
            [cli, "-h", redis_server.host, "-p", str(redis_server.port), "--eval", str(path), *keys_then_args],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.split()

    assert run_file("update", room, other, ",", "seed", "60000", "p", "reason:p", "inc:p", "", "", "1", "3") == [
        "1",
        "1",
        "1",
        "3",
    ]
    assert run_file("get_many", room, other, ",", "p") == ["1", "3"]
    refused = run_file("update", room, room + ":x", ",", "seed", "60000", "p", "reason:p", "inc:p", "", "", "0")
    assert " ".join(refused).startswith("KVSTATUS_BADARG keys do not belong together: key kvstatus:")
    store = StatusStore(
        redis.Redis(host=redis_server.host, port=redis_server.port), namespace=namespace, participant="p"
    )
    assert store.get_many([1, 2]) == {1: KVPoll.Bootstrapping, 2: KVPoll.Transferring}
    store.close()
