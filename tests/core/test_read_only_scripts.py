"""Read-only scripts go out as EVALSHA_RO / EVAL_RO (FCALL_RO with functions), which CLIENT PAUSE WRITE never holds.

Issue 17 item 8, issue 19 item 12: the first script read after a start or a SCRIPT FLUSH waited out a whole
CLIENT PAUSE WRITE (an EVALSHA of a script the server does not know is held like a write). A server without
the _RO commands (Redis < 7, fakeredis) or an ACL without them is found out once per store.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Callable, Iterator

import fakeredis
import pytest
import redis
import redis.asyncio
from redis.exceptions import NoScriptError

from kvstatus import AsyncStatusStore, KVPoll, StatusStore, scripts
from kvstatus.admin.functions import load_functions
from kvstatus.requests import as_fcall, evalsha_fallback, noscript_resend, script_call, scripts_of
from tests.helpers.backends import fresh_namespace
from tests.servers import RedisServer

PAUSE_MS = 2000


def test_read_only_scripts_are_called_with_the_ro_commands() -> None:
    read = script_call(scripts.GET_MANY, ["k:n:{1}"], ("p",))
    write = script_call(scripts.UPDATE, ["k:n:{1}"], ("seed", "1000", "p", "reason:p", "inc:p", "", "", "1"))
    assert [s.name for s in scripts.ALL if s.read_only] == ["get_many", "room", "room_statuses"]
    assert read.args[:3] == ("EVALSHA_RO", scripts.GET_MANY.sha, 1) and write.args[0] == "EVALSHA"
    assert read.as_eval().args[:2] == ("EVAL_RO", scripts.GET_MANY.source) and write.as_eval().args[0] == "EVAL"
    assert read.without_ro().args == ("EVALSHA", *read.args[1:]) and write.without_ro() is write
    assert read.as_eval().without_ro().args[0] == "EVAL"
    assert as_fcall(read).args[:2] == ("FCALL_RO", scripts.function_name(scripts.GET_MANY))
    # NOSCRIPT: the read-only call goes at once as EVAL_RO with its source; only the EVALSHA is SCRIPT LOADed.
    missing = NoScriptError("No matching script")
    indices, resend = noscript_resend([read, write], [missing, missing], False)
    assert indices == [0, 1] and resend[0].args[0] == "EVAL_RO" and resend[1] is write
    assert scripts_of(resend) == [scripts.UPDATE]


def test_only_a_refusal_of_the_command_falls_back_to_evalsha() -> None:
    read = script_call(scripts.GET_MANY, ["k:n:{1}"], ("p",))
    unknown = redis.ResponseError("unknown command 'evalsha_ro', with args beginning with: ")
    denied = redis.exceptions.NoPermissionError("this user has no permissions to run the 'evalsha_ro' command")
    indices, calls = evalsha_fallback([read, read, read], [unknown, denied, b"1"])
    assert indices == [0, 1] and [c.args[0] for c in calls] == ["EVALSHA", "EVALSHA", "EVALSHA_RO"]
    script_denied = redis.exceptions.NoPermissionError(
        "this user has no permissions to run the 'hget' command on key k (checked in advance by the kvstatus "
        "get_many script)"
    )
    assert evalsha_fallback([read], [script_denied])[0] == []
    assert evalsha_fallback([read], [redis.ResponseError("unknown command 'x'")]) == ([0], [read.without_ro()])


class _Recording(fakeredis.FakeRedis):
    """fakeredis (no EVALSHA_RO), recording the command name of everything sent."""

    sent: list[str]

    def execute_command(self, *args: Any, **options: Any) -> Any:
        self.__dict__.setdefault("sent", []).append(str(args[0]))
        return super().execute_command(*args, **options)


def test_a_server_without_evalsha_ro_is_found_out_once_per_store() -> None:
    client = _Recording()
    store = StatusStore(client, namespace=fresh_namespace("ro"), participant="p")
    store.update_status(1, KVPoll.Transferring)
    for script in scripts.ALL:
        client.script_load(script.source)
    client.sent.clear()
    assert store.get_many([1, 2]) == {1: KVPoll.Transferring, 2: None}
    assert client.sent == ["EVALSHA_RO", "EVALSHA"]  # refused (unknown command), resent as EVALSHA
    client.sent.clear()
    assert store.get_many([1, 2]) == {1: KVPoll.Transferring, 2: None}
    assert store.room(1).participants["p"].status is KVPoll.Transferring
    assert client.sent == ["EVALSHA", "EVALSHA"]  # one command each from then on
    client.script_flush()
    client.sent.clear()
    assert store.get_many([1]) == {1: KVPoll.Transferring}
    assert client.sent == ["EVALSHA", "SCRIPT LOAD", "EVALSHA"]


@pytest.mark.real
def test_an_acl_without_evalsha_ro_is_found_out_once(redis_server: RedisServer) -> None:
    """A user set up before the _RO commands existed (``+evalsha +eval +script|load``) still reads."""
    namespace = fresh_namespace("ro-acl")
    with redis_server.client() as admin:
        admin.execute_command(
            "ACL",
            "SETUSER",
            "no-ro",
            "reset",
            "on",
            ">pw",
            f"~kvstatus:{namespace}:*",
            "+evalsha",
            "+eval",
            "+script|load",
            "+hget",
            "+hmget",
            "+hset",
            "+pexpire",
            "+hgetall",
            "+pttl",
        )
        with redis.Redis(host=redis_server.host, port=redis_server.port, username="no-ro", password="pw") as client:
            store = StatusStore(client, namespace=namespace, participant="p")
            store.update_status(3, KVPoll.Bootstrapping)
            assert store.get_many([3, 4]) == {3: KVPoll.Bootstrapping, 4: None}
            assert store._sender.evalsha_only
            assert store.room(3).participants["p"].status is KVPoll.Bootstrapping


@pytest.fixture(scope="module")
def own_server() -> Iterator[RedisServer]:
    """A server of this module only: CLIENT PAUSE would hold every other test's server too."""
    with RedisServer() as server:
        yield server


