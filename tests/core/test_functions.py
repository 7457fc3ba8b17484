"""``scripts="functions"``: the same rule, run as FCALL of the library built from lua/*.lua, on every backend."""

from __future__ import annotations

import pytest

from kvstatus import InvalidArgumentError, KVPoll, Policy, StatusStore, apply_rule, scripts
from kvstatus.admin.functions import load_functions
from kvstatus.operations import StoreCore, as_fcall, as_functions
from tests.helpers.backends import Backend, all_combinations

COMBINATIONS = list(all_combinations())


def test_the_library_is_the_files_concatenated() -> None:
    for script in scripts.ALL:
        body = script.source.split("\n", 1)[1] if script.source.startswith("#!") else script.source
        assert body in scripts.LIBRARY  # each file's text, unchanged
        assert f"function_name='{scripts.function_name(script)}'" in scripts.LIBRARY
    assert scripts.LIBRARY.startswith(f"#!lua name={scripts.LIBRARY_NAME}\n")
    assert "flags={'no-writes'}" in scripts.LIBRARY.split(scripts.function_name(scripts.GET_MANY))[1]


@pytest.mark.parametrize("policy", list(Policy))
def test_functions_follow_the_reference_rule(backend: Backend, policy: Policy) -> None:
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

    with pytest.raises(InvalidArgumentError, match="scripts"):
        parse_url("redis://localhost:6379/0?scripts=lua")
