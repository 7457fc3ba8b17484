"""``pop``: remove this participant's entry and answer the status it held, in one round trip (issue 17 item 4)."""

from __future__ import annotations

import pytest

from kvstatus import KVPoll, StatusStore
from kvstatus.errors import CorruptedValueError
from tests.helpers.backends import RedisUnderTest
from tests.servers import RedisServer


def test_pop_answers_what_it_removed_and_leaves_a_tombstone(backend: RedisUnderTest) -> None:
    store = backend.store(participant="prefill-0")
    other = store.for_participant("decode-0")
    store.update_status(1, KVPoll.Transferring)
    other.update_status(1, KVPoll.WaitingForInput)
    assert store.pop(1) is KVPoll.Transferring
    assert store.get(1) is None
    assert other.get(1) is KVPoll.WaitingForInput  # only this participant's entry
    view = store.room(1)
    assert view.tombstone is not None and "prefill-0" in view.tombstone.cleared
    assert store.pop(1) is None  # nothing left to remove
    assert store.pop(2) is None  # never written


def test_pop_of_a_corrupted_entry_removes_it_and_says_what_it_held(backend: RedisUnderTest) -> None:
    store = backend.store(participant="p")
    backend.raw.hset(store.schema.room_key(4), "p", "garbage")
    with pytest.raises(CorruptedValueError, match="not a status"):
        store.pop(4)
    assert backend.raw.hget(store.schema.room_key(4), "p") is None


@pytest.mark.real
def test_pop_is_one_round_trip() -> None:
    # Its own server: INFO commandstats counts every client's commands, and other tests' lease keepers run on.
    with RedisServer() as server, StatusStore.from_url(server.url, namespace="pop-rt", participant="p") as store:
        raw = server.client()
        store.update_status(5, KVPoll.Transferring)
        store.pop(6)  # the script is loaded
        raw.config_resetstat()
        assert store.pop(5) is KVPoll.Transferring
        stats = raw.info("commandstats")
        sent = {
            name: v["calls"]
            for name, v in stats.items()
            if name.split("_", 1)[1] in ("evalsha", "eval", "evalsha_ro", "hget", "hmget", "hgetall")
        }
        # One script call: its HMGET of the entry and its stamp, and the HGETALL of what the room has left
        # (lua/clear.lua tidies a room it left without entries), inside.
        assert sent == {"cmdstat_evalsha": 1, "cmdstat_hmget": 1, "cmdstat_hgetall": 1}, sent
