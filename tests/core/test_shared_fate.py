"""One room, one fate (kvstatus.rule.shared_status and its views): every read, on every backend, sync and async,
against the table.

Two participants share room 7: ``own`` reads, ``peer`` fails its entry (or a third store cancels the room).
The reads (get, check_status, get_many, and get_many over several slots on a cluster) must answer what
:func:`kvstatus.rule.shared_status` answers; the stored entries are never rewritten by a read.
"""

from __future__ import annotations

import re

import pytest

from kvstatus import InvalidArgumentError, KVPoll
from kvstatus.errors import CorruptedValueError
from kvstatus.keys import FATE_FIELD
from kvstatus.model import CancelOutcome, FailureRecord, Stage
from kvstatus.replies import parse_fate
from kvstatus.rule import shared_status
from kvstatus.url import parse_url
from tests.helpers.backends import RedisUnderTest

ROOM = 7
OWN_STATUSES = [None, *KVPoll]
EVENTS = ["peer-failed", "cancelled"]


def _setup(backend: RedisUnderTest, own_status: KVPoll | None, event: str, **settings: object):  # type: ignore[no-untyped-def]
    own = backend.store(participant="decode-0", **settings)
    peer = own.for_participant("prefill-0")
    assert peer.update_status(ROOM, KVPoll.Transferring).status is KVPoll.Transferring
    if own_status is not None:
        own.update_status(ROOM, KVPoll.Bootstrapping)
        own.update_status(ROOM, own_status)
    if event == "peer-failed":
        peer.record_failure(ROOM, "KV transfer to decode-0 timed out")
        peer.update_status(ROOM, KVPoll.Failed)
    else:
        result = own.for_participant("router-1").cancel(ROOM, "client went away")
        first = CancelOutcome.ALREADY_FAILED if own_status is KVPoll.Failed else CancelOutcome.CANCELLED
        assert result.outcome is first
    return own, peer


@pytest.mark.parametrize("event", EVENTS)
@pytest.mark.parametrize("own_status", OWN_STATUSES, ids=lambda s: "missing" if s is None else s.name)
def test_every_read_follows_the_table(backend: RedisUnderTest, own_status: KVPoll | None, event: str) -> None:
    own, _ = _setup(backend, own_status, event)
    failure = own.failure(ROOM)
    assert failure is not None
    expected = shared_status(own_status, failure, own.participant)
    if own_status is None or own_status in (KVPoll.Success, KVPoll.Failed):
        assert expected is own_status  # the table: nothing to fail, a finished part is kept
    else:
        assert expected is KVPoll.Failed
    assert own.get(ROOM) is expected
    assert own.get_many([ROOM, ROOM + 1, 2**63 - 1]) == {ROOM: expected, ROOM + 1: None, 2**63 - 1: None}
    if expected is None:
        with pytest.raises(KeyError):
            own.check_status(ROOM)
    else:
        assert own.check_status(ROOM) is expected
    # The read derived it: the stored entry is what the rule left (a cancel stores Failed in open entries).
    stored = own.room(ROOM).participants.get(own.participant)
    cancelled_open = event == "cancelled" and own_status not in (None, KVPoll.Success, KVPoll.Failed)
    assert (None if stored is None else stored.status) is (KVPoll.Failed if cancelled_open else own_status)
    # Off, each entry reads alone.
    alone = backend.store(participant="decode-0", shared_fate=False)
    assert alone.shared_fate is False
    assert alone.get(ROOM) is (KVPoll.Failed if cancelled_open else own_status)


def test_the_first_failure_names_stage_origin_and_reason(backend: RedisUnderTest) -> None:
    prefill = backend.store(participant="prefill-0")
    decode = prefill.for_participant("decode-0")
    prefill.update_status(ROOM, KVPoll.Bootstrapping)
    prefill.update_status(ROOM, KVPoll.WaitingForInput)
    decode.update_status(ROOM, KVPoll.Transferring)
    assert prefill.failure(ROOM) is None and prefill.room(ROOM).failure is None
    decode.update_status(ROOM, KVPoll.Failed)  # no reason yet: record_failure after the update fills it in
    assert decode.record_failure(ROOM, "NIXL transfer aborted") is True
    prefill.record_failure(ROOM, "later")
    prefill.update_status(ROOM, KVPoll.Failed)  # a later failure keeps the first
    failure = prefill.failure(ROOM)
    assert failure is not None
    assert (failure.stage, failure.origin, failure.reason) == (Stage.TRANSFER, "decode-0", "NIXL transfer aborted")
    assert failure.at_ms > 1_700_000_000_000
    assert failure.describe() == "failed at transfer by decode-0: NIXL transfer aborted"
    assert prefill.room(ROOM).failure == failure == decode.failure(ROOM)


