"""Shared fate through the near cache and wait_for: a peer's failure or a cancel reaches a cached reader
(by invalidation) and wakes a waiter (by the update or cancel script's publish)."""

from __future__ import annotations

import threading
import time

import pytest

from kvstatus import KVPoll, StatusStore
from kvstatus.storebase import CLOCK, READ, RECEIVE, SLEEP, WATCH, wait_plan
from tests.nearcache.helpers import eventually


@pytest.mark.real
def test_a_cached_reader_sees_a_peer_fail_its_room(writer: StatusStore, cached: StatusStore) -> None:
    peer = writer.for_participant("prefill-0")
    writer.update_many({1: KVPoll.Transferring, 2: KVPoll.Transferring, 3: KVPoll.Success})
    peer.update_many(dict.fromkeys((1, 2, 3), KVPoll.Transferring))
    assert cached.get_many([1, 2, 3]) == {1: KVPoll.Transferring, 2: KVPoll.Transferring, 3: KVPoll.Success}
    alone = StatusStore(cached.client, namespace=cached.namespace, participant="w", near_cache=cached.near_cache,
                        shared_fate=False)  # fmt: skip
    assert alone.near_cache is cached.near_cache  # one cache, read two ways
    peer.update_status(1, KVPoll.Failed)
    peer.update_status(3, KVPoll.Failed)
    writer.for_participant("router-1").cancel(2, "client went away")
    expected = {1: KVPoll.Failed, 2: KVPoll.Failed, 3: KVPoll.Success}  # a finished part is kept
    eventually(lambda: cached.get_many([1, 2, 3]) == expected, what="the cached reads follow the room's fate")
    assert cached.get(1) is KVPoll.Failed and cached.check_status(2) is KVPoll.Failed
    assert alone.get_many([1, 2, 3]) == {1: KVPoll.Transferring, 2: KVPoll.Failed, 3: KVPoll.Success}
    failure = cached.failure(2)
    assert failure is not None and failure.describe() == "cancelled by router-1: client went away"
    assert cached.room(1).failure == writer.failure(1)


@pytest.mark.real
def test_a_waiter_is_woken_by_a_peer_failing_the_room(writer: StatusStore) -> None:
    peer = writer.for_participant("prefill-0")
    writer.update_status(5, KVPoll.WaitingForInput)
    peer.update_status(5, KVPoll.Transferring)

    def fail_later() -> None:
        time.sleep(0.2)
        peer.update_status(5, KVPoll.Failed)

    thread = threading.Thread(target=fail_later, daemon=True)
    thread.start()
    assert writer.wait_for(5, [KVPoll.Success, KVPoll.Failed], timeout=30) is KVPoll.Failed
    thread.join()
    assert writer.room(5).participants["w"].status is KVPoll.WaitingForInput  # derived, not written


@pytest.mark.unit
def test_the_plan_watches_then_reads_after_each_wake() -> None:
    plan = wait_plan(frozenset({KVPoll.Success, KVPoll.Failed}), timeout=60, recheck=30)
    assert next(plan) == (CLOCK, None)
    assert plan.send(0.0) == (WATCH, None)  # watch first, then read: a change after the read wakes the wait
    assert plan.send(True) == (READ, None)
    assert plan.send(KVPoll.Transferring) == (CLOCK, None)
    assert plan.send(0.1) == (RECEIVE, 30)  # until the room changes, or the recheck
    assert plan.send(None) == (WATCH, None)  # woken (a peer's progress): watch again, then read
    assert plan.send(True) == (READ, None)
    assert plan.send(KVPoll.Transferring) == (CLOCK, None)
    assert plan.send(59.5) == (RECEIVE, pytest.approx(0.5))  # never past the wait's end
    assert plan.send(None) == (WATCH, None)
    assert plan.send(True) == (READ, None)  # a peer's Failed: under shared fate this read answers Failed
    with pytest.raises(StopIteration) as stop:
        plan.send(KVPoll.Failed)
    assert stop.value.value is KVPoll.Failed


@pytest.mark.unit
def test_the_plan_polls_when_nothing_can_watch_and_ends_at_its_timeout() -> None:
    plan = wait_plan(frozenset({KVPoll.Success}), timeout=1, recheck=30, poll_interval=0.05)
    assert next(plan) == (CLOCK, None)
    assert plan.send(0.0) == (WATCH, None)
    assert plan.send(False) == (READ, None)  # no cache can watch (the ACL refused tracking, fakeredis)
    assert plan.send(None) == (CLOCK, None)
    assert plan.send(0.2) == (SLEEP, 0.05)
    assert plan.send(None) == (WATCH, None)
    assert plan.send(False) == (READ, None)
    assert plan.send(KVPoll.Transferring) == (CLOCK, None)
    with pytest.raises(StopIteration) as stop:
        plan.send(1.0)  # the wait's end: None, after the last read
    assert stop.value.value is None
