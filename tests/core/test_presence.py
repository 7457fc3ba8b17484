"""Presence (AsyncPresence in kvstatus/_async/leases.py, judged by kvstatus/peerwatch.py): a dead process fails
its rooms for every peer at once, never a paused one, a reconnected one, or one behind a restarted server.

The background does the work here (no look is called by hand); waits are bounded polls, never timed asserts.
tests/sglang/test_real_peer_death.py and `kvstatus demo --faults` SIGKILL real processes.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import time
from typing import Any, Callable

import pytest

from kvstatus import KVPoll, StatusStore
from kvstatus.admin.acl import acl_rules
from kvstatus.leasestate import died_reason
from kvstatus.model import Stage
from kvstatus.replies import subscriber_counts
from tests.conftest import BACKENDS
from tests.helpers.backends import RedisUnderTest, fresh_namespace

B, W, F = KVPoll.Bootstrapping, KVPoll.WaitingForInput, KVPoll.Failed
ROOMS = [11, 2**40 + 3, 987_654_321_012]
# Generous: a loaded 2-core box may starve the keepers' threads for seconds; the budget is measured elsewhere.
BOUND = 60.0


def _until(condition: Callable[[], bool], what: str, bound: float = BOUND, backend: Any = None) -> None:
    """Poll ``condition``; an async backend's loop runs meanwhile (its keepers are tasks on it)."""
    ends = time.monotonic() + bound
    while not condition():
        if time.monotonic() > ends:
            raise AssertionError(f"not within {bound:g} s: {what}")
        if backend is not None and backend.asynchronous:
            backend._runner.run_until_complete(asyncio.sleep(0.02))
        else:
            time.sleep(0.02)


def _keeper(backend: RedisUnderTest, store: Any) -> Any:
    return store._store._keeper if backend.asynchronous else store._keeper


def _run(backend: RedisUnderTest, result: Any) -> Any:
    return backend._runner.run_until_complete(result) if backend.asynchronous else result


def _seen(backend: RedisUnderTest, watcher: Any, name: str) -> bool:
    peer = _keeper(backend, watcher).watch._peers.get(name)
    return peer is not None and peer.seen


def _crash(backend: RedisUnderTest, store: Any) -> None:
    """What a SIGKILL does to a store: its keeper stops without a release, and Redis drops its connections."""
    keeper = _keeper(backend, store)
    _run(backend, keeper._background.stop())
    _run(backend, keeper.presence.drop())


# Presence is a real server's behaviour (fakeredis keeps a closed async connection's subscriptions): the
# conftest's backends but fakeredis, by indirect parametrization.
REAL_BACKENDS = [p for p in BACKENDS if not isinstance(p, str)]
real_backends = pytest.mark.parametrize("backend", REAL_BACKENDS, indirect=True)


def _prefill_dies_in_every_room(backend: RedisUnderTest) -> Any:
    """prefill-0 and decode-0 (30 s leases) open ROOMS; once the decode saw the prefill's presence, the prefill
    crashes; returns the decode, after it read Failed in every room."""
    decode = backend.store(participant="decode-0", lease_ttl=30)
    prefill = backend.store(participant="prefill-0", lease_ttl=30)
    for room in ROOMS:
        prefill.update_status(room, B)
        decode.update_status(room, W)
    _until(lambda: _seen(backend, decode, "prefill-0"), "the decode saw the prefill's presence", backend=backend)
    _crash(backend, prefill)
    _until(
        lambda: all(decode.get(room) is F for room in ROOMS), "the decode read Failed in every room", backend=backend
    )
    return decode


@real_backends
def test_a_dead_peer_fails_its_open_entries_without_waiting_for_its_lease(backend: RedisUnderTest) -> None:
    decode = _prefill_dies_in_every_room(backend)
    for room in ROOMS:
        failure = decode.failure(room)
        assert failure.origin == "prefill-0" and failure.stage is Stage.LEASE_LOST
        assert failure.reason == died_reason("prefill-0")
    assert backend.raw.hget(f"kvstatus:{backend.namespace}:lease:prefill-0", "state") == b"held"  # not its lease
    # Watched on: a room the decode opens later, where the dead peer has an entry, fails too.
    later = 31_337
    backend.raw.hset(f"kvstatus:{backend.namespace}:{{{later}}}", "prefill-0", "1")
    decode.update_status(later, B)
    _until(lambda: decode.get(later) is F, "a later room of the dead peer failed", backend=backend)


@real_backends
def test_a_peer_whose_connection_was_dropped_subscribes_again_and_fails_nothing(backend: RedisUnderTest) -> None:
    decode = backend.store(participant="decode-0", lease_ttl=30)
    prefill = backend.store(participant="prefill-0", lease_ttl=30)
    prefill.update_status(ROOMS[0], B)
    decode.update_status(ROOMS[0], W)
    _until(lambda: _seen(backend, decode, "prefill-0"), "the decode saw the prefill's presence", backend=backend)
    presence = _keeper(backend, prefill).presence
    generation = presence.generation
    _run(backend, presence.drop())  # the keeper alone notices and subscribes again
    _until(lambda: presence.generation > generation, "the prefill subscribed again", backend=backend)
    _until(lambda: _seen(backend, decode, "prefill-0"), "the decode saw the prefill again", backend=backend)
    assert decode.get(ROOMS[0]) is W and decode.failure(ROOMS[0]) is None


