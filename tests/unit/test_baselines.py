"""The demo's baselines (kvstatus.demo.baselines), alone on in-process fakeredis.

Used by one caller at a time, the client-side baseline must give exactly
kvstatus' answers and leave exactly its keys: then the race and history checks
that catch it (tests/torture) catch the missing atomicity, not a bug of the
baseline. The pre-fix baseline differs only where the upstream bug was.
"""

from __future__ import annotations

import random

import fakeredis
import pytest

from kvstatus import KVPoll, Outcome, Policy, StatusStore
from kvstatus.demo.baselines import BASELINES, ClientSideStore, PreFixStore
from kvstatus.demo.workload import make_store

UNTOUCHED_MS = 300_000
"""Every key's TTL is set to this (below the stores' 600 s) before each call: a key whose TTL is higher
afterwards was refreshed by it (a write never shortens a TTL)."""


def _entries(client: fakeredis.FakeRedis, namespace: str) -> dict[str, tuple[dict[bytes, bytes], str]]:
    """Each key of ``namespace`` (namespace cut off): its fields and its TTL: "none", "refreshed" or "untouched"."""
    found = {}
    for key in client.scan_iter(match=f"kvstatus:{namespace}:*"):
        if key.endswith(b":t"):
            continue  # clear()'s tombstones are kvstatus' own (tests/core/test_tombstones.py); the baselines have none
        pttl = client.pttl(key)
        ttl = "none" if pttl < 0 else "untouched" if pttl <= UNTOUCHED_MS else "refreshed"
        fields = client.hgetall(key)
        if b"room:fate" in fields:  # the room's first failure: its time is each writer's own clock
            fields[b"room:fate"] = b"<ms>:" + fields[b"room:fate"].split(b":", 1)[1]
        found[key.decode().split(":", 2)[2]] = (fields, ttl)
    return found


@pytest.mark.parametrize("policy", list(Policy))
def test_client_side_alone_answers_and_writes_as_kvstatus(policy: Policy) -> None:
    client = fakeredis.FakeRedis()
    rng = random.Random(7)
    stores = {}
    for participant in ("prefill-0", "decode-0"):
        stores[participant] = (
            StatusStore(client, namespace="kv", participant=participant, policy=policy),
            ClientSideStore(client, "cs", participant=participant, policy=policy),
        )
    for step in range(300):
        for key in client.scan_iter(match="kvstatus:*"):
            client.pexpire(key, UNTOUCHED_MS)
        kv, cs = stores[rng.choice(list(stores))]
        room = rng.randrange(4)
        kind = rng.choice(["update", "update", "update", "many", "clear", "fail", "get"])
        if kind == "update":
            status = rng.choice(list(KVPoll))
            assert cs.update_status(room, status) == kv.update_status(room, status), (step, room, status)
        elif kind == "many":
            updates = {r: rng.choice(list(KVPoll)) for r in rng.sample(range(4), 2)}
            assert cs.update_many(updates) == kv.update_many(updates), (step, updates)
        elif kind == "clear":
            assert cs.clear(room) == kv.clear(room), (step, room)
        elif kind == "fail":
            reason = f"reason-{step}"
            assert cs.record_failure(room, reason) == kv.record_failure(room, reason), (step, room)
        else:
            assert cs.get(room) == kv.get(room), (step, room)
        assert _entries(client, "cs") == _entries(client, "kv"), step
    assert _entries(client, "kv")  # the run ended with something to compare


def test_pre_fix_resurrects_a_cleared_room_without_ttl() -> None:
    client = fakeredis.FakeRedis()
    store = PreFixStore(StatusStore(client, namespace="pf", participant="decode-0"))
    assert store.update_status(5, KVPoll.Bootstrapping) == (Outcome.CREATED, KVPoll.Bootstrapping)
    assert store.update_status(5, KVPoll.Failed) == (Outcome.FAILED, KVPoll.Failed)
    assert store.clear(5) is True
    assert store.update_status(5, KVPoll.Failed) == (Outcome.CREATED, KVPoll.Failed)  # the upstream bug
    assert store.get(5) is KVPoll.Failed
    assert client.pttl("kvstatus:pf:{5}") == -1  # and the resurrected room never expires
    assert store.update_many({6: KVPoll.Failed, 7: KVPoll.Transferring}) == {
        6: (Outcome.CREATED, KVPoll.Failed),
        7: (Outcome.CREATED, KVPoll.Transferring),
    }


def test_make_store_builds_each_implementation_and_names_the_choices() -> None:
    client = fakeredis.FakeRedis()
    made = {
        name: make_store(name, client, "ns", participant="p", ttl=5, race_window=0.1)
        for name in ("kvstatus", *BASELINES)
    }
    assert [type(s) for s in made.values()] == [StatusStore, ClientSideStore, PreFixStore]
    assert all(s.participant == "p" for s in made.values())
    with pytest.raises(ValueError, match="unknown implementation 'naive'.*client-side"):
        make_store("naive", client, "ns")
