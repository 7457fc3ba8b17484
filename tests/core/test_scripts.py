"""The Lua scripts agree with the Python side: outcome numbers, error prefixes, the ACL check, NOSCRIPT healing."""

from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import Any

import fakeredis
import pytest
import redis

from kvstatus import KVPoll, Outcome, StatusStore, scripts, timeline
from kvstatus.errors import BackendError, CorruptedValueError, InvalidArgumentError, PermissionDeniedError
from kvstatus.model import CancelOutcome, LeaseOutcome, ReasonOutcome
from kvstatus.operations import Request, script_call, update_result
from kvstatus.translate import translate_error
from tests.helpers.backends import RedisUnderTest, fresh_namespace
from tests.servers import RedisServer

LUA = Path(__file__).resolve().parents[2] / "lua"
SOURCES = {script.name: script.source for script in scripts.ALL}  # as Redis runs them: lua/lib/ spliced in
WRITES = ("HSET", "HSETNX", "HDEL", "PEXPIRE", "DEL", "SET", "EXPIRE")


def _constants(source: str) -> dict[str, int]:
    """Every ``local NAME, ... = 1, ...`` of integer constants (upper-case names) in a script."""
    found: dict[str, int] = {}
    for names, values in re.findall(r"^local ([A-Z_][A-Z0-9_, ]*) = ([-0-9, ]+)$", source, re.M):
        for name, value in zip(names.split(","), values.split(",")):
            found[name.strip()] = int(value)
    return found


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).upper()


def test_every_script_numbers_outcomes_and_statuses_as_model_py() -> None:
    known = {o.name: o.value for o in Outcome} | {o.name: o.value for o in ReasonOutcome}
    known |= {o.name: o.value for o in LeaseOutcome} | {o.name: o.value for o in CancelOutcome}
    known |= {f"STATUS_{_snake(s.name)}": s.value for s in KVPoll}
    known |= {"TIMELINE_MAX_BYTES": timeline.MAX_BYTES}
    seen = set()
    for name, source in SOURCES.items():
        for constant, value in _constants(source).items():
            assert constant in known, f"{name}.lua: {constant} is not a kvstatus.model name"
            assert value == known[constant], f"{name}.lua: {constant} = {value}, model.py says {known[constant]}"
            seen.add(constant)
    assert {o.name for o in Outcome} <= seen and {o.name for o in ReasonOutcome} <= seen


def test_outcome_codes_never_collide() -> None:
    by_value: dict[int, str] = {}
    for member in [*Outcome, *ReasonOutcome, *LeaseOutcome, *CancelOutcome]:
        assert by_value.setdefault(member.value, member.name) == member.name


def test_every_script_of_lua_is_loaded() -> None:
    assert sorted(SOURCES) == sorted(path.stem for path in LUA.glob("*.lua"))


def test_every_script_checks_the_acl_with_the_one_lib_function() -> None:
    """The pre-check is written once, in lua/lib/acl.lua, and every script runs that text."""
    files = {path: path.read_text() for path in sorted(LUA.rglob("*.lua"))}
    assert [path.relative_to(LUA).as_posix() for path, text in files.items() if "acl_check_cmd(" in text] == [
        "lib/acl.lua"
    ]
    helper = (LUA / "lib" / "acl.lua").read_text()
    for name, source in SOURCES.items():
        assert helper.rstrip("\n") in source, name
        assert source.count("acl_check_cmd(") == 1, f"{name}.lua asks the ACL outside acl_refusal"


def test_read_only_scripts_carry_the_no_writes_flag() -> None:
    for name, source in SOURCES.items():
        writes = any(f'redis.call("{command}"' in source for command in WRITES)
        assert source.startswith("#!lua flags=no-writes\n") is not writes, name
    assert SOURCES["get_many"].startswith("#!lua flags=no-writes\n")


def test_unknown_script_replies_are_rejected() -> None:
    store = StatusStore(fakeredis.FakeRedis(), namespace=fresh_namespace())
    assert update_result(1, 3) == (Outcome.CREATED, KVPoll.Transferring)
    for outcome, status in ((0, 1), (8, 1), (1, 5), (b"1", 1)):
        with pytest.raises(BackendError, match="does not know"):
            update_result(outcome, status)
    decode = store._core.record_failure(1, "x").decode
    assert [decode([o.value]) for o in ReasonOutcome] == [False, True, False]
    for code in (0, 1, 2, 7, None):
        with pytest.raises(BackendError, match="record_failure script replied"):
            decode([code])


