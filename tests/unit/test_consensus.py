"""The room consensus rule (kvstatus.rule), pure Python: a table written from the issue, and the batch fast path."""

from __future__ import annotations

from typing import Optional

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvstatus import InvalidArgumentError, KVPoll, LeaseState, RoomConsensus
from kvstatus.rule import Entries, consensus_many, room_consensus, validate_participants

F, B, W, T, S = KVPoll.Failed, KVPoll.Bootstrapping, KVPoll.WaitingForInput, KVPoll.Transferring, KVPoll.Success
NONE, ALIVE, LOST = LeaseState.NONE, LeaseState.ALIVE, LeaseState.LOST
P = ("prefill-0", "decode-0", "decode-1")

# (statuses, leases, reasons) -> expected RoomConsensus; participants are P in order.
CASES = [
    # The minimum over the entries when everyone has one and nobody is lost.
    ((T, W, S), (ALIVE, ALIVE, ALIVE), {}, RoomConsensus(W)),
    ((S, S, S), (NONE, NONE, NONE), {}, RoomConsensus(S)),
    # Bootstrapping while an expected participant has no entry yet (SGLang's PP consensus).
    ((S, None, T), (ALIVE, ALIVE, ALIVE), {}, RoomConsensus(B, None, (), ("decode-0",))),
    ((None, None, None), (NONE, NONE, NONE), {}, RoomConsensus(B, None, (), P)),
    # A lost lease with an open entry fails the room, naming the participant; it wins over a missing entry.
    ((T, W, T), (ALIVE, LOST, ALIVE), {}, RoomConsensus(F, "participant decode-0 lost its lease", ("decode-0",))),
    (
        (B, None, T),
        (LOST, ALIVE, ALIVE),
        {},
        RoomConsensus(F, "participant prefill-0 lost its lease", ("prefill-0",), ("decode-0",)),
    ),
    (
        (T, B, W),
        (LOST, LOST, ALIVE),
        {},
        RoomConsensus(F, "participant prefill-0 lost its lease", ("prefill-0", "decode-0")),
    ),
    # A lost participant whose entry is terminal no longer holds the room back.
    ((S, T, T), (LOST, ALIVE, ALIVE), {}, RoomConsensus(T, None, ("prefill-0",))),
    # ... nor does one with no entry: that is "not yet there", as without leases.
    ((None, T, T), (LOST, ALIVE, ALIVE), {}, RoomConsensus(B, None, ("prefill-0",), ("prefill-0",))),
    # A participant that never held a lease is never lost, whatever its entry.
    ((T, T, B), (NONE, ALIVE, NONE), {}, RoomConsensus(B)),
    # Failed by the minimum carries the first recorded reason (e.g. the sweeper's).
    (
        (S, F, F),
        (ALIVE, LOST, ALIVE),
        {"decode-0": "participant decode-0 lost its lease", "decode-1": "timeout"},
        RoomConsensus(F, "participant decode-0 lost its lease", ("decode-0",)),
    ),
    ((F, T, T), (ALIVE, ALIVE, ALIVE), {}, RoomConsensus(F)),
]


@pytest.mark.parametrize("statuses, leases, reasons, expected", CASES)
def test_the_rule(statuses: tuple, leases: tuple, reasons: dict, expected: RoomConsensus) -> None:
    assert room_consensus(P, statuses, leases, reasons) == expected


STATUS = st.one_of(st.none(), st.sampled_from(list(KVPoll)))


@given(
    st.lists(st.lists(STATUS, min_size=3, max_size=3), min_size=1, max_size=20),
    st.lists(st.sampled_from(list(LeaseState)), min_size=3, max_size=3),
    st.dictionaries(st.integers(0, 59), st.text(min_size=1, max_size=5)),
)
def test_the_batch_agrees_with_the_rule_room_by_room(
    rooms: list[list[Optional[KVPoll]]], leases: list[LeaseState], raw_reasons: dict[int, str]
) -> None:
    flat = [s for room in rooms for s in room]
    reasons = {k: v for k, v in raw_reasons.items() if k < len(flat) and flat[k] == KVPoll.Failed}
    ids = list(range(100, 100 + len(rooms)))
    codes = ["".join("-" if s is None else str(s.value) for s in room) for room in rooms]
    got = consensus_many(Entries(ids, P, codes, leases, reasons, [0] * len(P)))
    for i, room in enumerate(ids):
        own = {P[k - 3 * i]: text for k, text in reasons.items() if 3 * i <= k < 3 * i + 3}
        assert got[room] == room_consensus(P, rooms[i], leases, own)


@pytest.mark.parametrize("bad", [[], "prefill-0", ["a", "a"], ["a{b}"], [f"p{i}" for i in range(65)], [3]])
def test_participants_are_validated(bad: object) -> None:
    with pytest.raises(InvalidArgumentError):
        validate_participants(bad)  # type: ignore[arg-type]
