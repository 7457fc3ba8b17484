"""The PP consensus on participant leases: a dead rank fails the room instead of stalling it (fakeredis)."""

from __future__ import annotations

import fakeredis

from kvstatus import KVPoll, StatusStore
from kvstatus.sglang import install
from tests.helpers.backends import fresh_namespace
from tests.sglang.standin import make_manager

ROOM = 4242


def _ranks(lease_ttl: object) -> tuple[list, fakeredis.FakeRedis, str]:
    server = fakeredis.FakeServer()
    namespace = fresh_namespace("sgl")
    managers = [make_manager(pp_rank=r, pp_size=4) for r in range(4)]
    for manager in managers:
        store = StatusStore(
            fakeredis.FakeRedis(server=server), namespace=namespace, policy="strict", lease_ttl=lease_ttl
        )
        install(manager, store)
    return managers, fakeredis.FakeRedis(server=server), namespace


def test_a_rank_that_lost_its_lease_fails_the_pp_consensus() -> None:
    managers, raw, namespace = _ranks(3)
    for manager in managers:
        manager.update_status(ROOM, KVPoll.Bootstrapping)
        manager.update_status(ROOM, KVPoll.Transferring)
    rank0 = managers[0]
    assert rank0.request_status.uses_leases
    assert rank0.check_status_pp_consensus(ROOM) == KVPoll.Transferring
    managers[3].update_status(ROOM, KVPoll.Success)
    raw.hset(f"kvstatus:{namespace}:lease:prefill-tp0-pp2", "deadline", 1)  # rank 2's deadline passed
    assert rank0.check_status_pp_consensus(ROOM) == KVPoll.Failed
    consensus = rank0.request_status.consensus(ROOM)
    assert consensus.reason == "participant prefill-tp0-pp2 lost its lease" and consensus.lost == ("prefill-tp0-pp2",)
    assert rank0.check_status_pp_consensus(ROOM + 1) == KVPoll.Bootstrapping  # no rank has an entry yet
    for manager in managers:  # stop the lease keepers: a later pause of this process would log lost leases
        manager.request_status.close()


def test_without_leases_the_pp_consensus_is_the_upstream_one() -> None:
    managers, raw, namespace = _ranks(None)
    for manager in managers[:3]:
        manager.update_status(ROOM, KVPoll.Bootstrapping)
    assert not managers[0].request_status.uses_leases
    assert managers[0].check_status_pp_consensus(ROOM) == KVPoll.Bootstrapping  # rank 3 has no entry
    managers[3].update_status(ROOM, KVPoll.WaitingForInput)
    assert managers[0].check_status_pp_consensus(ROOM) == KVPoll.Bootstrapping  # the minimum
    for manager in managers:
        manager.request_status.close()
