"""What the store does with values a tenant or a buggy writer put into Redis (issue 36): never a non-kvstatus
exception, never a participant disabled for good, and the write side keeps the Python API's bounds."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pytest

from kvstatus import CorruptedValueError, InvalidArgumentError, KVPoll, Outcome, scripts
from kvstatus.keys import KeySchema
from kvstatus.replies import MAX_TIME_MS, parse_failure
from kvstatus.requests import Request, script_call
from tests.helpers.backends import RedisUnderTest

B, W, T, S, F = KVPoll.Bootstrapping, KVPoll.WaitingForInput, KVPoll.Transferring, KVPoll.Success, KVPoll.Failed


@pytest.mark.parametrize("forged", ["999999999999999", "999999999999998", "1e300", "inf", "-5", " 7", "x"])
def test_a_forged_lease_epoch_does_not_disable_the_participant(sync_backend: RedisUnderTest, forged: str) -> None:
    """HSET <ns>:lease:decode-9 epoch 999999999999999 made every later acquire take a 16-digit epoch, which
    update.lua refuses (InvalidArgumentError into the engine under the plugin), for good."""
    schema = KeySchema(sync_backend.namespace)
    sync_backend.raw.hset(schema.lease_key("decode-9"), "epoch", forged)
    for round_ in range(2):  # a restart after the first incarnation: its epoch must be one update.lua takes too
        store = sync_backend.store(participant="decode-9", lease_ttl=3)
        assert store.update_status(10 + round_, B).outcome is Outcome.CREATED, (forged, round_)
        assert store.update_status(10 + round_, W).outcome is Outcome.ADVANCED
        store.close()


@pytest.mark.parametrize(
    "fate",
    ["99999999999999999999:cancelled:x:y", "253402300800000:cancelled:x:y", "1:bogus:x:y", "1:cancelled::y"],
)
def test_a_malformed_first_failure_is_a_corrupted_value_error_on_every_read_path(
    sync_backend: RedisUnderTest, fate: str
) -> None:
    """A fate "99999999999999999999:cancelled:..." raised OSError into the engine (datetime.fromtimestamp); the
    Lua read (get_many) took records the Python read refused. Both now refuse the same, naming the key."""
    store = sync_backend.store(participant="p")
    store.update_status(5, B)
    key = KeySchema(sync_backend.namespace).room_key(5)
    sync_backend.raw.hset(key, "room:fate", fate)
    for read in (store.get, store.check_status, store.room, store.failure, lambda room: store.get_many([room])):
        with pytest.raises(CorruptedValueError, match=rf"key {key.replace('{', '[{]')} field room:fate holds"):
            read(5)


def test_every_failure_time_the_parser_takes_can_be_shown() -> None:
    record = parse_failure(f"{MAX_TIME_MS}:cancelled:router-1:late", "k", "room:fate")
    assert datetime.fromtimestamp(record.at, timezone.utc).year == 9999
    with pytest.raises(CorruptedValueError):
        parse_failure(f"{MAX_TIME_MS + 1}:cancelled:router-1:late", "k", "room:fate")


def test_a_string_at_the_lease_index_does_not_fail_a_lease_holders_writes(sync_backend: RedisUnderTest) -> None:
    schema = KeySchema(sync_backend.namespace)
    sync_backend.raw.set(schema.lease_index_key, "junk")
    store = sync_backend.store(participant="prefill-0", lease_ttl=3)
    assert store.update_status(1, B).outcome is Outcome.CREATED
    assert store.update_status(1, W).outcome is Outcome.ADVANCED
    store.close()


@pytest.mark.parametrize(
    "junk", ["1@5 2+3 3+2", "1@" + "9" * 5000, "1@1 2+1000000000000000", "1@1 " + "2+1 " * 300_000 + "2+1"]
)
def test_update_starts_a_new_timeline_over_one_python_rejects(sync_backend: RedisUnderTest, junk: str) -> None:
    """update.lua appended to timelines the Python parser rejects (steps that go back, 5000-digit times, 1 MiB),
    after which room(), get and ls skipped the room's statuses whole."""
    key = KeySchema(sync_backend.namespace).room_key(8)
    store = sync_backend.store(participant="p", timeline=True)
    store.update_status(8, B)
    sync_backend.raw.hset(key, "t:p", junk)
    assert store.update_status(8, T).outcome is Outcome.ADVANCED
    stored = sync_backend.raw.hget(key, "t:p").decode()
    assert stored.startswith("3@") and " " not in stored, stored[:60]
    view = store.room(8)
    assert view.participants["p"].status is T and [s.status for s in view.timelines["p"]] == [T]


def _script(store: Any, script: Any, keys: list[str], args: tuple[Any, ...]) -> Any:
    return store._send(Request([script_call(script, keys, args)], lambda replies: replies[0]))


@pytest.mark.parametrize("reason", ["x" * (4 << 20), "é" * 1025, b"caf\xc3", b"\xff\xfe", b"\xed\xa0\x80"])
def test_the_scripts_refuse_reasons_the_python_api_would_never_send(sync_backend: RedisUnderTest, reason: Any) -> None:
    """The cancel function stored a 4 MiB reason (the Python API cuts at 2048 B) and invalid UTF-8."""
    store = sync_backend.store(participant="p")
    store.update_status(6, B)
    key = KeySchema(sync_backend.namespace).room_key(6)
    before = sync_backend.raw.hgetall(key)
    calls = [
        (scripts.CANCEL, [key], ("60000", "router-1", reason)),
        (scripts.RECORD_FAILURE, [key], ("p", "reason:p", reason, "60000")),
        (scripts.SWEEP, [key], ("p", "reason:p", reason)),
    ]
    for script, keys, args in calls:
        with pytest.raises(InvalidArgumentError, match="at most 2048 bytes"):
            _script(store, script, keys, args)
    assert sync_backend.raw.hgetall(key) == before  # nothing written
    assert store.cancel(6, "é" * 2000).failed == 1  # the API cuts it to 2048 bytes, and the script takes that
    assert len(store.room(6).participants["p"].reason.encode()) <= 2048 + len("cancelled by : ") + 128
