"""`kvstatus get A B C` with one room holding junk (issue 36): it printed nothing; now it shows the others and
names the bad key, on a real Redis."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from kvstatus import KVPoll, StatusStore
from tests.helpers.cli import NS, cli
from tests.servers import RedisServer


@pytest.mark.real
def test_get_of_many_rooms_shows_the_readable_ones_and_names_the_junk_one(real_server: RedisServer) -> None:
    client = redis.Redis(host=real_server.host, port=real_server.port)
    client.flushdb()
    store = StatusStore(client, namespace=NS, participant="prefill-0", timeline=True)
    store.update_status(1, KVPoll.Bootstrapping)
    store.update_status(3, KVPoll.Transferring)
    client.hset(store.schema.room_key(2), "prefill-0", "banana")
    client.hset(store.schema.room_key(3), "t:decode-0", "1@5 2+3 3+2")  # a timeline that goes back: left out

    def connect(url: str) -> Any:
        return client

    result = cli(connect, "get", "1", "2", "3")
    assert result.exit_code == 1, result.output
    assert "Bootstrapping" in result.output and "Transferring" in result.output, result.output
    assert f"key {store.schema.room_key(2)} field prefill-0 holds 'banana'" in result.output
    client.close()
