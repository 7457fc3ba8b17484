"""The benchmarks' floors are the rule they claim to be: a wrong floor makes every ratio against it wrong.

benchmarks/minimal_rule.lua is the seed rule with nothing else; benchmarks/required_checks.lua puts the
checks DESIGN requires of every update script (argument validation, the ACL pre-check) in front of it.
"""

from __future__ import annotations

import itertools
import uuid

import pytest
import redis

from benchmarks.cases import CHECKED_RULE, MINIMAL_RULE
from kvstatus import KVPoll
from kvstatus.rule import apply_rule
from tests.helpers.tiers import server_family
from tests.servers import RedisServer

TTL_MS = "60000"


def _outcomes(client: redis.Redis, source: str, new: KVPoll, current: KVPoll | None) -> list[int]:
    key = f"floor:{{{uuid.uuid4().hex}}}"
    if current is not None:
        client.hset(key, "p", int(current))
    reply = client.eval(source, 1, key, TTL_MS, "p", str(int(new)))
    assert client.pttl(key) > 0 or (current is None and new is KVPoll.Failed)
    return [int(x) for x in reply]


@pytest.mark.real
@pytest.mark.parametrize("source", [MINIMAL_RULE, CHECKED_RULE], ids=["minimal", "checked"])
def test_each_floor_applies_the_seed_rule_to_every_pair(redis_server: RedisServer, source: str) -> None:
    client = redis.Redis.from_url(redis_server.url)
    for current, new in itertools.product([None, *KVPoll], KVPoll):
        expected = apply_rule(current, new)
        after = -1 if expected.status is None else int(expected.status)
        assert _outcomes(client, source, new, current) == [int(expected.outcome), after], (current, new)


@pytest.mark.real
@pytest.mark.parametrize(
    ("args", "named"),
    [
        (("0", "p", "1"), "TTL"),
        (("60000", "", "1"), "field"),
        (("60000", "p", "5"), "0..4"),
        (("60000", "p"), "one status per key"),
    ],
)
def test_the_checked_floor_refuses_bad_arguments_before_any_write(
    redis_server: RedisServer, args: tuple[str, ...], named: str
) -> None:
    client = redis.Redis.from_url(redis_server.url)
    key = f"floor:{{{uuid.uuid4().hex}}}"
    with pytest.raises(redis.ResponseError, match="KVSTATUS_BADARG") as raised:
        client.eval(CHECKED_RULE, 1, key, *args)
    assert named in str(raised.value)
    assert not client.exists(key)


@pytest.mark.real
def test_the_checked_floor_asks_the_acl_before_it_writes(redis_server: RedisServer) -> None:
    admin = redis.Redis.from_url(redis_server.url)
    user, password = f"floor-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    admin.acl_setuser(
        user, enabled=True, passwords=[f"+{password}"], keys=["floor:*"], commands=["+eval", "+hget", "+hset"]
    )
    try:
        limited = redis.Redis(host="127.0.0.1", port=redis_server.port, username=user, password=password)
        key = f"floor:{{{uuid.uuid4().hex}}}"
        with pytest.raises(redis.ResponseError, match="pexpire"):
            limited.eval(CHECKED_RULE, 1, key, TTL_MS, "p", "1")
        assert not admin.exists(key)
        denied = {"redis": "can't run this command", "valkey": "ACL failure in script: .* 'pexpire' command"}
        with pytest.raises(redis.ResponseError, match=denied[server_family().name]):
            limited.eval(MINIMAL_RULE, 1, key, TTL_MS, "p", "1")  # refused at its PEXPIRE
        assert admin.pttl(key) == -1  # what the check prevents: the minimal rule left an entry without a TTL
    finally:
        admin.acl_deluser(user)