def _paused_writer(server: RedisServer) -> tuple[threading.Thread, list[Any]]:
    """Pause writes for PAUSE_MS, and start a write that the pause holds; returns once the server holds it."""
    done: list[Any] = []
    admin = server.client()
    admin.execute_command("CLIENT", "PAUSE", PAUSE_MS, "WRITE")

    def write() -> None:
        with server.client() as writer:
            writer.client_setname("held-writer")
            done.append(writer.set("kvstatus:ro:written", "1"))

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    for _ in range(400):  # the write is sent and held: CLIENT LIST shows the client blocked on SET
        held = [c for c in admin.client_list() if c.get("name") == "held-writer" and c.get("cmd") == "set"]
        if held and "b" in held[0].get("flags", ""):
            break
        time.sleep(0.005)
    else:
        raise AssertionError(f"the write was not held by the pause: {admin.client_list()}")
    admin.close()
    return thread, done


READS: dict[str, Callable[[Any], Any]] = {
    "get_many": lambda store: store.get_many([1, 2]),
    "get_many of 2 chunks (a pipeline)": lambda store: store.get_many(range(1500)),
    "room": lambda store: store.room(1),
    "room_statuses": lambda store: store.room_statuses([1, 2], ["p", "q"]),
}
EXPECTED = {"get_many": {1: KVPoll.Transferring, 2: None}}


@pytest.mark.real
@pytest.mark.parametrize("mode", ["eval", "functions", "async"])
@pytest.mark.parametrize("read", sorted(READS))
def test_a_first_read_answers_during_client_pause_write(own_server: RedisServer, read: str, mode: str) -> None:
    """SCRIPT FLUSH, CLIENT PAUSE WRITE, then a store's first read: its reply comes while the pause still holds
    a write sent before it (EVALSHA of an unknown script used to wait out the whole pause)."""
    namespace = fresh_namespace("pause")
    scripts_mode = "functions" if mode == "functions" else "eval"
    with own_server.client() as admin:
        load_functions(admin)
        StatusStore(admin, namespace=namespace, participant="p").update_status(1, KVPoll.Transferring)
        admin.script_flush()
    if mode == "async":

        async def first_read() -> Any:
            client = redis.asyncio.Redis(host=own_server.host, port=own_server.port)
            store = AsyncStatusStore(client, namespace=namespace, participant="p", scripts=scripts_mode)
            try:
                return await READS[read](store)
            finally:
                await client.aclose()

        async def run() -> tuple[Any, bool, threading.Thread]:
            writer, done = _paused_writer(own_server)
            result = await first_read()
            return result, bool(done), writer

        result, written, writer = asyncio.run(run())
    else:
        with own_server.client() as client:
            store = StatusStore(client, namespace=namespace, participant="p", scripts=scripts_mode)
            writer, done = _paused_writer(own_server)
            result = READS[read](store)
            written = bool(done)
    assert not written, "the read returned only after the pause ended"
    writer.join(timeout=PAUSE_MS / 1000 + 10)
    if read == "get_many":
        assert result == EXPECTED["get_many"]
    elif read == "room":
        assert result.participants["p"].status is KVPoll.Transferring
    elif read == "room_statuses":
        assert result[1].missing == ("q",) and result[2].missing == ("p", "q")
    with own_server.client() as admin:
        if mode != "functions":  # EVAL_RO cached the script: the next read is one EVALSHA_RO
            names = {"get_many": scripts.GET_MANY, "room": scripts.ROOM, "room_statuses": scripts.ROOM_STATUSES}
            script = names.get(read.split(" ")[0], scripts.GET_MANY)
            assert admin.script_exists(script.sha) == [True]
