"""Lua and Python accept the same stored values (issue 36): each junk value a tenant or a buggy writer can put into
Redis goes through lua/lib/stored.lua on a real Redis and through kvstatus.replies, and the two verdicts agree."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Optional

import pytest
import redis

from kvstatus import CorruptedValueError, replies, scripts
from kvstatus.keys import KeySchema
from kvstatus.leasestate import LeaseCore
from kvstatus.replies import decode_room, decode_tombstone
from tests.servers import RedisServer

PROBE = scripts.splice(
    "stored_probe", (Path(__file__).parent / "lua" / "stored_probe.lua").read_text(), scripts.read_lib
)

INTS: list[Any] = [
    "1", "7", "42", "1764680000123", "999999999999999", "1000000000000000", "0", "007", "-5", "+5", " 7", "7 ",
    "7\n", "0x10", "1e3", "1E3", "1e300", "1e400", "inf", "-inf", "INF", "nan", "NaN", "1.5", "1.0", "", " ",
    "\u0667", "\uff17", b"\xff", b"7\x00", "9" * 5000,
]  # fmt: skip
TIMES: list[Any] = [*INTS, "253402300799999", "253402300800000", "253402300799998"]
TEXTS: list[Any] = [
    "", "ok", "client went away", "é", "€" * 682, "a" * 2048, "a" * 2049, "é" * 1024, "é" * 1025, b"\xff",
    b"caf\xc3", b"\xc0\x80", b"\xe0\x80\x80", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xf0\x9f\x98\x80",
    b"\xe2\x82", b"\x80", "\x00nul", "\x1b[2J", "x" * (4 << 20),
]  # fmt: skip
NAMES: list[Any] = ["p", "prefill-0", "decode_3.a", "a" * 128, "a" * 129, "", "a b", "a:b", "{x}", "é", "x\n"]
FATES: list[Any] = [
    "1764680000123:cancelled:router-1:client went away", "1764680000123:transfer:prefill-0:",
    "1764680000123:lease-lost:decode-1:participant decode-1 lost its lease", "1:bootstrap:p:a:b:c",
    "1764680000123:waiting:p:" + "r" * 2048, "1764680000123:superseded:p:\xff",
    "99999999999999999999:cancelled:x:y", "253402300800000:cancelled:x:y", "253402300799999:cancelled:x:y",
    "0:cancelled:x:y", "-1:cancelled:x:y", " 1:cancelled:x:y", "1e3:cancelled:x:y", "inf:cancelled:x:y",
    "1:bogus:x:y", "1:Cancelled:x:y", "1:cancelled::y", "1:cancelled:a b:y", "1:cancelled:x",
    "1:cancelled:" + "a" * 129 + ":y", "1:cancelled:x:" + "r" * 2049, "", ":::", "garbage", "1" * 5000,
    b"1:cancelled:\xff:y", "1:cancelled:x:" + "é" * 1025,
]  # fmt: skip
TIMELINES: list[Any] = [
    "1@1764680000123", "1@1764680000123 2+15 3+40 4+52", "1@5 2+0 3+0", "0@1 4+999999999999999",
    "1@999999999999999", "1@5 2+3 3+2", "1@1000000000000000", "1@" + "9" * 5000, "1@5 2+03", "1@05", "5@1",
    "1@0", "1@1 2+", "1@1  2+3", "1@1 2+3 ", " 1@1", "1@1 2-3", "1@1 2+1e3", "1@1 2+1000000000000000",
    "1@1 " + " ".join(["2+1"] * 38), "1@1 " + " ".join(["2+1"] * 39), "x" * (1 << 20), "", "yesterday",
    b"1@1 2+\xff",
]  # fmt: skip


def _none_on_corrupt(parse: Callable[[], str]) -> Optional[str]:
    try:
        return parse()
    except CorruptedValueError:
        return None


def _fate(value: Any) -> Optional[str]:
    def parse() -> str:
        record = replies.parse_failure(value, "k", "room:fate")
        datetime.fromtimestamp(record.at, timezone.utc)  # every record it accepts can be shown (issue 36: OSError)
        return f"{record.stage.value} {record.origin}"

    return _none_on_corrupt(parse)


def _timeline(value: Any) -> Optional[str]:
    def parse() -> str:
        steps = replies.parse_timeline(value, "k", "t:p")
        return f"{steps[0].at_ms} {steps[-1].at_ms - steps[0].at_ms}"

    return _none_on_corrupt(parse)


PYTHON: dict[str, Callable[[Any], Optional[str]]] = {
    "int": lambda value: None if replies.stored_int(value) is None else str(replies.stored_int(value)),
    "time": lambda value: _none_on_corrupt(lambda: str(replies.parse_time(value, "k", "f"))),
    "text": lambda value: "ok" if replies.stored_text(value) else None,
    "name": lambda value: "ok" if replies.stored_name(value) else None,
    "fate": _fate,
    "timeline": _timeline,
}
CASES = [("int", INTS), ("time", TIMES), ("text", TEXTS), ("name", NAMES), ("fate", FATES), ("timeline", TIMELINES)]


@pytest.fixture(scope="module")
def client(redis_server: RedisServer) -> Any:
    made = redis.Redis(host=redis_server.host, port=redis_server.port)
    yield made
    made.close()


@pytest.mark.parametrize(("kind", "values"), CASES, ids=[kind for kind, _ in CASES])
def test_lua_and_python_accept_the_same_stored_values(client: Any, kind: str, values: list[Any]) -> None:
    verdicts = {True: 0, False: 0}
    for value in values:
        lua = client.eval(PROBE, 0, kind, value)
        python = PYTHON[kind](value)
        assert (None if lua is None else lua.decode("utf-8", "replace")) == python, (kind, replies.shown(value, 60))
        verdicts[python is not None] += 1
    assert verdicts[True] >= 2 and verdicts[False] >= 3, verdicts  # the table holds both kinds


def test_the_python_parsers_raise_only_corrupted_value_errors_naming_the_key() -> None:
    for _, values in CASES:
        for value in values:
            for parse in (replies.parse_epoch, replies.parse_time, replies.parse_failure, replies.parse_timeline):
                try:
                    parse(value, "kvstatus:ns:{5}", "f")
                except CorruptedValueError as exc:
                    assert "key kvstatus:ns:{5} field f holds " in str(exc) and len(str(exc)) < 200, exc


@pytest.mark.parametrize(
    "previous",
    ["999999999999998", "999999999999999", "1000000000000000", "1e300", "inf", "-5", " 7", "0x10", "nan", "5", "x"],
)
def test_an_acquire_takes_the_epoch_the_python_rule_gives(client: Any, previous: str) -> None:
    """lua/lease.lua's acquire and kvstatus.replies.next_epoch agree, and the epoch is one lua/update.lua takes:
    a forged epoch (issue 36: 999999999999999 made every later acquire take a 16-digit one) is read as none."""
    schema = KeySchema("stored-epochs")
    core = LeaseCore(schema, "decode-9", 3.0, 10_000)
    client.delete(core.key)
    client.hset(core.key, "epoch", previous)
    seconds, micros = client.time()
    before = int(seconds) * 1000 + int(micros) // 1000
    code, _, epoch = _acquire(client, core)
    seconds, micros = client.time()
    after = int(seconds) * 1000 + int(micros) // 1000
    assert code == 10 and replies.stored_int(str(epoch)) == epoch  # HELD, and a valid epoch
    assert replies.next_epoch(previous, before) <= epoch <= replies.next_epoch(previous, after)


def _acquire(client: Any, core: LeaseCore) -> tuple[int, int, int]:
    call = core.request("acquire").calls[0]
    reply = client.eval(scripts.LEASE.source, *call.args[2:])
    return int(reply[0]), int(reply[1]), int(reply[2])


def test_a_room_of_junk_reads_as_a_view_or_a_corrupted_value_error_never_another_exception() -> None:
    """Every junk value of the tables above, in every field kind a room hash holds, through the read the engine
    path uses (check_status, get, room and the near cache decode a room's fields with decode_room)."""
    junk = [value for _, values in CASES for value in values] + [None, 7, 1e300, b"", b"\x00" * 10]
    for value in junk:
        for field in ("p", "reason:p", "inc:p", "t:p", "room:fate", "x:y", b"\xff"):
            try:
                view = decode_room(5, "kvstatus:ns:{5}", {field: value, "q": "1"}, 1000, timelines=True)
            except CorruptedValueError as exc:
                assert "kvstatus:ns:{5}" in str(exc)
            else:
                assert view.participants["q"].status is not None
        tombstone = decode_tombstone({"p": value, "late:p": value}, 1000)
        assert tombstone is None or set(tombstone.cleared) <= {"p"}
