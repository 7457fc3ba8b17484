"""Leases through the SGLang integration: a PP rank that dies fails the room for every rank (fakeredis).

Every manager holds a lease (the plugin's default); each store's peer watch (kvstatus/peerwatch.py) fails a
dead rank's open entries, so rank 0's consensus (upstream's minimum) reads Failed and names the dead rank.
"""

from __future__ import annotations

import logging
from typing import Any

import fakeredis
import pytest

from kvstatus import KVPoll, Outcome, StatusStore
from kvstatus.sglang import install
from kvstatus.sglang.mapping import UNANSWERED_RESULT
from tests.helpers.backends import fresh_namespace
from tests.helpers.clock import hold_background_watch, shift_watch_clock
from tests.sglang.standin import OPENED, make_manager

ROOM = 4242


@pytest.fixture(autouse=True)
def _looks_by_hand(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests call the looks themselves and count what each one failed."""
    hold_background_watch(monkeypatch)


def _ranks(lease_ttl: object) -> tuple[list[Any], fakeredis.FakeRedis, str]:
    server = fakeredis.FakeServer()
    namespace = fresh_namespace("sgl")
    managers = [make_manager(pp_rank=r, pp_size=4) for r in range(4)]
    for manager in managers:
        store = StatusStore(
            fakeredis.FakeRedis(server=server), namespace=namespace, policy="strict", lease_ttl=lease_ttl
        )
        install(manager, store)
    OPENED.extend(managers)
    return managers, fakeredis.FakeRedis(server=server), namespace


@pytest.mark.parametrize("death", ["expired", "released"])
def test_a_rank_that_died_fails_the_pp_consensus(death: str, monkeypatch: pytest.MonkeyPatch) -> None:
    managers, raw, namespace = _ranks(3)
    for manager in managers:
        manager.update_status(ROOM, KVPoll.Bootstrapping)
        manager.update_status(ROOM, KVPoll.Transferring)
    rank0 = managers[0]
    store = rank0.request_status.store
    assert store.look_at_peers() == 0  # every rank alive: nothing failed
    assert rank0.check_status_pp_consensus(ROOM) == KVPoll.Transferring
    managers[3].update_status(ROOM, KVPoll.Success)
    if death == "released":
        managers[2].request_status.store.close()  # a clean exit tells the peers at once
    else:
        managers[2].request_status.store._keeper._background.stop()  # SIGKILL: no more renewals ...
        raw.hset(f"kvstatus:{namespace}:lease:prefill-tp0-pp2", "deadline", 1)  # ... and Redis' clock passed it
        assert store.look_at_peers() == 0  # its mark changed less than a TTL ago: not yet a suspect
        shift_watch_clock(monkeypatch, 3.5)  # one lease TTL later, its mark has not changed
    assert store.look_at_peers() == 1
    assert rank0.check_status_pp_consensus(ROOM) == KVPoll.Failed
    failure = store.failure(ROOM)
    assert failure.origin == "prefill-tp0-pp2" and failure.stage.value == "lease-lost"
    assert failure.reason == "participant prefill-tp0-pp2 lost its lease"
    # Rank 3 had finished its part: its entry is kept (a peer dying after its part is done fails nothing).
    assert raw.hget(f"kvstatus:{namespace}:{{{ROOM}}}", "prefill-tp0-pp3") == b"4"
    assert rank0.check_status_pp_consensus(ROOM + 1) == KVPoll.Bootstrapping  # no rank has an entry yet
    for manager in managers:  # stop the lease keepers: a later pause of this process would log lost leases
        manager.request_status.close()


def test_a_live_rank_is_never_failed(monkeypatch: pytest.MonkeyPatch) -> None:
    managers, raw, namespace = _ranks(3)
    for manager in managers:
        manager.update_status(ROOM, KVPoll.Bootstrapping)
    store = managers[0].request_status.store
    assert store.look_at_peers() == 0
    # A forged or stale mark makes a suspect, but the lease record (Redis' clock) says alive: nothing fails.
    shift_watch_clock(monkeypatch, 3.5)
    assert store.look_at_peers() == 0
    assert managers[0].check_status_pp_consensus(ROOM) == KVPoll.Bootstrapping
    for manager in managers:
        manager.request_status.close()


def test_without_leases_the_pp_consensus_is_the_upstream_one() -> None:
    managers, raw, namespace = _ranks(None)
    for manager in managers[:3]:
        manager.update_status(ROOM, KVPoll.Bootstrapping)
    assert managers[0].request_status.store.lease is None
    assert managers[0].check_status_pp_consensus(ROOM) == KVPoll.Bootstrapping  # rank 3 has no entry
    managers[3].update_status(ROOM, KVPoll.WaitingForInput)
    assert managers[0].check_status_pp_consensus(ROOM) == KVPoll.Bootstrapping  # the minimum
    for manager in managers:
        manager.request_status.close()


def test_a_manager_that_lost_its_lease_holds_its_name_again_and_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    managers, raw, namespace = _ranks(3)
    manager = managers[1]
    store = manager.request_status.store
    assert manager.update_status(ROOM, KVPoll.Bootstrapping).outcome is Outcome.CREATED
    raw.hset(f"kvstatus:{namespace}:lease:prefill-tp0-pp1", "deadline", 1)  # Redis' clock passed it ...
    store.lease._renewed_at = float("-inf")  # ... while the process stalled: its next write renews first
    with caplog.at_level(logging.WARNING, logger="kvstatus.sglang"):
        # A request opening its room after the stall: the write fails on the lost lease, the name is held again,
        # and the write goes once more as the new incarnation's (the room holds nothing of the lost one).
        assert manager.update_status(ROOM + 1, KVPoll.Bootstrapping).outcome is Outcome.CREATED
    assert store.lease.held and store.lease.generation == 2
    assert any("holding its name again as lease incarnation 2" in r.getMessage() for r in caplog.records)
    assert manager.check_status(ROOM + 1) == KVPoll.Bootstrapping
    assert manager.update_status(ROOM + 2, KVPoll.Bootstrapping).outcome is Outcome.CREATED  # and it serves on


def test_a_write_of_a_room_from_before_the_lost_lease_fails_that_room(caplog: pytest.LogCaptureFixture) -> None:
    """Only a write that opens a room is sent again after the name is held again: one of a room opened before
    the stall fails it (its peers' watches fail the lost incarnation's entry there too), and it reads Failed
    from then on, with the lease's loss as its cause."""
    managers, raw, namespace = _ranks(3)
    manager = managers[1]
    assert manager.update_status(ROOM, KVPoll.Bootstrapping).outcome is Outcome.CREATED
    raw.hset(f"kvstatus:{namespace}:lease:prefill-tp0-pp1", "deadline", 1)
    manager.request_status.store.lease._renewed_at = float("-inf")
    with caplog.at_level(logging.WARNING, logger="kvstatus.sglang"):
        assert manager.update_status(ROOM, KVPoll.Transferring) is UNANSWERED_RESULT
    assert manager.request_status.store.lease.generation == 2
    assert manager.check_status(ROOM) == KVPoll.Failed
    assert "lease is lost" in manager.failure_records[ROOM]
    for each in managers:
        each.request_status.close()


def test_a_manager_whose_name_another_process_took_does_not_take_it_back(caplog: pytest.LogCaptureFixture) -> None:
    """Two processes under one participant name (a replaced process that still runs, or two servers without
    KVSTATUS_SGLANG_INSTANCE): the older one's writes are refused (fencing), and it does not acquire the name
    again, which would fence the newer one off in turn. Its rooms fail, with one ERROR naming the cause."""
    managers, raw, namespace = _ranks(3)
    manager = managers[1]
    assert manager.update_status(ROOM, KVPoll.Bootstrapping).outcome is Outcome.CREATED
    newer = StatusStore(raw, namespace=namespace, participant="prefill-tp0-pp1", lease_ttl=3)
    assert newer.update_status(ROOM, KVPoll.WaitingForInput).outcome is Outcome.CREATED  # the old entry is not its own
    with caplog.at_level(logging.WARNING, logger="kvstatus.sglang"):
        assert manager.update_status(ROOM, KVPoll.Transferring) is UNANSWERED_RESULT
        assert manager.update_status(ROOM + 1, KVPoll.Bootstrapping) is UNANSWERED_RESULT
    taken = [r for r in caplog.records if "another process holds this participant name" in r.getMessage()]
    assert len(taken) == 1 and taken[0].levelno == logging.ERROR
    lost = [r.getMessage() for r in caplog.records if "its lease is lost (SupersededError" in r.getMessage()]
    assert len(lost) == 1 and "until it answers again" not in lost[0]  # Redis answered: no outage to wait out
    assert not any("holding its name again" in r.getMessage() for r in caplog.records)
    assert newer.lease.held and newer.lease.generation == 2  # not taken back
    assert newer.get(ROOM) is KVPoll.WaitingForInput and newer.get(ROOM + 1) is None
    newer.close()
    for each in managers:
        each.request_status.close()
