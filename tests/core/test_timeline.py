"""Each entry's timeline (issue 20 item 1), on every backend (fakeredis, Redis, Cluster; sync and async).

A store with ``timeline=True`` records, in the update that changes a status, when the entry reached it
(lua/lib/timeline.lua; kvstatus.timeline is its reference). Clear removes it with the entry and hands it to
the observer; sweep and cancel add their Failed step.
"""

from __future__ import annotations

import itertools
import time
from typing import Any, Optional

import pytest

from kvstatus import CorruptedValueError, InvalidURLError, KVPoll, Outcome, StatusStore
from kvstatus.admin.health import HealthSettings, classify
from kvstatus.admin.sweep import sweep
from kvstatus.keys import KeySchema
from kvstatus.model import Policy, Step
from kvstatus.rule import apply_rule
from kvstatus.stuck import stuck
from kvstatus.timeline import MAX_BYTES, parse_timeline, since_current, stage_seconds, timeline_after
from tests.helpers.backends import RedisUnderTest

B, W, T, S, F = KVPoll.Bootstrapping, KVPoll.WaitingForInput, KVPoll.Transferring, KVPoll.Success, KVPoll.Failed
WRITES = (Outcome.CREATED, Outcome.ADVANCED, Outcome.FAILED)


def _raw_timeline(backend: RedisUnderTest, room: int, participant: str) -> Optional[str]:
    value = backend.raw.hget(KeySchema(backend.namespace).room_key(room), f"t:{participant}")
    return None if value is None else value.decode()


def _now_ms() -> int:
    return int(time.time() * 1000)  # the test's servers run on this machine: its clock is theirs


def test_each_status_change_adds_a_step_at_the_servers_time(backend: RedisUnderTest) -> None:
    store = backend.store(participant="decode-0", timeline=True)
    before = _now_ms()
    for status in (B, W, W, T, S, S):
        store.update_status(7, status)
    after = _now_ms()
    steps = store.room(7).timelines["decode-0"]
    assert [step.status for step in steps] == [B, W, T, S]  # an UNCHANGED adds no step
    assert before - 5 <= steps[0].at_ms <= steps[-1].at_ms <= after + 5
    assert [s.at_ms for s in steps] == sorted(s.at_ms for s in steps)


def test_the_steps_follow_every_outcome_of_the_rule(backend: RedisUnderTest) -> None:
    """Every (entry, update, policy): a step exactly when the rule writes the status (CREATED starts over)."""
    for policy in Policy:
        store = backend.store(participant="p", policy=policy, timeline=True)
        for room, (current, new) in enumerate(itertools.product([None, *KVPoll], list(KVPoll))):
            room += 100 * (policy is Policy.STRICT)
            if current is not None:
                store.update_status(room, B)
                store.update_status(room, current)
            prev = list(store.room(room).timelines.get("p", ()))
            result = store.update_status(room, new)
            assert result == apply_rule(current, new, policy), (current, new, policy)
            steps = list(store.room(room).timelines.get("p", ()))
            if result.outcome is Outcome.CREATED:
                assert [s.status for s in steps] == [new]
            elif result.outcome in WRITES:
                assert steps[:-1] == prev and steps[-1].status is new
            else:
                assert steps == prev, (current, new, policy, result)