@pytest.mark.parametrize(
    ("opened", "stage"),
    [
        (KVPoll.Bootstrapping, Stage.BOOTSTRAP),
        (KVPoll.WaitingForInput, Stage.WAITING),
        (KVPoll.Success, Stage.TRANSFER),
    ],
)
def test_the_stage_is_the_status_the_entry_failed_from(backend: RedisUnderTest, opened: KVPoll, stage: Stage) -> None:
    store = backend.store(participant="prefill-0", policy="seed")
    store.update_status(ROOM, KVPoll.Bootstrapping)
    store.update_status(ROOM, opened)
    store.update_status(ROOM, KVPoll.Failed)
    failure = store.failure(ROOM)
    assert failure is not None and failure.stage is stage and failure.reason == ""
    assert failure.describe() == f"failed at {stage.value} by prefill-0 (no reason given)"


def test_its_own_failure_left_under_seed_reads_as_its_entry(backend: RedisUnderTest) -> None:
    """One participant alone never reads what the per-entry rule would not give it (the differential tier)."""
    own = backend.store(participant="decode-0", policy="seed")
    peer = own.for_participant("prefill-0")
    own.update_status(ROOM, KVPoll.Bootstrapping)
    peer.update_status(ROOM, KVPoll.Bootstrapping)
    own.update_status(ROOM, KVPoll.Failed)
    assert own.update_status(ROOM, KVPoll.Transferring).status is KVPoll.Transferring  # seed: Failed is left
    assert own.get(ROOM) is KVPoll.Transferring
    assert peer.get(ROOM) is KVPoll.Failed  # the room failed for decode-0 first: the peer's open entry fails


def test_a_cancel_fails_open_entries_keeps_finished_ones_and_outlives_the_clears(backend: RedisUnderTest) -> None:
    prefill = backend.store(participant="prefill-0", ttl=30)
    decode = prefill.for_participant("decode-0")
    prefill.update_status(ROOM, KVPoll.Success)
    decode.update_status(ROOM, KVPoll.Transferring)
    result = prefill.for_participant("router-1").cancel(ROOM, "client went away")
    assert (result.outcome, result.failed) == (CancelOutcome.CANCELLED, 1)
    view = prefill.room(ROOM)
    assert view.participants["prefill-0"].status is KVPoll.Success
    assert view.participants["decode-0"] == (KVPoll.Failed, "cancelled by router-1: client went away")
    again = decode.cancel(ROOM, "again", origin="operator")
    assert (again.outcome, again.failed) == (CancelOutcome.ALREADY_FAILED, 0)
    assert decode.failure(ROOM) == view.failure and view.failure is not None
    assert view.failure.describe() == "cancelled by router-1: client went away"
    # Every participant clears: the cancel's record stays (with the TTL), so a late write reads Failed.
    prefill.clear(ROOM)
    decode.clear(ROOM)
    assert backend.room_keys() == [prefill.schema.room_key(ROOM)]
    assert 0 < backend.raw.pttl(prefill.schema.room_key(ROOM)) <= 30_000
    assert decode.update_status(ROOM, KVPoll.Bootstrapping).status is KVPoll.Bootstrapping
    assert decode.get(ROOM) is KVPoll.Failed
    assert backend.keys_without_ttl() == []


def test_a_room_cancelled_before_anyone_wrote_fails_its_first_writer(backend: RedisUnderTest) -> None:
    router = backend.store(participant="router-1", ttl=20)
    assert router.cancel(ROOM, "request timed out at the router").outcome is CancelOutcome.CANCELLED
    view = router.room(ROOM)
    assert view.participants == {} and view.exists and view.failure is not None
    assert 0 < backend.raw.pttl(router.schema.room_key(ROOM)) <= 20_000
    decode = router.for_participant("decode-0")
    assert decode.get(ROOM) is None  # nothing to fail yet
    decode.update_status(ROOM, KVPoll.Bootstrapping)
    assert decode.check_status(ROOM) is KVPoll.Failed


def test_a_failed_room_goes_with_its_last_entry(backend: RedisUnderTest) -> None:
    prefill = backend.store(participant="prefill-0")
    decode = prefill.for_participant("decode-0")
    prefill.update_status(ROOM, KVPoll.Transferring)
    decode.update_status(ROOM, KVPoll.Transferring)
    decode.update_status(ROOM, KVPoll.Failed)
    decode.clear(ROOM)
    assert prefill.failure(ROOM) is not None  # prefill-0's entry still holds the room
    assert prefill.pop(ROOM) is KVPoll.Transferring
    assert backend.room_keys() == []


