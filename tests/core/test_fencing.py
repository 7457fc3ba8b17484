"""Incarnation fencing (issue 16 item 3, issue 19 item 5), on every backend (fakeredis, Redis, Cluster; sync and
async).

A store with a lease stamps each entry it writes with its incarnation's epoch (``inc:<participant>``, see
lua/update.lua). When a participant restarts under the same name, the new incarnation's epoch is higher: a
write or clear of the old process that finds the new one's stamp is refused and writes nothing, and a sweep
that judged the old incarnation lost spares what the new one wrote meanwhile.
"""

from __future__ import annotations

import itertools
from typing import Any, Optional

import pytest

from kvstatus import (
    InvalidArgumentError,
    KVPoll,
    LeaseLostError,
    Outcome,
    SupersededError,
    UpdateResult,
    scripts,
)
from kvstatus.admin import sweep as sweep_module
from kvstatus.admin.sweep import sweep
from kvstatus.keys import TOMBSTONE_TTL_SECONDS, KeySchema
from kvstatus.model import Policy
from kvstatus.requests import Request, script_call
from kvstatus.rule import apply_fenced
from tests.helpers.backends import RedisUnderTest
from tests.helpers.clock import hold_background_watch

B, W, T, S, F = KVPoll.Bootstrapping, KVPoll.WaitingForInput, KVPoll.Transferring, KVPoll.Success, KVPoll.Failed


