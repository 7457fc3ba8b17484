"""Issue 9 items 6-8: what one batch may hold, whose TTL a room keeps, and which strings may reach Redis."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import fakeredis
import pytest

from kvstatus import InvalidArgumentError, KVPoll, Outcome, StatusStore
from kvstatus.operations import StoreCore
from tests.helpers.backends import RedisUnderTest
from tests.helpers.cli import assert_clean_failure, invoke

# -- item 6: a room twice in one batch ------------------------------------------------------------------------------


class PairsMapping(Mapping):
    """A Mapping over a list of pairs: iterating it yields a room once per pair, so a room can come twice."""

    def __init__(self, pairs: list[tuple[Any, Any]]) -> None:
        self._pairs = pairs

    def __getitem__(self, room: Any) -> Any:
        return [status for r, status in self._pairs if r == room][-1]

    def __iter__(self) -> Iterator[Any]:
        return (room for room, _ in self._pairs)

    def __len__(self) -> int:
        return len(self._pairs)

    def items(self):  # type: ignore[override]  # in order, as a batch a caller built would be applied
        return list(self._pairs)


class IdentityRoom(int):
    """An int whose hash and equality are by identity: two equal rooms are two keys of a plain dict."""

    __hash__ = object.__hash__

    def __eq__(self, other: object) -> bool:
        return self is other


def test_a_room_twice_in_update_many_is_refused_before_anything_is_sent(backend: RedisUnderTest) -> None:
    store = backend.store(participant="p0")
    store.update_status(52, KVPoll.Bootstrapping)
    batch = PairsMapping([(52, KVPoll.WaitingForInput), (51, KVPoll.Transferring), (51, KVPoll.Bootstrapping)])
    with pytest.raises(InvalidArgumentError, match="room 51 .*twice"):
        store.update_many(batch)
    assert store.get_many([51, 52]) == {51: None, 52: KVPoll.Bootstrapping}  # nothing of the batch was applied


def test_equal_rooms_that_a_dict_holds_as_two_keys_are_refused(backend: RedisUnderTest) -> None:
    store = backend.store()
    batch = {IdentityRoom(51): KVPoll.Transferring, IdentityRoom(51): KVPoll.Bootstrapping}
    assert len(batch) == 2
    with pytest.raises(InvalidArgumentError, match="room 51 .*twice"):
        store.update_many(batch)
    assert store.get(51) is None


def test_a_mapping_whose_values_disagree_with_its_iteration_is_read_pair_by_pair() -> None:
    class Reordered(dict):
        def __iter__(self) -> Iterator[Any]:
            return reversed(list(super().__iter__()))

    store = StatusStore(fakeredis.FakeRedis(), namespace="ns")
    results = store.update_many(Reordered({1: KVPoll.Bootstrapping, 2: KVPoll.Success}))
    assert {room: r.status for room, r in results.items()} == {1: KVPoll.Bootstrapping, 2: KVPoll.Success}
    assert store.get_many([1, 2]) == {1: KVPoll.Bootstrapping, 2: KVPoll.Success}


def test_a_room_twice_in_get_many_is_answered_once(backend: RedisUnderTest) -> None:
    store = backend.store()
    store.update_status(7, KVPoll.WaitingForInput)
    got = store.get_many([7, 8, 7, 8, 9])
    assert list(got) == [7, 8, 9]  # one entry per distinct room, in the order of first appearance
    assert got == {7: KVPoll.WaitingForInput, 8: None, 9: None}


def test_a_plain_dict_batch_pays_no_duplicate_check() -> None:
    """The hot path (a dict of plain ints) cannot hold a room twice, so it is not checked (benchmarks/ measure it)."""
    core = StoreCore(namespace="ns")
    request = core.update_many({r: KVPoll.Bootstrapping for r in range(3)})
    assert request.calls[0].args[3:6] == ("kvstatus:ns:{0}", "kvstatus:ns:{1}", "kvstatus:ns:{2}")


# -- item 7: one TTL per room key; a write never shortens it ---------------------------------------------------------


def test_a_short_ttl_writer_never_shortens_a_longer_ttl(backend: RedisUnderTest) -> None:
    long = backend.store(participant="prefill-0", ttl=3600)
    short = backend.store(participant="decode-0", ttl=2)
    long.update_status(1, KVPoll.Bootstrapping)
    short.update_status(1, KVPoll.Bootstrapping)  # CREATED for decode-0 on a key that has a TTL
    short.update_many({1: KVPoll.WaitingForInput, 2: KVPoll.Bootstrapping})  # ADVANCED
    short.update_status(1, KVPoll.WaitingForInput)  # UNCHANGED touch
    short.update_status(1, KVPoll.Failed)
    short.record_failure(1, "peer lost")
    assert long.room(1).ttl_ms > 3_500_000
    assert 0 < short.room(2).ttl_ms <= 2000  # a room of its own gets its own TTL


def test_a_longer_ttl_extends_and_the_same_ttl_refreshes(backend: RedisUnderTest) -> None:
    short = backend.store(participant="decode-0", ttl=2)
    long = backend.store(participant="prefill-0", ttl=3600)
    short.update_status(1, KVPoll.Bootstrapping)
    assert 0 < short.room(1).ttl_ms <= 2000
    long.update_status(1, KVPoll.Bootstrapping)
    assert long.room(1).ttl_ms > 3_500_000
    backend.raw.pexpire(long.schema.room_key(1), 1000)  # time has passed: 1 s left
    long.update_status(1, KVPoll.Bootstrapping)  # UNCHANGED touch refreshes it
    assert long.room(1).ttl_ms > 3_500_000


def test_a_room_key_without_ttl_gets_one_from_every_script(backend: RedisUnderTest) -> None:
    store = backend.store(participant="p0", ttl=60)
    key = store.schema.room_key(5)
    for write in (
        lambda: store.update_status(5, KVPoll.Bootstrapping),
        lambda: store.update_many({5: KVPoll.Transferring}),
        lambda: store.update_status(5, KVPoll.Transferring),
        lambda: store.update_status(5, KVPoll.Failed),
        lambda: store.record_failure(5, "lost"),
    ):
        if backend.raw.exists(key):
            backend.raw.persist(key)  # e.g. left by an admin's PERSIST; kvstatus never leaves a key without TTL
        else:
            backend.raw.hset(key, "other", "1")
        write()
        assert 0 < backend.raw.pttl(key) <= 60_000


# -- item 8: strings that cannot be encoded ----------------------------------------------------------------------------


@pytest.mark.parametrize("reason", ["bad \udc80", "bad \udcff\udcfe", "\ud800"])
def test_a_reason_that_is_no_utf8_is_refused_before_anything_is_sent(backend: RedisUnderTest, reason: str) -> None:
    store = backend.store(participant="p0")
    store.update_status(1, KVPoll.Failed)  # no entry: IGNORED_MISSING
    store.update_status(1, KVPoll.Transferring)
    before = backend.raw.hgetall(store.schema.room_key(1))
    with pytest.raises(InvalidArgumentError, match="reason .*UTF-8"):
        store.record_failure(1, reason)
    assert backend.raw.hgetall(store.schema.room_key(1)) == before
    assert store.record_failure(1, "lost ✓") is True  # valid text, non-ASCII included, still works
    assert store.room(1).participants["p0"].reason == "lost ✓"


def test_cli_set_refuses_a_reason_that_is_no_utf8_before_writing_anything() -> None:
    server = fakeredis.FakeServer()
    result = invoke(
        lambda url: fakeredis.FakeRedis(server=server),
        "--namespace",
        "ns",
        "set",
        "1",
        "failed",
        "--reason",
        "bad \udcff\udcfe",
    )  # what click passes for the bytes b"bad \xff\xfe"
    assert_clean_failure(result.output, result.exit_code, 2, "reason", "UTF-8")
    assert fakeredis.FakeRedis(server=server).keys("*") == []


@pytest.mark.real
def test_cli_set_with_invalid_utf8_bytes_in_argv_exits_2_and_writes_nothing(redis_server: Any) -> None:
    import subprocess
    import sys

    with redis_server.client() as client:
        client.delete("kvstatus:bytes-ns:{1}")
        client.hset("kvstatus:bytes-ns:{1}", "default", "3")
        client.pexpire("kvstatus:bytes-ns:{1}", 60_000)
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "kvstatus.cli",
                "--url",
                redis_server.url,
                "--namespace",
                "bytes-ns",
                "set",
                "1",
                "failed",
                "--reason",
                b"bad \xff\xfe",
            ],
            capture_output=True,
        )
        output = (proc.stdout + proc.stderr).decode("utf-8", "replace")
        assert_clean_failure(output, proc.returncode, 2, "reason", "UTF-8")
        assert client.hgetall("kvstatus:bytes-ns:{1}") == {b"default": b"3"}  # not Failed, no reason


def test_outcome_of_a_valid_reason_is_unchanged() -> None:
    store = StatusStore(fakeredis.FakeRedis(), namespace="ns")
    assert store.update_status(3, KVPoll.Bootstrapping).outcome is Outcome.CREATED
    assert store.record_failure(3, "x" * 10) is True


# The class of item 8: every other string that reaches Redis (names are checked by kvstatus.keys.validate_name).


@pytest.mark.parametrize(
    "url",
    [
        "redis://u:pa\udcffss@localhost:6379/0",  # undecodable bytes in argv or the environment
        "redis://u:pa%FFss@localhost:6379/0",  # percent-encoded bytes that are no UTF-8
        "rediss://localhost:6379/0?ssl_ca_certs=/etc/a\udcffb.pem",
        "redis+sentinel://localhost:26379/svc%FF",
    ],
)
def test_a_url_string_that_redis_cannot_be_sent_is_refused_when_parsed(url: str) -> None:
    from kvstatus.url import parse_url

    with pytest.raises(InvalidArgumentError) as info:
        parse_url(url)
    assert "ss@" not in str(info.value)  # the password stays masked
    str(info.value).encode("utf-8")  # printable


def test_cli_refuses_a_url_with_bytes_that_are_no_utf8_with_exit_2() -> None:
    import subprocess
    import sys

    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvstatus.cli",
            "--url",
            b"redis://u:s3cr\xffet@127.0.0.1:1/0",
            "--namespace",
            "ns",
            "get",
            "1",
        ],
        capture_output=True,
    )
    output = (proc.stdout + proc.stderr).decode("utf-8", "replace")
    assert_clean_failure(output, proc.returncode, 2, "UTF-8", secrets=("s3cr",))


def test_cli_clear_of_a_room_named_twice_reports_that_it_was_cleared() -> None:
    server = fakeredis.FakeServer()
    StatusStore(fakeredis.FakeRedis(server=server), namespace="ns").update_status(5, KVPoll.Bootstrapping)
    result = invoke(lambda url: fakeredis.FakeRedis(server=server), "--namespace", "ns", "clear", "5", "5")
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == ["room 5 default: cleared"]
