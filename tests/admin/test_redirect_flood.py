"""Issue 36 Medium 1, run as an attack: a tenant redirects its own invalidations onto another tenant's near-cache
connection. The ACL grants ``client|tracking`` whole, so it cannot refuse ``REDIRECT <id>``: the attacker finds
the id by probing (REDIRECT answers OK only for a connection that exists), then writes keys of its own namespace
that it tracks with BCAST, and Redis queues one invalidation per key on the victim's connection.

Unbounded by default, the victim's output buffer grows with the flood. The server-wide bound docs/security.md
gives (``client-output-buffer-limit normal``) makes Redis close the victim's connection instead, and the
victim's near cache then drops what it cached and reads Redis again: nothing stale is served, and it caches
again on a new connection. The bound leaves kvstatus' own largest reads alone.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any, Optional

import pytest

from kvstatus import KVPoll, StatusStore
from kvstatus.admin.acl import acl_rules
from kvstatus.admin.functions import load_functions
from kvstatus.admin.reads import iter_rooms
from kvstatus.keys import MAX_REASON_BYTES, KeySchema
from kvstatus.operations import CHUNK_ROOMS
from tests.helpers.resp import resp
from tests.nearcache.helpers import eventually
from tests.servers import RedisServer

pytestmark = pytest.mark.real

ADMIN = "admin-Fl00d"
TENANT = "tenant-Fl00d"
BOUND = "normal 1mb 0 0"
"""The test's bound: 1 MiB, a hard limit (docs/security.md recommends 64mb; a smaller one floods sooner)."""
RECOMMENDED = "normal 64mb 0 0"
"""docs/security.md's bound: above the largest reply kvstatus reads (a chunk of CHUNK_ROOMS rooms at their
largest values, checked below)."""
KEY_PAD = "x" * 900
"""The attacker's key names are long (its own namespace's, so its ACL allows them): each one is about 1 KB of
invalidation on the victim's connection."""


class Attacker:
    """Tenant A's connection in raw RESP: no kvstatus or redis-py code stands between it and Redis."""

    def __init__(self, server: RedisServer) -> None:
        self.sock = socket.create_connection((server.host, server.port), timeout=10)
        assert self.ask("AUTH", "tenant-a", TENANT) == b"+OK\r\n"

    def ask(self, *args: Any) -> bytes:
        self.sock.sendall(resp(*args))
        return self.sock.recv(4096)

    def write_keys(self, first: int, count: int) -> None:
        """Create and delete ``count`` keys of A's own namespace: one invalidation each for every BCAST tracker."""
        batch = b"".join(
            resp("HSET", f"kvstatus:ns-a:{KEY_PAD}{index}", "f", "1")
            + resp("HDEL", f"kvstatus:ns-a:{KEY_PAD}{index}", "f")
            for index in range(first, first + count)
        )
        self.sock.sendall(batch)
        expected, got = count * 2 * len(b":1\r\n"), b""
        while len(got) < expected:
            chunk = self.sock.recv(65536)
            assert chunk, "the attacker's own connection closed"
            got += chunk
        assert got == b":1\r\n" * (count * 2), got[:200]

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def server() -> Iterator[RedisServer]:
    with RedisServer(password=ADMIN) as started:
        with started.client() as admin:
            for user, namespace in (("tenant-a", "ns-a"), ("tenant-b", "ns-b")):
                admin.execute_command("ACL", "SETUSER", user, *acl_rules(namespace, password=TENANT, near_cache=True))
            load_functions(admin)
        yield started


def _victim(server: RedisServer, participant: str = "p0") -> StatusStore:
    url = f"redis://tenant-b:{TENANT}@{server.host}:{server.port}/0"
    return StatusStore.from_url(url, namespace="ns-b", participant=participant, near_cache=True, scripts="functions")


def _clients(server: RedisServer) -> list[dict[str, str]]:
    with server.client() as admin:
        listing = admin.execute_command("CLIENT", "LIST")
    text = listing.decode() if isinstance(listing, bytes) else str(listing)
    return [dict(field.split("=", 1) for field in line.split() if "=" in field) for line in text.splitlines()]


def _invalidation_connection(server: RedisServer) -> str:
    """The id of tenant-b's near-cache invalidation connection: the REDIRECT target of its tracking data connection."""
    targets = {c["redir"] for c in _clients(server) if c.get("user") == "tenant-b" and c.get("redir", "-1") != "-1"}
    assert len(targets) == 1, targets
    return targets.pop()