def test_cancel_many_spans_slots_and_names_each_room(backend: RedisUnderTest) -> None:
    store = backend.store(participant="router-1")
    peer = store.for_participant("decode-0")
    rooms = list(range(100, 140))
    peer.update_many(dict.fromkeys(rooms[:20], KVPoll.WaitingForInput))
    peer.update_status(rooms[0], KVPoll.Failed)
    results = store.cancel_many(iter(rooms + rooms[:3]), "drain")  # an iterator, repeats once each
    assert list(results) == rooms
    assert results[rooms[0]] == (CancelOutcome.ALREADY_FAILED, 0)
    assert all(results[room] == (CancelOutcome.CANCELLED, 1) for room in rooms[1:20])
    assert all(results[room] == (CancelOutcome.CANCELLED, 0) for room in rooms[20:])
    assert set(peer.get_many(rooms).values()) == {KVPoll.Failed, None}
    assert store.cancel_many([], "nothing") == {}


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda s: s.cancel(-1, "x"), "invalid room"),
        (lambda s: s.cancel(ROOM, "x", origin="bad origin"), "origin"),
        (lambda s: s.cancel_many("12", "x"), "iterable of room ids"),
        (lambda s: s.cancel_many([1, True], "x"), "invalid room"),
    ],
)
def test_bad_cancels_name_the_problem_and_write_nothing(backend: RedisUnderTest, call, error: str) -> None:  # type: ignore[no-untyped-def]
    store = backend.store(participant="router-1")
    with pytest.raises(InvalidArgumentError, match=error):
        call(store)
    assert backend.keys() == []


def test_a_corrupted_failure_record_is_named_when_it_matters(backend: RedisUnderTest) -> None:
    store = backend.store(participant="decode-0")
    store.update_status(ROOM, KVPoll.Transferring)
    store.update_status(ROOM + 1, KVPoll.Success)
    for room in (ROOM, ROOM + 1):
        backend.raw.hset(store.schema.room_key(room), FATE_FIELD, "garbage")
    key = store.schema.room_key(ROOM)
    with pytest.raises(CorruptedValueError, match=re.escape(f"key {key} field {FATE_FIELD} holds 'garbage'")):
        store.get(ROOM)
    with pytest.raises(CorruptedValueError, match=FATE_FIELD):
        store.get_many([ROOM])
    with pytest.raises(CorruptedValueError, match=FATE_FIELD):
        store.failure(ROOM)
    assert store.get(ROOM + 1) is KVPoll.Success  # a finished entry does not need the record
    assert store.get_many([ROOM + 1]) == {ROOM + 1: KVPoll.Success}


def test_the_record_parses_and_rejects_what_kvstatus_does_not_write() -> None:
    assert parse_fate(b"1700000000123:cancelled:router-1:a: reason: with colons", "k") == FailureRecord(
        1700000000123, Stage.CANCELLED, "router-1", "a: reason: with colons"
    )
    assert parse_fate(None, "k") is None
    for bad in ("", "x:transfer:p:", "12:exploded:p:r", "12:transfer::r", "12:transfer:p"):
        with pytest.raises(CorruptedValueError, match="not a failure record"):
            parse_fate(bad, "the-key")


def test_the_url_does_not_take_the_setting() -> None:
    with pytest.raises(InvalidArgumentError, match="'shared_fate' is a store setting.*pass shared_fate=False"):
        parse_url("redis://h/0?shared_fate=no")


def test_the_setting_must_be_a_bool(backend: RedisUnderTest) -> None:
    with pytest.raises(InvalidArgumentError, match="shared_fate must be True or False"):
        backend.store(participant="p", shared_fate="no")


def test_the_consensus_read_answers_a_failed_rooms_first_failure_as_get_does(backend: RedisUnderTest) -> None:
    """Issue 36 Medium 8: room_status() answered Bootstrapping for a room whose first failure was recorded (a rank
    still open, or one missing), while get() answered Failed."""
    prefill = backend.store(participant="prefill-0")
    decode = backend.store(participant="decode-0")
    ranks = ["prefill-0", "decode-0"]
    open_room, missing_room, served_room = 11, 2**40 + 3, 987_654_321_012
    prefill.update_status(open_room, KVPoll.Transferring)
    decode.update_status(open_room, KVPoll.WaitingForInput)
    prefill.update_status(missing_room, KVPoll.Bootstrapping)  # its decode never joined
    for store in (prefill, decode):
        store.update_status(served_room, KVPoll.Success)
    for room in (open_room, missing_room, served_room):
        prefill.cancel(room, "the client went away", origin="router-0")
    views = decode.room_statuses([open_room, missing_room, served_room], ranks)
    assert decode.get(open_room) is KVPoll.Failed and prefill.get(missing_room) is KVPoll.Failed
    for room in (open_room, missing_room):
        assert views[room].status is KVPoll.Failed, views[room]
        assert views[room].reason == "cancelled by router-0: the client went away"
        assert decode.room_status(room, ranks) == views[room]
    assert views[missing_room].missing == ("decode-0",)
    assert views[served_room].status is KVPoll.Success  # every entry served: the cancel changed nothing
    # Shared fate off: each entry alone, as upstream's dicts (the open room's entries were failed by the cancel).
    alone = backend.store(participant="reader", shared_fate=False)
    assert alone.room_status(missing_room, ranks).status is KVPoll.Bootstrapping
