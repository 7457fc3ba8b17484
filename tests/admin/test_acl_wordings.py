"""Redis and Valkey word ACL denials differently (issue 35 item 5); kvstatus reads both.

Redis 7.0 refuses a key with "this user has no permissions to access one of the keys used as arguments", Valkey
(and Redis 7.2+) with "No permissions to access a key"; a script's denied call reads "The user executing the script
can't ..." on Redis 7.0 and "ACL failure in script: ..." on Valkey. kvstatus.translate used to match Redis 7.0's
text only, so on Valkey a namespace outside the user's key patterns got a generic message. The table below is held
to the running server's own text (the real test), on whichever family the real tier runs (KVSTATUS_TEST_SERVER).
"""

from __future__ import annotations

from typing import Any, Iterator

import pytest
import redis
from redis import exceptions as rx

from kvstatus import KVPoll, PermissionDeniedError, StatusStore
from kvstatus.admin.acl import acl_rules
from kvstatus.requests import Call
from kvstatus.translate import denies_a_key, translate_error
from tests.helpers.tiers import server_family
from tests.servers import RedisServer

ADMIN = "admin-Wording1"
SECRET = "user-Wording1"

# (family, what is refused) -> the server's reply text, as each server sends it.
WORDINGS = {
    ("redis", "key"): "this user has no permissions to access one of the keys used as arguments",
    ("redis", "command"): "this user has no permissions to run the 'flushall' command",
    ("redis", "script key"): "The user executing the script can't access at least one of the keys mentioned in the "
    "command arguments script: 58f9ce2ca15505f5d97f9e5d167b846bd072cd93, on @user_script:1.",
    ("valkey", "key"): "No permissions to access a key",
    ("valkey", "command"): "User u has no permissions to run the 'flushall' command",
    ("valkey", "script key"): "ACL failure in script: No permissions to access a key script: on @user_script:1.",
}


@pytest.mark.parametrize("family", ["redis", "valkey"])
def test_a_key_denial_is_told_from_a_command_denial_in_both_wordings(family: str) -> None:
    assert denies_a_key(rx.NoPermissionError(WORDINGS[family, "key"]))
    assert denies_a_key(rx.ResponseError(WORDINGS[family, "script key"]))
    assert not denies_a_key(rx.NoPermissionError(WORDINGS[family, "command"]))
    assert denies_a_key(rx.NoPermissionError("No permissions to access the 'ns-b:{1}' key"))  # Redis 7.2's log


@pytest.mark.parametrize("family", ["redis", "valkey"])
def test_a_key_denial_names_the_key_and_its_namespace_in_both_wordings(family: str) -> None:
    calls = {
        Call(("EVALSHA", "0" * 40, 2, "kvstatus:ns-b:{1}", "kvstatus:ns-b:{1}:t")): "key kvstatus:ns-b:{1}",
        Call(("FCALL_RO", "kvstatus_get_many", 1, "pfx:ns-c:{7}")): "key pfx:ns-c:{7}, namespace ns-c",
        Call(("HGETALL", "kvstatus:ns-d:{9}")): "key kvstatus:ns-d:{9}, namespace ns-d",
    }
    for call, named in calls.items():
        error = translate_error(rx.NoPermissionError(WORDINGS[family, "key"]), call)
        assert isinstance(error, PermissionDeniedError) and named in str(error), error
    error = translate_error(rx.NoPermissionError(WORDINGS[family, "command"]), Call(("FLUSHALL",)))
    assert "do not cover" not in str(error), error  # a command denial is no key's


@pytest.mark.parametrize("family", ["redis", "valkey"])
def test_a_scripts_denied_call_is_a_permission_error_in_both_wordings(family: str) -> None:
    call = Call(("EVALSHA", "0" * 40, 1, "kvstatus:ns-b:{1}"))
    error = translate_error(rx.ResponseError(WORDINGS[family, "script key"]), call)
    assert isinstance(error, PermissionDeniedError), error
    reason = WORDINGS[family, "script key"].rsplit(" script:", 1)[0]
    assert str(error).endswith(f"({reason})") and "@user_script" not in str(error), error


def _reply(client: redis.Redis, *command: Any) -> str:
    try:
        client.execute_command(*command)
    except rx.ResponseError as exc:
        return str(exc)
    raise AssertionError(f"{command} was not refused")


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer(password=ADMIN) as started:
        with started.client() as admin:
            admin.execute_command("ACL", "SETUSER", "u", *acl_rules("ns-a", password=SECRET, scripts="eval"))
        yield started


@pytest.mark.real
def test_the_running_server_words_its_denials_as_the_table_says(server: RedisServer) -> None:
    family = server_family().name
    with server.client(username="u", password=SECRET) as client:
        key = _reply(client, "HGET", "kvstatus:ns-b:{1}", "f")
        command = _reply(client, "FLUSHALL")
        # A key the script names itself (not in KEYS, which the server checks before it runs the script).
        script = _reply(client, "EVAL", "return redis.call('hget', 'kvstatus:ns-b:{1}', 'f')", 0)
    assert key == WORDINGS[family, "key"]
    assert command == WORDINGS[family, "command"]
    assert script.rsplit(" script:", 1)[0] == WORDINGS[family, "script key"].rsplit(" script:", 1)[0], script


@pytest.mark.real
def test_another_namespace_is_named_as_a_key_denial(server: RedisServer) -> None:
    """Through the store: the ACL refuses the namespace, and kvstatus says it is the keys, on either server."""
    url = f"redis://u:{SECRET}@{server.host}:{server.port}/0"
    with StatusStore.from_url(url, namespace="ns-b", participant="p0") as store:
        for call in (lambda: store.get(1), lambda: store.update_status(1, KVPoll.Bootstrapping)):
            with pytest.raises(PermissionDeniedError, match="ACL denied") as info:
                call()
            assert denies_a_key(info.value), info.value  # the server's own words, on either server
            assert "do not cover key kvstatus:ns-b:{1}, namespace ns-b)" in str(info.value), info.value
            assert SECRET not in str(info.value)
