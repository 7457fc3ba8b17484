"""A hypothesis state machine: the store, on every backend, against a model built on the reference rules: the
update rule (kvstatus.rule.apply_rule) per entry, and shared fate (kvstatus.rule.shared_status) on every read."""

from __future__ import annotations

from typing import Optional

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    rule,
    run_state_machine_as_test,
)

from kvstatus import KVPoll, Outcome, Policy, apply_rule
from kvstatus.model import OPEN, CancelOutcome, FailureRecord, Stage
from kvstatus.rule import STAGE_OF_STATUS, cancel_outcome, shared_status
from tests.helpers.backends import RedisUnderTest, fresh_namespace
from tests.helpers.depth import DEPTHS, examples

ROOMS = st.sampled_from([0, 1, 2, 2**63 - 1])
PARTICIPANTS = st.sampled_from(["default", "prefill-0", "decode-1"])
STATUSES = st.sampled_from(list(KVPoll))
POLICIES = st.sampled_from(list(Policy))
REASONS = st.text(max_size=20)

Entry = tuple[int, str]
Fate = tuple[Stage, str, str]  # a room's first failure as the model keeps it: stage, origin, reason (no clock)


def run_machine(backend: RedisUnderTest, max_examples: int) -> None:
    class StoreMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.namespace = fresh_namespace("sm")
            self.stores: dict[tuple[str, Policy], object] = {}
            self.status: dict[Entry, KVPoll] = {}
            self.reason: dict[Entry, str] = {}
            self.fate: dict[int, Fate] = {}

        def read(self, room: int, participant: str) -> Optional[KVPoll]:
            """What a read answers under shared fate (the stores' default)."""
            fate = self.fate.get(room)
            record = None if fate is None else FailureRecord(0, *fate)
            return shared_status(self.status.get((room, participant)), record, participant)

        def store(self, participant: str, policy: Policy = Policy.SEED):
            if (participant, policy) not in self.stores:
                self.stores[participant, policy] = backend.store(
                    namespace=self.namespace, participant=participant, policy=policy
                )
            return self.stores[participant, policy]

        def apply(self, room: int, participant: str, status: KVPoll, policy: Policy):
            current = self.status.get((room, participant))
            expected = apply_rule(current, status, policy)
            if expected.outcome is Outcome.FAILED and current is not None:
                reason = self.reason.get((room, participant), "")
                self.fate.setdefault(room, (STAGE_OF_STATUS[current], participant, reason))
            if expected.status is None:
                self.status.pop((room, participant), None)
            else:
                if expected.outcome is Outcome.ADVANCED and self.status[room, participant] is KVPoll.Failed:
                    self.reason.pop((room, participant), None)
                self.status[room, participant] = expected.status
            return expected

        @rule(room=ROOMS, participant=PARTICIPANTS, status=STATUSES, policy=POLICIES)
        def update(self, room: int, participant: str, status: KVPoll, policy: Policy) -> None:
            expected = self.apply(room, participant, status, policy)
            assert self.store(participant, policy).update_status(room, status) == expected

        @rule(updates=st.dictionaries(ROOMS, STATUSES, max_size=4), participant=PARTICIPANTS, policy=POLICIES)
        def update_many(self, updates: dict[int, KVPoll], participant: str, policy: Policy) -> None:
            expected = {room: self.apply(room, participant, status, policy) for room, status in updates.items()}
            assert self.store(participant, policy).update_many(updates) == expected

        @rule(room=ROOMS, participant=PARTICIPANTS)
        def clear(self, room: int, participant: str) -> None:
            had = self.status.pop((room, participant), None) is not None
            had |= self.reason.pop((room, participant), None) is not None
            left = any(r == room for r, _ in self.status.keys() | self.reason.keys())
            fate = self.fate.get(room)
            if had and not left and fate is not None and fate[0] is not Stage.CANCELLED:
                del self.fate[room]  # the last entry takes the room's record with it; a cancel's stays
            assert self.store(participant).clear(room) is had

        @rule(room=ROOMS, origin=PARTICIPANTS, reason=REASONS)
        def cancel(self, room: int, origin: str, reason: str) -> None:
            statuses = [status for (r, _), status in self.status.items() if r == room]
            expected = cancel_outcome(statuses, room in self.fate)
            failed = 0
            if expected is not CancelOutcome.ALREADY_SERVED:  # a fully served room is left as it is
                for (r, participant), status in list(self.status.items()):
                    if r == room and status in OPEN:
                        self.status[r, participant] = KVPoll.Failed
                        self.reason.setdefault((r, participant), f"cancelled by {origin}: {reason}")
                        failed += 1
                self.fate.setdefault(room, (Stage.CANCELLED, origin, reason))
            result = self.store("default").cancel(room, reason, origin=origin)
            assert (result.outcome, result.failed) == (expected, failed)

        @rule(room=ROOMS, participant=PARTICIPANTS, reason=REASONS)
        def record_failure(self, room: int, participant: str, reason: str) -> None:
            recorded = (room, participant) in self.status and (room, participant) not in self.reason
            if recorded:
                self.reason[room, participant] = reason
                fate = self.fate.get(room)
                if fate is not None and fate[0] is not Stage.CANCELLED and fate[1:] == (participant, ""):
                    self.fate[room] = (fate[0], participant, reason)  # fills in the reason its Failed lacked
            assert self.store(participant).record_failure(room, reason) is recorded

        @rule(rooms=st.lists(ROOMS, max_size=5), participant=PARTICIPANTS)
        def get_many(self, rooms: list[int], participant: str) -> None:
            expected = {room: self.read(room, participant) for room in rooms}
            assert self.store(participant).get_many(rooms) == expected

        @rule(room=ROOMS, participant=PARTICIPANTS)
        def get_and_check(self, room: int, participant: str) -> None:
            store = self.store(participant)
            expected: Optional[KVPoll] = self.read(room, participant)
            assert store.get(room) == expected
            try:
                assert store.check_status(room) == expected
            except KeyError:
                assert expected is None

        @rule(room=ROOMS)
        def room_view(self, room: int) -> None:
            view = self.store("default").room(room)
            names = {p for r, p in self.status.keys() | self.reason.keys() if r == room}
            assert {name: tuple(entry) for name, entry in view.participants.items()} == {
                name: (self.status.get((room, name)), self.reason.get((room, name))) for name in names
            }
            failure = view.failure
            assert (None if failure is None else tuple(failure)[1:]) == self.fate.get(room)
            assert self.store("default").failure(room) == failure

        @invariant()
        def keys_match_model_and_all_have_ttl(self) -> None:
            rooms = {room for room, _ in self.status.keys() | self.reason.keys()} | self.fate.keys()
            store = self.store("default")
            assert backend.room_keys(self.namespace) == sorted(store.schema.room_key(r) for r in rooms)
            assert backend.keys_without_ttl(self.namespace) == []

    run_state_machine_as_test(
        StoreMachine,
        settings=settings(
            max_examples=max_examples,
            stateful_step_count=25,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )


@DEPTHS
def test_store_behaves_like_the_reference_model(backend: RedisUnderTest, deep: bool) -> None:
    run_machine(backend, max_examples=examples(deep, 60 if backend.name.startswith("fake") else 40))