def _output_buffer(server: RedisServer, client_id: str) -> Optional[int]:
    """Bytes queued in Redis for connection ``client_id`` (``omem``), or None when it is gone."""
    found = [c for c in _clients(server) if c.get("id") == client_id]
    return int(found[0]["omem"]) if found else None


def _flood(server: RedisServer, victim_id: str, until: Any, rounds: int = 60) -> Attacker:
    """Redirect tenant A's invalidations onto ``victim_id`` and write 1,000 keys a round until ``until(omem)``."""
    attacker = Attacker(server)
    assert attacker.ask(
        "CLIENT", "TRACKING", "ON", "REDIRECT", 987654321, "BCAST", "PREFIX", "kvstatus:ns-a:"
    ).startswith(b"-ERR")  # the probe: an id that does not exist is refused...
    reply = attacker.ask("CLIENT", "TRACKING", "ON", "REDIRECT", victim_id, "BCAST", "PREFIX", "kvstatus:ns-a:")
    assert reply == b"+OK\r\n"  # ...and another tenant's connection accepted: the ACL cannot stop it
    for index in range(rounds):
        attacker.write_keys(index * 1000, 1000)
        if until(_output_buffer(server, victim_id)):
            return attacker
    attacker.close()
    raise AssertionError(
        f"{rounds} MB of invalidations did not reach the condition; omem {_output_buffer(server, victim_id)}"
    )


def test_unbounded_the_victims_output_buffer_grows_with_the_flood(server: RedisServer) -> None:
    with _victim(server) as victim:
        victim.update_status(1, KVPoll.Bootstrapping)
        assert victim.get(1) is KVPoll.Bootstrapping  # cached: the near cache's links are up
        victim_id = _invalidation_connection(server)
        attacker = _flood(server, victim_id, lambda omem: omem is not None and omem >= 4 * 1024 * 1024)
        attacker.close()
        omem = _output_buffer(server, victim_id)
        assert omem is not None and omem >= 4 * 1024 * 1024  # Redis holds it for the idle victim, with no limit


def test_the_recommended_bound_closes_the_victim_and_its_near_cache_serves_nothing_stale(server: RedisServer) -> None:
    with server.client() as admin:
        admin.config_set("client-output-buffer-limit", BOUND)
    with _victim(server) as victim:
        victim.update_status(1, KVPoll.Bootstrapping)
        assert victim.get(1) is KVPoll.Bootstrapping and victim.room(1).participants.keys() == {"p0"}
        flushes = victim.near_cache.state.flushes
        victim_id = _invalidation_connection(server)
        attacker = _flood(server, victim_id, lambda omem: omem is None)  # Redis closed it at the bound
        try:
            # Another process's change (a raw client: a store of this process would drop the room locally),
            # which the victim's cache can no longer hear of: its invalidation connection is gone.
            with server.client() as admin:
                admin.hset(KeySchema("ns-b").room_key(1), "p1", int(KVPoll.Transferring))
            # The close reaches the victim's socket when the server frees the connection, which Valkey may do
            # after CLIENT LIST stopped showing it: the victim's reads check its link and see the close, and
            # the cache drops everything it held, this room's stale view included.
            eventually(lambda: victim.get(1) is KVPoll.Bootstrapping and victim.near_cache.state.flushes > flushes)
            assert victim.room(1).participants["p1"].status is KVPoll.Transferring  # read from Redis, not stale
            assert _invalidation_connection(server) != victim_id  # it linked again
            assert victim.get(1) is KVPoll.Bootstrapping
        finally:
            attacker.close()


def test_the_recommended_bound_leaves_kvstatus_largest_reads_alone(server: RedisServer) -> None:
    """A pipelined read of CHUNK_ROOMS rooms (the stores' chunk, twice the tools' default ``--batch``), four
    participants each with a reason of MAX_REASON_BYTES: 8.4 MB of replies in one round trip."""
    with server.client() as admin:
        admin.config_set("client-output-buffer-limit", RECOMMENDED)
    rooms = list(range(1, CHUNK_ROOMS + 1))
    reason = "r" * MAX_REASON_BYTES
    stores = [_victim(server, f"p{index}") for index in range(4)]
    try:
        for store in stores:
            store.update_many({room: KVPoll.Transferring for room in rooms})
            for room in rooms:
                store.record_failure(room, reason)
        with server.client() as admin:
            views = list(iter_rooms(admin, KeySchema("ns-b"), batch=CHUNK_ROOMS))
    finally:
        for store in stores:
            store.close()
    assert sorted(view.room for view in views) == rooms
    assert all(len(view.participants) == 4 for view in views)
    assert all(entry.reason == reason for view in views for entry in view.participants.values())
