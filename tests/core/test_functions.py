"""``scripts="functions"``: the same rule, run as FCALL of the library built from lua/*.lua, on every backend."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kvstatus import InvalidArgumentError, KVPoll, Policy, StatusStore, apply_rule, scripts
from kvstatus.admin.functions import load_functions
from kvstatus.operations import StoreCore
from kvstatus.requests import as_fcall, as_functions
from tests.helpers.backends import RedisUnderTest, all_combinations
from tests.servers import RedisServer

ROOT = Path(__file__).resolve().parents[2]

COMBINATIONS = list(all_combinations())


def test_the_library_defines_each_lib_once_then_the_scripts_without_their_includes() -> None:
    library = scripts.LIBRARY
    assert library.startswith(f"#!lua name={scripts.LIBRARY_NAME}\n")
    for lib in scripts.LIB_ORDER:
        text = scripts.read_lib(lib)
        assert text is not None and library.count(text.rstrip("\n")) == 1, lib
    defined = [library.index(f"-- >>> lua/lib/{lib}.lua\n") for lib in scripts.LIB_ORDER]
    assert defined == sorted(defined) and defined[-1] < library.index("local function update(KEYS, ARGV)")
    for script in scripts.ALL:
        own = (ROOT / "lua" / f"{script.name}.lua").read_text()
        body = own.split("\n", 1)[1] if own.startswith("#!") else own
        kept = [line for line in body.split("\n") if not re.match(r"\s*--\s*@include\b", line)]
        assert "\n".join(kept) in library  # each file's own text, its include lines dropped
        assert set(script.libs) <= set(scripts.LIB_ORDER) and script.libs, script.name
        assert f"function_name='{scripts.function_name(script)}'" in library
    assert "flags={'no-writes'}" in library.split(scripts.function_name(scripts.GET_MANY))[1]


def _defined(text: str) -> set[str]:
    return set(re.findall(r"^local (?:function )?(\w+)", text, re.M))


def test_each_lib_uses_only_the_names_of_libs_above_it() -> None:
    """At the library's top level a lib sees the libs above it in LIB_ORDER only, and none of a script's names:
    a name defined twice would shadow, a name of a lib below would read as a (refused) global."""
    texts = {lib: scripts.read_lib(lib) or "" for lib in scripts.LIB_ORDER}
    owner: dict[str, str] = {}
    for lib, text in texts.items():
        for name in _defined(text):
            assert name not in owner, f"{name} is defined by lib/{owner[name]}.lua and lib/{lib}.lua"
            owner[name] = lib
    for position, (lib, text) in enumerate(texts.items()):
        code = re.sub(r"--[^\n]*|\"(?:[^\"\\]|\\.)*\"", "", text)
        used = set(re.findall(r"\b[A-Za-z_]\w*\b", code))
        below = {name for name in used if name in owner and scripts.LIB_ORDER.index(owner[name]) > position}
        assert not below, f"lib/{lib}.lua uses {sorted(below)} of a lib below it in LIB_ORDER"
        assert not {"KEYS", "ARGV", "SCRIPT"} & used, f"lib/{lib}.lua reads a name of the including script"


def test_the_library_loads_and_registers_every_script(redis_server: RedisServer) -> None:
    client = redis_server.client()
    assert client.function_load(scripts.LIBRARY, replace=True) == scripts.LIBRARY_NAME.encode()
    (library,) = client.function_list(library=scripts.LIBRARY_NAME)
    fields = lambda flat: dict(zip(flat[::2], flat[1::2]))  # noqa: E731 - RESP2's flat maps
    functions = {fields(f)[b"name"].decode(): fields(f)[b"flags"] for f in fields(library)[b"functions"]}
    assert functions == {scripts.function_name(s): [b"no-writes"] if s.read_only else [] for s in scripts.ALL}


@pytest.mark.parametrize("policy", list(Policy))
def test_functions_follow_the_reference_rule(backend: RedisUnderTest, policy: Policy) -> None:
    load_functions(backend.raw)
    store = backend.store(policy=policy, scripts="functions", participant="fn")
    assert store.scripts == "functions"
    for room, (current, _) in enumerate(COMBINATIONS):
        if current is not None:
            backend.raw.hset(store.schema.room_key(room), "fn", str(current))
            backend.raw.pexpire(store.schema.room_key(room), 10_000)
    results = store.update_many({room: new for room, (_, new) in enumerate(COMBINATIONS)})
    for room, (current, new) in enumerate(COMBINATIONS):
        assert results[room] == apply_rule(None if current is None else KVPoll(current), KVPoll(new), policy)
    assert store.get_many(range(len(COMBINATIONS))) == {room: r.status for room, r in results.items()}
    assert store.update_status(10_000, KVPoll.Bootstrapping).status is KVPoll.Bootstrapping
    assert store.record_failure(10_000, "lost") is True
    assert store.room(10_000).participants["fn"].reason == "lost"
    assert store.for_participant("other").scripts == "functions"


def test_the_calls_are_fcall_and_fcall_ro() -> None:
    eval_core = StoreCore(namespace="ns")
    fn_store = StatusStore(None, namespace="ns", scripts="functions")
    core = fn_store._core
    assert core.update_status(1, 1).calls[0].args[:3] == ("FCALL", scripts.function_name(scripts.UPDATE), 1)
    # Every other request goes out through as_functions, whatever built it (the store's send loop calls it).
    assert as_functions(core.get_many([1, 2])).calls[0].args[:3] == (
        "FCALL_RO",
        scripts.function_name(scripts.GET_MANY),
        2,
    )
    assert as_functions(core.record_failure(1, "x")).calls[0].args[0] == "FCALL"
    assert as_functions(core.room(1)).calls[0].args[:2] == ("FCALL_RO", scripts.function_name(scripts.ROOM))
    assert as_functions(core.clear(1)).calls[0].args[:2] == ("FCALL", scripts.function_name(scripts.CLEAR))
    for request in (eval_core.update_many({1: 1, 2: 3}), eval_core.get_many([4]), eval_core.record_failure(1, "x")):
        assert [as_fcall(c).args[3:] for c in request.calls] == [c.args[3:] for c in request.calls]
    assert as_functions(core.get(1)).calls[0].args[0] == "HMGET"  # plain commands stay as they are


def test_an_unknown_script_mode_is_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="scripts"):
        StatusStore(None, namespace="ns", scripts="lua")
    from kvstatus.url import parse_url

    with pytest.raises(InvalidArgumentError, match="'scripts' is a store setting"):
        parse_url("redis://localhost:6379/0?scripts=functions")