# One call per error prefix the scripts return, with the kvstatus error it must become.
PREFIX_CASES: dict[str, tuple[scripts.LuaScript, list[str], tuple[Any, ...], type]] = {
    "KVSTATUS_BADARG": (
        scripts.UPDATE,
        ["kvstatus:e:{1}"],
        ("seed", "0", "p", "reason:p", "inc:p", "", "", "1"),
        InvalidArgumentError,
    ),
    "KVSTATUS_CORRUPT": (
        scripts.UPDATE,
        ["kvstatus:e:{2}"],
        ("seed", "1000", "p", "reason:p", "inc:p", "", "", "1"),
        CorruptedValueError,
    ),
    "NOPERM": (
        scripts.UPDATE,
        ["kvstatus:e:{3}"],
        ("seed", "1000", "p", "reason:p", "inc:p", "", "", "1"),
        PermissionDeniedError,
    ),
}


def test_every_error_prefix_of_the_scripts_has_a_case() -> None:
    prefixes = set()
    for source in SOURCES.values():
        prefixes |= set(
            re.findall(
                r'"(NOPERM|[A-Z_]+) ',
                "\n".join(
                    line
                    for line in source.splitlines()
                    if "error_reply(" in line or line.strip().startswith('return "')
                ),
            )
        )
    assert prefixes == set(PREFIX_CASES)


@pytest.mark.real
@pytest.mark.parametrize("prefix", sorted(PREFIX_CASES))
def test_each_script_error_becomes_its_kvstatus_error(redis_server: RedisServer, prefix: str) -> None:
    script, keys, args, expected = PREFIX_CASES[prefix]
    with redis_server.client() as admin:
        admin.hset("kvstatus:e:{2}", "p", "banana")
        admin.pexpire("kvstatus:e:{2}", 60_000)
        admin.execute_command(
            "ACL",
            "SETUSER",
            "e-user",
            "reset",
            "on",
            ">pw",
            "~kvstatus:e:*",
            "+evalsha",
            "+script|load",
            "+hget",
            "+hset",
            "+hdel",
        )  # no PEXPIRE
        user = "e-user" if prefix == "NOPERM" else "default"
        call = script_call(script, keys, args)
        with redis.Redis(
            host=redis_server.host, port=redis_server.port, username=user, password="pw" if user != "default" else None
        ) as client:
            client.script_load(script.source)
            with pytest.raises(redis.RedisError) as info:
                client.execute_command(*call.args)
        error = translate_error(info.value, call)
        assert type(error) is expected, (prefix, error)
        if prefix == "NOPERM":
            assert "'pexpire'" in str(error)
        assert admin.exists("kvstatus:e:{1}", "kvstatus:e:{3}") == 0


def test_script_errors_map_on_fakeredis_too() -> None:
    client = fakeredis.FakeRedis()
    client.hset("kvstatus:e:{2}", "p", "banana")
    for prefix in ("KVSTATUS_BADARG", "KVSTATUS_CORRUPT"):
        script, keys, args, expected = PREFIX_CASES[prefix]
        call = script_call(script, keys, args)
        client.script_load(script.source)
        with pytest.raises(redis.RedisError) as info:
            client.execute_command(*call.args)
        assert type(translate_error(info.value, call)) is expected


class _LosesScripts(redis.Redis):
    """A client whose SCRIPT LOAD is undone at once, as if another client flushed scripts right after."""

    def script_load(self, script: Any) -> Any:
        sha = super().script_load(script)
        self.script_flush()
        return sha


class _FakeLosesScripts(_LosesScripts, fakeredis.FakeRedis):
    pass


def test_a_script_flushed_after_its_reload_is_sent_by_source() -> None:
    store = StatusStore(_FakeLosesScripts(), namespace=fresh_namespace())
    assert store.update_status(1, KVPoll.Bootstrapping).outcome is Outcome.CREATED
    assert store.update_many({1: KVPoll.Success, 2: KVPoll.WaitingForInput})[2].outcome is Outcome.CREATED
    assert store.get_many([1, 2, 3]) == {1: KVPoll.Success, 2: KVPoll.WaitingForInput, 3: None}
    assert store.record_failure(1, "x") is True