@pytest.fixture(autouse=True)
def _looks_by_hand(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests call the looks themselves and count what each one failed."""
    hold_background_watch(monkeypatch)


def _stamp(backend: RedisUnderTest, room: int, participant: str) -> Optional[int]:
    value = backend.raw.hget(f"kvstatus:{backend.namespace}:{{{room}}}", f"inc:{participant}")
    return None if value is None else int(value)


def _restarted(backend: RedisUnderTest, participant: str, rooms: list[int]) -> tuple[Any, Any]:
    """An old incarnation that wrote ``rooms`` Bootstrapping, and a new one (same name) that wrote them after."""
    old = backend.store(participant=participant, lease_ttl=3)
    for room in rooms:
        old.update_status(room, B)
        assert _stamp(backend, room, participant) == old.lease.epoch
    new = backend.store(participant=participant, lease_ttl=3)  # the restarted process
    for room in rooms:
        # The old incarnation's entry is missing for the new one (its dict starts empty): CREATED replaces it.
        assert new.update_status(room, B).outcome is Outcome.CREATED
        assert _stamp(backend, room, participant) == new.lease.epoch
    assert new.lease.epoch > old.lease.epoch
    return old, new


def test_a_replaced_incarnations_update_is_refused_and_writes_nothing(backend: RedisUnderTest) -> None:
    old, new = _restarted(backend, "prefill-0", [1])
    old.update_status(2, B)  # a room only the old incarnation wrote: not refused (its lease looks fresh)
    assert new.update_status(1, W).outcome is Outcome.ADVANCED
    with pytest.raises(SupersededError, match="participant prefill-0 .* taken over by a newer incarnation") as refused:
        old.update_status(1, T)
    assert "room 1" in str(refused.value) and refused.value.participant == "prefill-0"
    assert refused.value.results == {1: UpdateResult(Outcome.REFUSED_SUPERSEDED, W)}
    assert new.get(1) is W and _stamp(backend, 1, "prefill-0") == new.lease.epoch  # nothing written
    # From then on the old store refuses every write before it reaches Redis, in any room.
    assert old.lease.lost and old.lease.taken_over
    with pytest.raises(LeaseLostError, match="another store took the name over"):
        old.update_status(2, T)
    assert new.room(2).participants["prefill-0"].status is B


def test_a_batch_applies_the_other_rooms_and_names_the_refused_ones(backend: RedisUnderTest) -> None:
    old, new = _restarted(backend, "prefill-0", [1, 2])
    with pytest.raises(SupersededError, match="rooms 1, 2") as refused:
        old.update_many({1: T, 2: F, 3: B})
    assert refused.value.results == {
        1: UpdateResult(Outcome.REFUSED_SUPERSEDED, B),
        2: UpdateResult(Outcome.REFUSED_SUPERSEDED, B),
        3: UpdateResult(Outcome.CREATED, B),
    }
    assert new.get_many([1, 2, 3]) == {1: B, 2: B, 3: B}
    assert new.failure(2) is None  # the refused Failed recorded no first failure either


@pytest.mark.parametrize("operation", ["clear", "pop"])
def test_a_replaced_incarnations_clear_is_refused(backend: RedisUnderTest, operation: str) -> None:
    old, new = _restarted(backend, "decode-0", [7])
    with pytest.raises(SupersededError, match="room 7"):
        getattr(old, operation)(7)
    assert new.get(7) is B and _stamp(backend, 7, "decode-0") == new.lease.epoch
    assert new.clear(7) and _stamp(backend, 7, "decode-0") == new.lease.epoch  # the fence outlives the entry
    assert backend.keys_without_ttl() == []


def test_an_old_incarnation_cannot_write_again_a_room_the_new_one_cleared(backend: RedisUnderTest) -> None:
    """Issue 36, Medium 7: ``clear`` dropped the stamp with the entry, so the old process' late WaitingForInput
    created the entry again, and the new incarnation read it. The stamp stays behind, as long as the tombstone."""
    old, new = _restarted(backend, "decode-0", [9])
    new.update_status(9, W)
    assert new.clear(9)
    with pytest.raises(SupersededError, match="room 9"):
        old.update_status(9, W)
    assert new.get(9) is None and not new.room(9).exists and new.room(9).cleared
    key = f"kvstatus:{backend.namespace}:{{9}}"
    assert 0 < backend.raw.pttl(key) <= TOMBSTONE_TTL_SECONDS * 1000  # the fence lasts as the tombstone
    assert new.update_status(9, B).outcome is Outcome.CREATED  # the room id serves a second lifecycle (PR#39357)


def test_a_replaced_incarnations_failure_reason_is_refused(backend: RedisUnderTest) -> None:
    old, new = _restarted(backend, "decode-0", [8])
    with pytest.raises(SupersededError, match="room 8"):
        old.record_failure(8, "the old process' transfer timed out")
    assert new.room(8).participants["decode-0"].reason is None  # the new incarnation's entry has no reason
    assert new.record_failure(8, "its own") and new.room(8).participants["decode-0"].reason == "its own"


def test_a_previous_incarnations_entry_is_missing_for_clear_pop_and_record_failure(backend: RedisUnderTest) -> None:
    """As for a restarted SGLang process, whose dict starts empty: the old entry is not the new one's to clear or
    to give a reason to (the peers' watches fail it)."""
    old = backend.store(participant="decode-0", lease_ttl=3)
    for room in (21, 22, 23):
        old.update_status(room, T)
    new = backend.store(participant="decode-0", lease_ttl=3)
    new.acquire_lease()
    assert new.clear(21) is False and new.pop(22) is None
    assert new.record_failure(23, "not mine") is False
    for room in (21, 22, 23):
        entry = new.room(room).participants["decode-0"]
        assert entry == (T, None) and _stamp(backend, room, "decode-0") == old.lease.epoch, room


def test_epochs_order_incarnations_even_after_the_lease_record_was_lost(backend: RedisUnderTest) -> None:
    first = backend.store(participant="p", lease_ttl=3)
    first.acquire_lease()
    backend.raw.delete(f"kvstatus:{backend.namespace}:lease:p")  # a restart without persistence, a FLUSHALL
    second = backend.store(participant="p", lease_ttl=3)
    second.acquire_lease()
    assert second.lease.generation == first.lease.generation == 1  # the count restarted: no order in it
    assert second.lease.epoch > first.lease.epoch  # the epoch still orders them (Redis' clock)
    third = backend.store(participant="p", lease_ttl=3)
    third.acquire_lease()  # within the same millisecond or not, it is above the previous one
    assert third.lease.epoch > second.lease.epoch and third.lease.generation == 2


def test_stores_without_a_lease_neither_read_nor_write_stamps(backend: RedisUnderTest) -> None:
    fenced = backend.store(participant="p", lease_ttl=3)
    fenced.update_status(1, T)
    plain = backend.store(participant="p")  # e.g. an operator's script writing as the participant
    assert plain.update_status(1, S).outcome is Outcome.ADVANCED
    assert plain.update_status(2, B).outcome is Outcome.CREATED
    assert _stamp(backend, 1, "p") == fenced.lease.epoch and _stamp(backend, 2, "p") is None
    assert fenced.update_status(2, W).outcome is Outcome.ADVANCED and _stamp(backend, 2, "p") == fenced.lease.epoch


def test_a_paused_sweeper_spares_the_entry_of_an_incarnation_that_took_over(
    backend: RedisUnderTest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 19 item 5: the sweeper read the lost lease, then paused; meanwhile a new incarnation took the name
    and wrote one of the rooms. The sweep fails the old entries only."""
    dead = backend.store(participant="dead-0", lease_ttl=3)
    live = backend.store(participant="live-0")
    for room in (1, 2):
        dead.update_status(room, T)
        live.update_status(room, T)
    backend.raw.hset(f"kvstatus:{backend.namespace}:lease:dead-0", "deadline", 1)  # Redis' clock passed it
    real = sweep_module.fail_entries_request
    back: list[Any] = []

    def paused(*args: Any, **kwargs: Any) -> Any:
        if not back:  # between the sweeper's read and its sweep.lua: the name is taken over, room 1 written
            back.append(backend.store(participant="dead-0", lease_ttl=3))
            assert back[0].update_status(1, S).outcome is Outcome.CREATED  # the dead one's entry is not its own
        return real(*args, **kwargs)

    monkeypatch.setattr(sweep_module, "fail_entries_request", paused)
    result = sweep(backend.raw, KeySchema(backend.namespace))
    assert (result.lost, result.swept, result.raced) == (["dead-0"], 1, 1)
    assert live.room(1).participants["dead-0"].status is S  # the new incarnation's entry
    assert live.room(2).participants["dead-0"].status is F  # the lost one's
    assert live.failure(1) is None and live.failure(2).stage.value == "lease-lost"


def test_the_peer_watch_spares_what_a_restarted_peer_wrote_in_the_rooms_it_fails(backend: RedisUnderTest) -> None:
    decode = backend.store(participant="decode-0", lease_ttl=3)
    prefill = backend.store(participant="prefill-0", lease_ttl=3)
    for room in (5, 6):
        decode.update_status(room, B)
        prefill.update_status(room, B)
    assert decode.look_at_peers() == 0
    again = backend.store(participant="prefill-0", lease_ttl=3)  # the prefill restarts under its name ...
    again.update_status(6, W)  # ... and a retried request bootstraps room 6 again before the decode looks
    assert decode.look_at_peers() == 1
    assert decode.room(5).participants["prefill-0"].status is F and decode.failure(5).stage.value == "superseded"
    assert decode.room(6).participants["prefill-0"].status is W and decode.failure(6) is None


STATUSES: list[Optional[KVPoll]] = [None, *KVPoll]


@pytest.mark.parametrize("policy", list(Policy))
def test_the_script_applies_the_fenced_rule_as_the_reference_does(sync_backend: RedisUnderTest, policy: Policy) -> None:
    """Every (entry, stamp, update, writer's epoch) against :func:`kvstatus.rule.apply_fenced`."""
    store = sync_backend.store(participant="p", policy=policy)
    key = KeySchema(sync_backend.namespace).room_key
    cases = list(itertools.product(STATUSES, [None, 5, 10, 20], list(KVPoll), [None, 10]))
    for room, (current, stamp, new, epoch) in enumerate(cases):
        fields = {} if current is None else {"p": str(current.value)}
        if stamp is not None:
            fields["inc:p"] = str(stamp)
        if fields:
            sync_backend.raw.hset(key(room), mapping=fields)
        store._core.fence(epoch)
        try:
            result = store.update_status(room, new)
        except SupersededError as refused:
            assert refused.results is not None
            result = refused.results[room]
        expected, stamp_after = apply_fenced(current, stamp, new, epoch, policy)
        case = (current, stamp, new, epoch, policy)
        assert result == expected, case
        assert _stamp(sync_backend, room, "p") == stamp_after, case
        status = sync_backend.raw.hget(key(room), "p")
        stored = expected.status if expected.outcome.refreshes_ttl else current  # nothing written: as it was
        assert (None if status is None else KVPoll(int(status))) == stored, case


JUNK_STAMPS = ("not-an-epoch", "inf", "1e400", "nan", "-5", "0x10", " 7", "1e3", "0", "1" * 16, "9" * 5000)


def test_a_stamp_kvstatus_does_not_write_is_read_as_none_and_replaced(sync_backend: RedisUnderTest) -> None:
    """Issue 36: "inf" and "1e400" were taken as later incarnations (every write refused, the lease lost), "-5",
    "0x10" and " 7" as earlier ones (the entry dropped), "nan" as this one. Each now fences nothing: the write
    applies the rule to the entry as it is, and stamps it with its own epoch."""
    store = sync_backend.store(participant="p")
    key = KeySchema(sync_backend.namespace).room_key(3)
    store._core.fence(10)
    for junk in JUNK_STAMPS:
        sync_backend.raw.hset(key, mapping={"p": "1", "inc:p": junk})
        assert store.update_status(3, W) == UpdateResult(Outcome.ADVANCED, W), junk
        assert _stamp(sync_backend, 3, "p") == 10, junk
        sync_backend.raw.hset(key, mapping={"p": "1", "inc:p": junk})
        assert store.update_status(3, KVPoll.Failed).outcome is Outcome.FAILED, junk


def test_a_bad_epoch_argument_is_refused_and_nothing_is_written(sync_backend: RedisUnderTest) -> None:
    store = sync_backend.store(participant="p")
    key = KeySchema(sync_backend.namespace).room_key(3)
    sync_backend.raw.hset(key, mapping={"p": "1"})
    for bad in ("0", "1.5", "-3", "x", "0x10", " 12", "1" * 16, "1e3", "inf"):
        head = ("seed", "1000", "p", "reason:p", "inc:p", bad, "", "2")
        with pytest.raises(InvalidArgumentError, match="the incarnation epoch must be empty or a positive integer"):
            store._send(Request([script_call(scripts.UPDATE, [key], head)], lambda replies: replies[0]))
    assert sync_backend.raw.hget(key, "p") == b"1"