def test_the_script_appends_as_the_reference_does(backend: RedisUnderTest) -> None:
    """Stored timelines written by hand, one status update each, against kvstatus.timeline.timeline_after."""
    key = KeySchema(backend.namespace).room_key
    store = backend.store(participant="p", timeline=True)
    future = _now_ms() + 3_600_000
    cases = {
        1: "1@1700000000000",  # an hour-old first step: the offset is the time since
        2: "1@1700000000000 2+5",
        3: f"1@{future} 2+70",  # a clock that stepped back: the new offset repeats the last one
        4: f"1@{future}",
        5: "1@1700000000000" + " 2+1" * ((MAX_BYTES - 15) // 4),  # full: the step is dropped
    }
    for room, prev in cases.items():
        backend.raw.hset(key(room), mapping={"p": "1", "t:p": prev})
        before = _now_ms()
        store.update_status(room, T)
        after = _now_ms()
        stored = _raw_timeline(backend, room, "p")
        assert stored in {timeline_after(prev, 3, now) for now in range(before - 5, after + 6)}, (room, stored)
    assert _raw_timeline(backend, 3, "p").endswith(" 3+70")  # type: ignore[union-attr]
    assert _raw_timeline(backend, 4, "p") == f"1@{future} 3+0"
    assert _raw_timeline(backend, 5, "p") == cases[5]


def test_a_malformed_timeline_is_ignored_by_reads_and_replaced_by_the_next_step(backend: RedisUnderTest) -> None:
    """A timeline kvstatus does not write only informs: reads leave it out and name it, and the next status change
    starts a new one (issue 36; it made the update raise, and room() hide the room's statuses)."""
    key = KeySchema(backend.namespace).room_key(9)
    backend.raw.hset(key, mapping={"p": "1", "t:p": "yesterday"})
    store = backend.store(participant="p", timeline=True)
    view = store.room(9)
    assert view.participants["p"].status is B and "p" not in view.timelines
    assert [m for m in view.ignored if "field t:p holds 'yesterday', not a timeline" in m], view.ignored
    assert store.update_status(9, W).outcome is Outcome.ADVANCED
    view = store.room(9)
    assert [step.status for step in view.timelines["p"]] == [W] and view.ignored == ()
    assert store.clear(9) is True
    assert backend.raw.exists(key) == 0


def test_a_store_without_timeline_writes_none_and_keeps_anothers(backend: RedisUnderTest) -> None:
    recording = backend.store(participant="p", timeline=True)
    plain = backend.store(participant="p")
    plain.update_status(11, B)
    assert _raw_timeline(backend, 11, "p") is None
    recording.update_status(11, W)  # an entry without a timeline gets one from its next step
    plain.update_status(11, T)  # a store without timelines writes no step (and removes none)
    steps = plain.room(11).timelines["p"]
    assert [s.status for s in steps] == [W]
    assert plain.pop(11) is T
    assert _raw_timeline(backend, 11, "p") is None  # the clear of any store removes it with the entry


def test_clear_and_pop_remove_the_timeline_and_tell_the_observer(backend: RedisUnderTest) -> None:
    seen: list[tuple[Step, ...]] = []

    class Observer:
        def __getattr__(self, name: str) -> Any:
            return lambda *args, **kwargs: None

        def for_participant(self, participant: Optional[str]) -> Any:
            return self

        def on_cleared(self, steps: tuple[Step, ...]) -> None:
            seen.append(steps)

    store = backend.store(participant="decode-0", timeline=True, metrics=Observer())
    for room in (1, 2):
        for status in (B, W, T, S):
            store.update_status(room, status)
    assert store.clear(1) is True and store.pop(2) is S
    assert [[s.status for s in steps] for steps in seen] == [[B, W, T, S]] * 2
    assert _raw_timeline(backend, 1, "decode-0") is None and _raw_timeline(backend, 2, "decode-0") is None
    assert store.clear(1) is False and len(seen) == 2  # nothing removed: nothing observed


def test_sweep_and_cancel_add_their_failed_step(backend: RedisUnderTest) -> None:
    store = backend.store(participant="decode-0", timeline=True, lease_ttl=3)
    other = backend.store(participant="prefill-0", timeline=True)
    for room in (1, 2):
        store.update_status(room, B)
        other.update_status(room, T)
    other.cancel(2, "router gave up", origin="router")
    backend.raw.hset(f"kvstatus:{backend.namespace}:lease:decode-0", "deadline", 1)  # Redis' clock passed it
    assert sweep(backend.raw, KeySchema(backend.namespace)).swept == 1
    one, two = store.room(1).timelines, store.room(2).timelines
    assert [s.status for s in one["decode-0"]] == [B, F]
    assert [s.status for s in one["prefill-0"]] == [T]
    assert [s.status for s in two["decode-0"]] == [B, F] and [s.status for s in two["prefill-0"]] == [T, F]


def test_a_new_incarnation_starts_its_own_timeline(backend: RedisUnderTest) -> None:
    old = backend.store(participant="prefill-0", lease_ttl=3, timeline=True)
    old.update_status(5, B)
    old.update_status(5, T)
    new = backend.store(participant="prefill-0", lease_ttl=3, timeline=True)
    assert new.update_status(5, B).outcome is Outcome.CREATED  # the old entry is missing for the new process
    assert [s.status for s in new.room(5).timelines["prefill-0"]] == [B]


def test_the_argument_and_the_settings_carry_it(redis_server: Any) -> None:
    with StatusStore.from_url(redis_server.url, namespace="tl-url", participant="p", timeline=True) as store:
        assert store.timeline is True and store.for_participant("q").timeline is True
    with StatusStore.from_url(redis_server.url, namespace="tl-url") as store:
        assert store.timeline is False
    with pytest.raises(InvalidURLError, match="'timeline' is a store setting"):
        StatusStore.from_url(redis_server.url + "?timeline=yes", namespace="tl-url")
    with pytest.raises(Exception, match="timeline must be True or False"):
        StatusStore.from_url(redis_server.url, namespace="tl-url", timeline="yes")


@pytest.mark.parametrize(
    "value",
    ["", "1@", "5@1700000000000", "1@1700000000000 2-5", "1@1700000000000  2+5", "1@017", "1@1700000000000 x"],
)
def test_parse_refuses_what_kvstatus_does_not_write(value: str) -> None:
    with pytest.raises(CorruptedValueError, match="k.*field t:p"):
        parse_timeline(value, "k", "t:p")


def test_parse_refuses_a_timeline_that_goes_back() -> None:
    # Only a hand-written value can: the script never writes an offset below the previous one.
    with pytest.raises(CorruptedValueError, match="goes back"):
        parse_timeline("1@1700000000000 2+50 3+10", "k", "t:p")


def test_stages_and_time_in_the_current_status() -> None:
    steps = parse_timeline(b"1@1700000000000 2+250 3+1250 4+1300", "k", "t:p")
    assert steps[1] == Step(W, 1700000000250)
    assert stage_seconds(steps) == {"bootstrap": 0.25, "waiting": 1.0, "transfer": 0.05, "total": 1.3}
    failed = parse_timeline("1@1700000000000 0+4000", "k", "t:p")
    assert stage_seconds(failed) == {"total": 4.0}
    assert stage_seconds(()) == {} and since_current((), 0) is None
    assert since_current(steps, 1700000002300) == 1.0
    assert since_current(steps, 1700000000000) == 0  # a clock behind the last step reads 0


def test_a_malformed_timeline_does_not_stop_a_near_cached_poll(redis_server: Any) -> None:
    """The near cache keeps no timeline, so it does not read one: a poll answers whatever the field holds."""
    with StatusStore.from_url(redis_server.url, namespace="tl-near", participant="p", near_cache=True) as store:
        store.update_status(12, B)
        redis_server.client().hset(store.schema.room_key(12), "t:p", "garbage")
        assert store.get(12) is B and store.check_status(12) is B


def test_an_entry_past_its_capped_timeline_is_judged_by_its_status(sync_backend: RedisUnderTest) -> None:
    """A seed entry that flips often fills its 160 bytes; its last step then disagrees with its status, and stuck
    and health judged from that stale step (issue 36): a room that just moved read as stuck since the cap."""
    store = sync_backend.store(participant="prefill-0", timeline=True)
    store.update_status(12, B)
    while len(_raw_timeline(sync_backend, 12, "prefill-0") or "") < MAX_BYTES - 20:
        store.update_status(12, F)
        store.update_status(12, B)
    for _ in range(4):  # to the cap: the steps are dropped from here on
        store.update_status(12, F)
        store.update_status(12, B)
    store.update_status(12, W)  # the entry moves on; its timeline cannot say so
    # The first failure the flips recorded (a user the ACL denies HSETNX or TIME writes none) would decide alone.
    sync_backend.raw.hdel(KeySchema(sync_backend.namespace).room_key(12), "room:fate")
    view = store.room(12)
    steps = view.timelines["prefill-0"]
    assert view.participants["prefill-0"].status is W and steps[-1].status is not W
    later = steps[-1].at_ms + 3_600_000
    assert stuck(view, later, older_than=30) is None
    assert classify(view, later, HealthSettings(window=60, older_than=30)) == ("open", None)
    in_step = sync_backend.store(participant="prefill-1", timeline=True)
    in_step.update_status(13, W)
    assert stuck(in_step.room(13), later, older_than=30) is not None  # a timeline in step still judges
