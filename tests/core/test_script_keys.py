"""Every script that takes more than one key (but get_many.lua, which writes nothing) refuses keys that do not
belong together, before its first write.

Issue 19 item 11: a direct EVALSHA of update.lua with keys ``{4}``, ``{5}`` wrote a ``late:`` note into room 5.
Each case below sends one script mismatched keys as a tenant could (EVALSHA, or FCALL of the function library),
and checks the reply is a KVSTATUS_BADARG naming the key, and that no key of either namespace changed.
"""

from __future__ import annotations

from typing import Any, Iterator

import fakeredis
import pytest
import redis

from kvstatus import InvalidArgumentError, scripts
from kvstatus.admin.functions import load_functions
from kvstatus.requests import as_fcall, script_call
from kvstatus.translate import translate_error
from tests.helpers.backends import fresh_namespace
from tests.servers import RedisServer

NS = fresh_namespace("keys")
A, B = f"kvstatus:{NS}:", f"kvstatus:{NS}x:"  # two namespaces
TTL = "60000"

# name -> (script, keys, args, the key the error must name)
CASES: dict[str, tuple[scripts.LuaScript, list[str], tuple[str, ...], str]] = {
    "update: a late note into another room (the issue's repro)": (
        scripts.UPDATE,
        [A + "{4}", A + "{5}"],
        ("seed", TTL, "p", "reason:p", "inc:p", "", "", "0"),
        A + "{5}",
    ),
    "cancel: a batch over two namespaces": (
        scripts.CANCEL,
        [A + "{1}", B + "{2}"],
        (TTL, "router", "client went away"),
        B + "{2}",
    ),
    "cancel: a tombstone among the rooms": (
        scripts.CANCEL,
        [A + "{1}", A + "{2}:t"],
        (TTL, "router", "client went away"),
        A + "{2}:t",
    ),
    "update: a batch over two namespaces": (
        scripts.UPDATE,
        [A + "{1}", B + "{2}"],
        ("seed", TTL, "p", "reason:p", "inc:p", "", "", "1", "1"),
        B + "{2}",
    ),
    "update: tombstones of the other rooms": (
        scripts.UPDATE,
        [A + "{1}", A + "{2}", A + "{2}:t", A + "{1}:t"],
        ("seed", TTL, "p", "reason:p", "inc:p", "", "", "0", "0"),
        A + "{2}:t",
    ),
    "update: a key that is no room key, with its tombstone": (
        scripts.UPDATE,
        [A + "x", A + "x:t"],
        ("seed", TTL, "p", "reason:p", "inc:p", "", "", "0"),
        A + "x",
    ),
    "clear: another room's tombstone": (
        scripts.CLEAR,
        [A + "{1}", A + "{2}:t"],
        ("p", "reason:p", "late:p", TTL, "inc:p", "", "t:p"),
        A + "{2}:t",
    ),
    "clear: another namespace's tombstone": (
        scripts.CLEAR,
        [A + "{1}", B + "{1}:t"],
        ("p", "reason:p", "late:p", TTL, "inc:p", "", "t:p"),
        B + "{1}:t",
    ),
    "room: another room's tombstone": (scripts.ROOM, [A + "{1}", A + "{2}:t"], (), A + "{2}:t"),
    "room_statuses: another namespace's lease": (
        scripts.ROOM_STATUSES,
        [A + "{1}", B + "lease:p"],
        ("1", "", "p"),
        B + "lease:p",
    ),
    "room_statuses: another participant's lease": (
        scripts.ROOM_STATUSES,
        [A + "{1}", A + "lease:q"],
        ("1", "", "p"),
        A + "lease:q",
    ),
    "room_statuses: rooms of two namespaces": (
        scripts.ROOM_STATUSES,
        [A + "{1}", B + "{2}", A + "lease:p"],
        ("2", "", "p"),
        B + "{2}",
    ),
    "room_statuses: no rooms, another participant's lease": (
        scripts.ROOM_STATUSES,
        [A + "lease:q"],
        ("0", "", "p"),
        A + "lease:q",
    ),
    "room_statuses: no rooms, leases of two namespaces": (
        scripts.ROOM_STATUSES,
        [A + "lease:p", B + "lease:q"],
        ("0", "", "p", "q"),
        B + "lease:q",
    ),
    "sweep: rooms of two namespaces": (scripts.SWEEP, [A + "{1}", B + "{2}"], ("p", "reason:p", "lost"), B + "{2}"),
    "sweep: a lease record among the rooms": (
        scripts.SWEEP,
        [A + "{1}", A + "lease:q"],
        ("p", "reason:p", "lost"),
        A + "lease:q",
    ),
    "update: a tombstone among the rooms of a batch": (
        scripts.UPDATE,
        [A + "{1}", A + "{2}:t"],
        ("seed", TTL, "p", "reason:p", "inc:p", "", "", "1", "1"),
        A + "{2}:t",
    ),
}


