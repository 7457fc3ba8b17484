"""Participant naming and stuck rooms (kvstatus.keys.naming, kvstatus.stuck): pure functions, no Redis."""

from __future__ import annotations

from typing import Optional

import pytest

from kvstatus.keys import Naming, naming, role_of
from kvstatus.model import FailureRecord, KVPoll, ParticipantEntry, RoomView, Stage, Step
from kvstatus.stuck import Stuck, stuck

B, W, T, S, F = KVPoll.Bootstrapping, KVPoll.WaitingForInput, KVPoll.Transferring, KVPoll.Success, KVPoll.Failed
T0 = 1_700_000_000_000


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("prefill-tp0-pp0", Naming("prefill", "prefill")),
        ("decode-a-tp3-pp1", Naming("decode", "decode-a")),
        ("prefill-east-2-dp1-adp0-cp1-tp0-pp0", Naming("prefill", "prefill-east-2")),
        ("decode", Naming("decode", "decode")),
        ("router", Naming("other", "router")),
        ("prefiller-tp0", Naming("other", "prefiller-tp0")),
    ],
)
def test_naming(name: str, expected: Naming) -> None:
    assert naming(name) == expected and role_of(name) == expected.role


def _view(entries: dict[str, tuple[KVPoll, int]], failed: bool = False) -> RoomView:
    """A room whose entries reached their status at T0 + the given ms (one step each)."""
    failure = FailureRecord(T0 / 1000, Stage.CANCELLED, "router", "gave up") if failed else None
    return RoomView(
        7,
        {name: ParticipantEntry(status, None) for name, (status, _) in entries.items()},
        1000,
        None,
        failure,
        {name: (Step(status, T0 + at),) for name, (status, at) in entries.items()},
    )


@pytest.mark.parametrize(
    ("entries", "expected"),
    [
        # the lower status holds the room back
        ({"prefill-tp0-pp0": (T, 0), "decode-tp0-pp0": (W, 1000)}, Stuck(7, "decode-tp0-pp0", W, 59.0)),
        # a role with no entry at all comes first: the prefill never wrote
        ({"decode-tp0-pp0": (W, 0)}, Stuck(7, "prefill (no entry)", None, 60.0)),
        ({"prefill-a-tp0-pp0": (B, 0)}, Stuck(7, "decode (no entry)", None, 60.0)),
        ({"x": (B, 0), "y": (T, 0)}, Stuck(7, "x", B, 60.0)),
        # done or moving: not stuck
        ({"prefill-tp0-pp0": (S, 0), "decode-tp0-pp0": (S, 0)}, None),
        ({"prefill-tp0-pp0": (T, 0), "decode-tp0-pp0": (T, 45_000)}, None),
    ],
)
def test_who_holds_a_stuck_room(entries: dict[str, tuple[KVPoll, int]], expected: Optional[Stuck]) -> None:
    assert stuck(_view(entries), T0 + 60_000, older_than=30) == expected


def test_ties_go_to_the_entry_that_waited_longest() -> None:
    view = _view({"prefill-tp0-pp0": (B, 2000), "prefill-tp1-pp0": (B, 0), "decode-tp0-pp0": (T, 0)})
    assert stuck(view, T0 + 60_000, older_than=30) == Stuck(7, "prefill-tp1-pp0", B, 58.0)


def test_a_failed_room_or_one_without_timelines_is_not_judged() -> None:
    assert stuck(_view({"x": (B, 0)}, failed=True), T0 + 60_000) is None
    bare = _view({"x": (B, 0)})._replace(timelines={})
    assert stuck(bare, T0 + 60_000) is None


def test_a_room_a_dead_participant_left_is_stuck_at_once_and_held_by_it() -> None:
    view = _view({"prefill-tp0-pp0": (T, 0), "decode-tp0-pp0": (W, 1000)})
    assert stuck(view, T0 + 2000) is None  # moving 1 s ago: not stuck by its timelines
    found = stuck(view, T0 + 2000, dead={"prefill-tp0-pp0": T0 + 500})
    assert found == Stuck(7, "prefill-tp0-pp0", T, 1.0, dead=True)
    assert found.to_json() == {
        "room": 7,
        "holder": "prefill-tp0-pp0",
        "status": "Transferring",
        "seconds": 1.0,
        "dead": True,
    }
    assert stuck(_view({"prefill-tp0-pp0": (T, 0)}, failed=True), T0 + 2000, dead={"prefill-tp0-pp0": T0}) is None
    done = _view({"prefill-tp0-pp0": (S, 0), "decode-tp0-pp0": (W, 1000)})
    assert stuck(done, T0 + 2000, dead={"prefill-tp0-pp0": T0}) is None  # its part was done: it holds nothing


def test_deaths_tell_the_entries_a_dead_or_restarted_participant_left() -> None:
    from kvstatus.admin.reads import Deaths, LeaseInfo

    def lease(name: str, state: str, epoch: int) -> LeaseInfo:
        return LeaseInfo(
            name, state, "ab", 1, since=T0 / 1000, last_seen=T0 / 1000 + 1, deadline=0, ttl=3, now=0, epoch=epoch
        )

    view = RoomView(
        7,
        {
            "prefill-0": ParticipantEntry(T, None),
            "decode-0": ParticipantEntry(W, None),
            "decode-1": ParticipantEntry(S, None),
        },
        1000,
        stamps={"prefill-0": 5, "decode-0": 9, "decode-1": 5},
    )
    alive = Deaths({"prefill-0": lease("prefill-0", "alive", 5), "decode-0": lease("decode-0", "alive", 9)})
    assert alive.left(view) == {}  # the incarnations that wrote the entries still hold the leases
    restarted = Deaths({"prefill-0": lease("prefill-0", "alive", 6), "decode-1": lease("decode-1", "alive", 6)})
    assert restarted.left(view) == {"prefill-0": T0}  # since the new incarnation took the name; decode-1 is done
    lost = Deaths({"decode-0": lease("decode-0", "expired", 9)})
    assert lost.left(view) == {"decode-0": T0 + 1000} and lost.lost == ["decode-0"]
    assert lost.until_served("decode-0", T0) == float("inf") and restarted.until_served("prefill-0", T0) == T0
