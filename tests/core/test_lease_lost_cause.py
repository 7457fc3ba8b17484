"""Issue 19 item 13: LeaseLostError names the true cause. A lease record the server lost (a restart without
persistence) is not "another store took the name over"; a real takeover still says so."""

from __future__ import annotations

import pytest

from kvstatus import KVPoll, LeaseLostError, StatusStore
from tests.helpers.backends import RedisUnderTest, fresh_namespace
from tests.servers import RedisServer

T = KVPoll.Transferring


def _lease_key(backend: RedisUnderTest, participant: str) -> str:
    return f"kvstatus:{backend.namespace}:lease:{participant}"


def test_a_lost_record_is_not_called_a_takeover(backend: RedisUnderTest) -> None:
    store = backend.store(participant="prefill-0", lease_ttl=3)
    store.update_status(1, T)
    backend.raw.delete(_lease_key(backend, "prefill-0"))  # what a restart without persistence leaves
    with pytest.raises(LeaseLostError) as lost:
        store.acquire_lease()
    text = str(lost.value)
    assert "lease record is gone" in text and "restart without persistence" in text
    assert "took the name over" not in text and "no other store holds the name" in text
    with pytest.raises(LeaseLostError, match="record is gone"):
        store.update_status(1, KVPoll.Success)  # every write says the same


def test_a_takeover_is_still_called_one(backend: RedisUnderTest) -> None:
    old = backend.store(participant="decode-0", lease_ttl=3)
    old.update_status(5, T)
    backend.store(participant="decode-0", lease_ttl=3).acquire_lease()
    with pytest.raises(LeaseLostError) as lost:
        old.acquire_lease()
    assert "took the name over with a new incarnation (a restart" in str(lost.value)
    assert "record is gone" not in str(lost.value)


def test_a_takeover_after_the_record_was_lost_says_both(backend: RedisUnderTest) -> None:
    first = backend.store(participant="decode-1", lease_ttl=3)
    first.acquire_lease()
    second = backend.store(participant="decode-1", lease_ttl=3)
    second.acquire_lease()  # generation 2
    backend.raw.delete(_lease_key(backend, "decode-1"))
    backend.store(participant="decode-1", lease_ttl=3).acquire_lease()  # generation 1 again, another incarnation
    with pytest.raises(LeaseLostError, match="took the name over with a new incarnation after the server lost"):
        second.acquire_lease()


@pytest.mark.real
def test_a_redis_restart_without_persistence_says_the_record_is_gone() -> None:
    """The report's own scenario: a real restart, nothing saved."""
    server = RedisServer(extra_args=["--save", "", "--appendonly", "no"]).start()
    try:
        store = StatusStore.from_url(
            server.url, namespace=fresh_namespace("lease"), participant="prefill-0", lease_ttl=3
        )
        store.update_status(1, T)
        server.restart()
        with pytest.raises(LeaseLostError) as lost:
            for _ in range(3):  # the first call after the restart may meet the closed connection
                try:
                    store.acquire_lease()
                except LeaseLostError:
                    raise
                except Exception:  # noqa: BLE001 - the reconnect, not what this test is about
                    continue
        assert "lease record is gone from Redis" in str(lost.value)
        assert "took the name over" not in str(lost.value)
        store.close()
    finally:
        server.stop()


def test_a_plain_restart_found_by_a_write_is_not_called_a_lost_record(backend: RedisUnderTest) -> None:
    """Issue 36 (Medium 10): the old incarnation learns of a restart under its name from a refused write; nothing
    was lost on the server, and the text does not say so."""
    old = backend.store(participant="prefill-7", lease_ttl=3)
    old.update_status(9, T)
    new = backend.store(participant="prefill-7", lease_ttl=3)  # the restarted process, generation 2
    new.update_status(9, KVPoll.WaitingForInput)
    with pytest.raises(LeaseLostError):  # SupersededError: the entry is the new incarnation's
        old.update_status(9, KVPoll.Success)
    with pytest.raises(LeaseLostError) as lost:
        old.update_status(10, T)
    text = str(lost.value)
    assert "took the name over with a new incarnation" in text and "a restart under the same" in text
    assert "lost this store's lease record" not in text and "record is gone" not in text


def test_a_takeover_under_the_same_generation_is_still_a_takeover(backend: RedisUnderTest) -> None:
    """The server lost the record, and another store's acquire brought the count back to this store's own
    generation: the epoch tells the incarnations apart, so it is a takeover after a lost record."""
    old = backend.store(participant="decode-7", lease_ttl=3)
    old.acquire_lease()  # generation 1
    backend.raw.delete(_lease_key(backend, "decode-7"))
    backend.store(participant="decode-7", lease_ttl=3).acquire_lease()  # generation 1 again, another incarnation
    with pytest.raises(LeaseLostError) as lost:
        old.acquire_lease()
    assert "took the name over with a new incarnation after the server lost this store's lease record" in str(
        lost.value
    )
