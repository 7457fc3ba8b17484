"""The scripts' path for servers without PEXPIRE's flags (NX / GT / LT, Redis 7+), on a real Redis.

lua/lib/time.lua sets ``EXPIRE_FLAGS`` from ``redis.REDIS_VERSION_NUM`` (Redis 7 and later) and every script
that sets a room's TTL compares with PTTL instead when it is false. No server here lacks the flags, so these
tests run each script with ``EXPIRE_FLAGS`` forced false and hold it to the behaviour the flags give: a write
never shortens a room's TTL, and a cleared room left with nothing but its fence keeps it no longer than the
tombstone. clear.lua once called ``PEXPIRE ... LT`` on every server, which an older one refuses.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator

import pytest

from kvstatus import KVPoll, StatusStore, scripts
from kvstatus.scripts import LuaScript
from tests.helpers.backends import fresh_namespace
from tests.servers import RedisServer

pytestmark = pytest.mark.real

FLAG_LINE = "local EXPIRE_FLAGS = redis.REDIS_VERSION_NUM ~= nil"
TTL_SCRIPTS = ("UPDATE", "RECORD_FAILURE", "CANCEL", "CLEAR")
"""The scripts that set a room's TTL."""


@pytest.fixture(params=[True, False], ids=["flags", "no-flags"])
def expire_flags(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[bool]:
    """Each test runs as written (Redis 7's flags) and with the scripts' flag test forced false."""
    if not request.param:
        for name in TTL_SCRIPTS:
            original: LuaScript = getattr(scripts, name)
            assert FLAG_LINE in original.source, f"{name}: lua/lib/time.lua's flag test changed"
            source = original.source.replace(FLAG_LINE, "local EXPIRE_FLAGS = false")
            sha = hashlib.sha1(source.encode()).hexdigest()
            monkeypatch.setattr(scripts, name, LuaScript(original.name, source, sha, original.read_only))
    yield bool(request.param)


def _store(server: RedisServer, namespace: str, ttl: int, **settings: object) -> StatusStore:
    return StatusStore.from_url(server.url, namespace=namespace, participant="p", ttl=ttl, **settings)  # type: ignore[arg-type]


def test_a_write_never_shortens_a_rooms_ttl(redis_server: RedisServer, expire_flags: bool) -> None:
    namespace = fresh_namespace("oldsrv")
    key = f"kvstatus:{namespace}:{{1}}"
    raw = redis_server.client()
    with _store(redis_server, namespace, 600) as long, _store(redis_server, namespace, 60) as short:
        long.update_status(1, KVPoll.Bootstrapping)
        assert 590_000 < raw.pttl(key) <= 600_000  # created: the TTL is set
        short.update_status(1, KVPoll.Transferring)
        short.record_failure(1, "a reason")
        short.cancel(1, "a router gave up")
        assert 590_000 < raw.pttl(key) <= 600_000  # none of the shorter TTLs shortened it
        raw.persist(key)
        short.update_status(1, KVPoll.Success)
        assert 50_000 < raw.pttl(key) <= 60_000  # a key without a TTL gets one (GT alone would leave it)
        with _store(redis_server, namespace, 900) as longer:
            longer.record_failure(1, "another")
            assert 890_000 < raw.pttl(key) <= 900_000  # a longer TTL extends it


def test_a_cleared_fence_lasts_no_longer_than_the_tombstone(redis_server: RedisServer, expire_flags: bool) -> None:
    namespace = fresh_namespace("oldsrv")
    key = f"kvstatus:{namespace}:{{2}}"
    raw = redis_server.client()
    with _store(redis_server, namespace, 600, lease_ttl=10) as store:
        store.update_status(2, KVPoll.Transferring)
        assert store.clear(2)
        assert raw.hkeys(key) == [b"inc:p"]  # only the fence is left
        assert 50_000 < raw.pttl(key) <= 60_000  # shortened to the tombstone's TTL
        store.update_status(2, KVPoll.Bootstrapping)
        raw.persist(key)
        assert store.clear(2)
        assert 50_000 < raw.pttl(key) <= 60_000  # a key without a TTL gets the tombstone's


def test_every_flagged_pexpire_is_behind_the_flag_test() -> None:
    """The class of the clear.lua defect: a PEXPIRE with NX / GT / LT outside ``if EXPIRE_FLAGS then`` fails on
    a server without the flags. One of each such call's enclosing blocks must open with that test."""
    flagged = re.compile(r'redis\.call\("PEXPIRE",[^)]*,\s*(?:"(?:NX|GT|LT|XX)"|[a-z_]+ and "(?:NX|GT)")')
    for script in scripts.ALL:
        lines = script.source.splitlines()
        for number, line in enumerate(lines):
            if not flagged.search(line):
                continue
            openers, depth = [], len(line) - len(line.lstrip())
            for earlier in reversed(lines[:number]):  # the lines that open each enclosing block, innermost first
                indent = len(earlier) - len(earlier.lstrip())
                if earlier.strip() and indent < depth:
                    openers.append(earlier)
                    depth = indent
            opener = next((o for o in openers if "EXPIRE_FLAGS" in o), "")
            assert "EXPIRE_FLAGS" in opener, f"{script.name}.lua: {line.strip()!r} runs without the flag test"