def test_every_script_of_many_keys_checks_them_but_get_many() -> None:
    """get_many.lua writes nothing and answers each key's own HGET: the check would cost 15-30 % of its
    Redis time for nothing (its header says so). Every other script that takes several keys checks them."""
    checking = {script.name for script in scripts.ALL if "local function room_keys_refusal(" in script.source}
    assert checking == {"update", "clear", "room", "room_statuses", "sweep", "cancel"}
    assert {script.name for script, *_ in CASES.values()} == checking


def _seed(client: Any) -> None:
    """Entries of participant p in rooms 1, 2 and 5 of both namespaces, a tombstone and a lease record."""
    for base in (A, B):
        for room in (1, 2, 5):
            client.hset(f"{base}{{{room}}}", mapping={"p": "1"})
            client.pexpire(f"{base}{{{room}}}", 60_000)
        client.hset(f"{base}{{2}}:t", "p", "1700000000000 1")
        client.pexpire(f"{base}{{2}}:t", 60_000)
        client.hset(f"{base}lease:q", mapping={"inc": "ab", "state": "held", "deadline": "1"})
        client.pexpire(f"{base}lease:q", 60_000)


def _snapshot(client: Any) -> dict[bytes, dict[bytes, bytes]]:
    return {key: client.hgetall(key) for key in sorted(client.scan_iter(match=f"kvstatus:{NS}*"))}


@pytest.fixture(
    params=["fake", pytest.param("real", marks=pytest.mark.real), pytest.param("functions", marks=pytest.mark.real)]
)
def client(request: pytest.FixtureRequest) -> Iterator[tuple[Any, str]]:
    if request.param == "fake":
        yield fakeredis.FakeRedis(), "eval"
        return
    server: RedisServer = request.getfixturevalue("redis_server")
    with redis.Redis(host=server.host, port=server.port) as raw:
        for key in raw.scan_iter(match=f"kvstatus:{NS}*"):
            raw.delete(key)
        if request.param == "functions":
            load_functions(raw)
        yield raw, "functions" if request.param == "functions" else "eval"


@pytest.mark.parametrize("case", sorted(CASES))
def test_keys_that_do_not_belong_together_are_refused_and_nothing_is_written(
    client: tuple[Any, str], case: str
) -> None:
    raw, mode = client
    script, keys, args, named = CASES[case]
    _seed(raw)
    before = _snapshot(raw)
    call = script_call(script, keys, args)
    if mode == "functions":
        call = as_fcall(call)
    else:
        raw.script_load(script.source)
        call = call.without_ro()  # fakeredis has no EVALSHA_RO; the real server runs both the same
    with pytest.raises(redis.ResponseError) as info:
        raw.execute_command(*call.args)
    error = translate_error(info.value, call)
    assert isinstance(error, InvalidArgumentError), error
    assert "keys do not belong together" in str(error) and f"key {named} " in str(error), str(error)
    assert _snapshot(raw) == before


def test_keys_that_belong_together_pass_the_check() -> None:
    """The same scripts with matching keys answer (the stores' own tests cover what they answer)."""
    raw = fakeredis.FakeRedis()
    _seed(raw)
    ok = [
        (
            scripts.UPDATE,
            [A + "{1}", A + "{2}", A + "{1}:t", A + "{2}:t"],
            ("seed", TTL, "p", "reason:p", "inc:p", "", "", "2", "0"),
        ),
        (scripts.CLEAR, [A + "{1}", A + "{1}:t"], ("p", "reason:p", "late:p", TTL, "inc:p", "", "t:p")),
        (scripts.ROOM, [A + "{1}", A + "{1}:t"], ()),
        (scripts.ROOM_STATUSES, [A + "{1}", A + "{2}", A + "lease:p", A + "lease:q"], ("2", "room:fate", "p", "q")),
        (scripts.ROOM_STATUSES, [B + "lease:q"], ("0", "", "q")),
        (scripts.SWEEP, [A + "{5}", A + "{2}"], ("p", "reason:p", "lost")),
        (scripts.GET_MANY, [A + "{1}", A + "{2}", A + "{5}"], ("p",)),
    ]
    for script, keys, args in ok:
        raw.script_load(script.source)
        raw.execute_command(*script_call(script, keys, args).without_ro().args)