def test_empty_requests_touch_nothing() -> None:
    store = StatusStore(fakeredis.FakeRedis(), namespace=fresh_namespace())
    assert store._send(Request([], lambda replies: replies)) == []
    assert store.update_many({}) == {} and store.get_many([]) == {}


@pytest.mark.real
@pytest.mark.parametrize("asynchronous", [False, True])
def test_calls_survive_continuous_script_flushes(redis_server: RedisServer, asynchronous: bool) -> None:
    """Another connection runs SCRIPT FLUSH in a loop; not one call may fail ("No matching script")."""
    stop = threading.Event()
    flushes = [0]

    def flush_forever() -> None:
        with redis_server.client() as admin:
            while not stop.is_set():
                admin.script_flush()
                flushes[0] += 1

    backend = RedisUnderTest("real", redis_server.client(), redis_server.client, False, redis_server)
    if asynchronous:
        import redis.asyncio

        backend = RedisUnderTest(
            "real-async",
            redis_server.client(),
            lambda: redis.asyncio.Redis(host=redis_server.host, port=redis_server.port),
            True,
        )
    store = backend.store(participant="p")
    flusher = threading.Thread(target=flush_forever, daemon=True)
    flusher.start()
    errors: list[BaseException] = []
    try:
        for room in range(300):
            try:
                store.update_status(room, KVPoll.Bootstrapping)
                store.update_many({room: KVPoll.Transferring, room + 1000: KVPoll.Bootstrapping})
                assert store.get_many([room, room + 1000]) == {
                    room: KVPoll.Transferring,
                    room + 1000: KVPoll.Bootstrapping,
                }
                store.record_failure(room, "x")
            except Exception as exc:  # noqa: BLE001 - counted, so one run shows how many fail
                errors.append(exc)
    finally:
        stop.set()
        flusher.join()
        backend.close()
    assert flushes[0] > 100
    assert errors == []


@pytest.mark.real
def test_a_batch_reaching_a_key_outside_the_acl_writes_nothing(redis_server: RedisServer) -> None:
    """The ACL covers rooms 1x only: a batch that also names room 20 is refused before its first write."""
    with redis_server.client() as admin:
        admin.execute_command(
            "ACL",
            "SETUSER",
            "split",
            "reset",
            "on",
            ">pw",
            "~kvstatus:split:{1*}",
            "+evalsha",
            "+script|load",
            "+hget",
            "+hmget",
            "+hset",
            "+hdel",
            "+pexpire",
        )
        with redis.Redis(host=redis_server.host, port=redis_server.port, username="split", password="pw") as client:
            store = StatusStore(client, namespace="split")
            assert store.update_status(10, KVPoll.Bootstrapping).outcome is Outcome.CREATED
            with pytest.raises(PermissionDeniedError):
                store.update_many({10: KVPoll.Success, 11: KVPoll.Bootstrapping, 20: KVPoll.Bootstrapping})
            assert store.get_many([10, 11]) == {10: KVPoll.Bootstrapping, 11: None}
        assert admin.exists("kvstatus:split:{20}") == 0


@pytest.mark.real
def test_a_user_without_hdel_still_creates_and_advances(redis_server: RedisServer) -> None:
    """The scripts ask the ACL only about the writes a call makes; HDEL runs only when an entry leaves Failed."""
    with redis_server.client() as admin:
        admin.execute_command(
            "ACL",
            "SETUSER",
            "nohdel",
            "reset",
            "on",
            ">pw",
            "~kvstatus:nohdel:*",
            "+evalsha",
            "+script|load",
            "+hget",
            "+hmget",
            "+hset",
            "+pexpire",
        )
    with redis.Redis(host=redis_server.host, port=redis_server.port, username="nohdel", password="pw") as client:
        store = StatusStore(client, namespace="nohdel")
        assert store.update_status(1, KVPoll.Bootstrapping).outcome is Outcome.CREATED
        assert (
            store.update_many({1: KVPoll.Success, 2: KVPoll.Failed, 3: KVPoll.WaitingForInput})[1].outcome
            is Outcome.ADVANCED
        )
        assert store.update_status(1, KVPoll.Failed).outcome is Outcome.FAILED
        with pytest.raises(PermissionDeniedError, match="'hdel'"):
            store.update_status(1, KVPoll.Success)
        assert store.get(1) is KVPoll.Failed