@real_backends
def test_a_string_at_the_lease_index_leaves_the_presence_watch_on(
    backend: RedisUnderTest, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 36, Medium 4: a tenant's string at ``<ns>:leases`` turned the peer watch off (every look failed: no
    peer learned, no death seen). The watch now learns its peers from their presence channels, fails a dead
    peer's rooms as before, and warns once, naming the key."""
    index = f"kvstatus:{backend.namespace}:leases"
    backend.raw.set(index, "junk")  # before any store: the watch never read a mark
    caplog.set_level(logging.WARNING, logger="kvstatus.leases")
    decode = _prefill_dies_in_every_room(backend)
    assert decode.failure(ROOMS[0]).reason == died_reason("prefill-0")
    warned = [r.getMessage() for r in caplog.records if "decode-0" in r.getMessage() and index in r.getMessage()]
    assert len(warned) == 1 and "could not be used" in warned[0], warned
    assert backend.raw.get(index) == b"junk"  # the tenant's key is left as it is


@real_backends
def test_a_released_lease_takes_its_presence_with_it(backend: RedisUnderTest) -> None:
    store = backend.store(participant="prefill-0", lease_ttl=30)
    store.update_status(ROOMS[0], B)
    channel = f"kvstatus:{backend.namespace}:presence:{{{backend.namespace}}}:prefill-0"
    command = ("PUBSUB", "SHARDNUMSUB" if backend.name.startswith("cluster") else "NUMSUB", channel)

    def count() -> int:
        # A cluster's node is asked through its own client: redis-py 8.2's cluster merge of SHARDNUMSUB raises
        # (kvstatus' own clients replace it, kvstatus.connection).
        if backend.name.startswith("cluster"):
            reply = backend.raw.get_node_from_key(channel).redis_connection.execute_command(*command)
        else:
            reply = backend.raw.execute_command(*command)
        return subscriber_counts(reply).get(channel, 0)

    _until(lambda: count() == 1, "the holder's presence is counted", backend=backend)
    store.close()
    _until(lambda: count() == 0, "the presence went with the release", backend=backend)


# ---------------------------------------------------------------- real processes on a real server

VICTIM = """
import sys, time
from kvstatus import StatusStore, KVPoll
store = StatusStore.from_url(sys.argv[1], namespace=sys.argv[2], participant="prefill-0", lease_ttl=10)
for room in sys.argv[3:]:
    store.update_status(int(room), KVPoll.Bootstrapping)
print("ready", flush=True)
time.sleep(3600)
"""


@pytest.mark.real
@pytest.mark.slow
def test_a_paused_a_disconnected_then_a_killed_process(redis_server: Any) -> None:
    """SIGSTOP (5 s, half the lease) and CLIENT KILL of every client fail nothing; SIGKILL then fails the room,
    naming the dead participant (the budget, p99 <= 1.5 s, is benchmarks/presence.py's)."""
    url, namespace = redis_server.url, fresh_namespace()
    decode = StatusStore.from_url(url, namespace=namespace, participant="decode-0", lease_ttl=10)
    victim = subprocess.Popen(
        [sys.executable, "-c", VICTIM, url, namespace, str(ROOMS[0])],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    try:
        assert victim.stdout is not None and victim.stdout.readline().strip() == "ready"
        decode.update_status(ROOMS[0], W)
        watch = decode._keeper.watch  # type: ignore[union-attr]
        _until(lambda: "prefill-0" in watch._peers and watch._peers["prefill-0"].seen, "the victim's presence seen")

        def never_failed(seconds: float) -> None:
            ends = time.monotonic() + seconds
            while time.monotonic() < ends:
                assert decode.get(ROOMS[0]) is W, decode.room(ROOMS[0])
                time.sleep(0.05)

        victim.send_signal(signal.SIGSTOP)
        never_failed(5.0)
        victim.send_signal(signal.SIGCONT)
        admin = redis_server.client()
        admin.client_kill_filter(_type="pubsub")
        admin.client_kill_filter(_type="normal")
        never_failed(3.0)
        _until(lambda: watch._peers["prefill-0"].seen, "the victim's presence seen again")
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        _until(lambda: decode.get(ROOMS[0]) is F, "the room failed after the SIGKILL", bound=9.0)  # < the lease
        assert decode.failure(ROOMS[0]).reason == died_reason("prefill-0")
    finally:
        victim.kill()
        victim.wait()
        decode.close()


@pytest.mark.real
def test_the_worker_recipe_grants_presence_and_no_publish(redis_server: Any) -> None:
    namespace = fresh_namespace()
    admin = redis_server.client()
    admin.execute_command("ACL", "SETUSER", "presence-w", *acl_rules(namespace, password="pw-pr", scripts="eval"))
    url = f"redis://presence-w:pw-pr@{redis_server.host}:{redis_server.port}/0"
    store = StatusStore.from_url(url, namespace=namespace, participant="prefill-0", lease_ttl=10)
    try:
        store.update_status(ROOMS[0], B)
        keeper = store._keeper
        assert keeper is not None and keeper.presence.refused is None
        _until(lambda: keeper.presence.subscribed, "the worker user subscribed")
        user = redis_server.client(username="presence-w", password="pw-pr")
        with pytest.raises(Exception, match="(?i)no permissions"):
            user.publish(keeper.presence.channel, "junk")  # nobody can fill the holder's buffer
        with pytest.raises(Exception, match="(?i)no permissions"):
            user.execute_command("SUBSCRIBE", "kvstatus:other-ns:presence:{other-ns}:prefill-0")
    finally:
        store.close()
