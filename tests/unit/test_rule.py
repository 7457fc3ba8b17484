"""The pure-Python reference rule against the table of "The update rule" in docs/guide.md, and status parsing."""

from __future__ import annotations

from typing import Optional

import pytest

from kvstatus import InvalidStatusError, KVPoll, Outcome, Policy, apply_rule
from kvstatus.admin.views import explain, parse_status
from kvstatus.model import to_policy, to_status

F, B, W, T, S = KVPoll  # Failed, Bootstrapping, WaitingForInput, Transferring, Success

# (stored, new) -> (outcome, result) under seed, written out row by row from the guide's rule table.
SEED_TABLE: dict[tuple[Optional[KVPoll], KVPoll], tuple[Outcome, Optional[KVPoll]]] = {
    (None, F): (Outcome.IGNORED_MISSING, None),
    (None, B): (Outcome.CREATED, B),
    (None, W): (Outcome.CREATED, W),
    (None, T): (Outcome.CREATED, T),
    (None, S): (Outcome.CREATED, S),
    (F, F): (Outcome.UNCHANGED, F),
    (F, B): (Outcome.ADVANCED, B),
    (F, W): (Outcome.ADVANCED, W),
    (F, T): (Outcome.ADVANCED, T),
    (F, S): (Outcome.ADVANCED, S),
    (B, F): (Outcome.FAILED, F),
    (B, B): (Outcome.UNCHANGED, B),
    (B, W): (Outcome.ADVANCED, W),
    (B, T): (Outcome.ADVANCED, T),
    (B, S): (Outcome.ADVANCED, S),
    (W, F): (Outcome.FAILED, F),
    (W, B): (Outcome.UNCHANGED, W),
    (W, W): (Outcome.UNCHANGED, W),
    (W, T): (Outcome.ADVANCED, T),
    (W, S): (Outcome.ADVANCED, S),
    (T, F): (Outcome.FAILED, F),
    (T, B): (Outcome.UNCHANGED, T),
    (T, W): (Outcome.UNCHANGED, T),
    (T, T): (Outcome.UNCHANGED, T),
    (T, S): (Outcome.ADVANCED, S),
    (S, F): (Outcome.FAILED, F),
    (S, B): (Outcome.UNCHANGED, S),
    (S, W): (Outcome.UNCHANGED, S),
    (S, T): (Outcome.UNCHANGED, S),
    (S, S): (Outcome.UNCHANGED, S),
}

# (stored, new) -> (outcome, result) under strict, written out row by row from that table on its own (not
# derived from SEED_TABLE), so a wrong row in either table, or in apply_rule, cannot hide behind the other.
STRICT_TABLE: dict[tuple[Optional[KVPoll], KVPoll], tuple[Outcome, Optional[KVPoll]]] = {
    (None, F): (Outcome.IGNORED_MISSING, None),
    (None, B): (Outcome.CREATED, B),
    (None, W): (Outcome.CREATED, W),
    (None, T): (Outcome.REFUSED_CREATE, None),
    (None, S): (Outcome.REFUSED_CREATE, None),
    (F, F): (Outcome.UNCHANGED, F),
    (F, B): (Outcome.REFUSED_TERMINAL, F),
    (F, W): (Outcome.REFUSED_TERMINAL, F),
    (F, T): (Outcome.REFUSED_TERMINAL, F),
    (F, S): (Outcome.REFUSED_TERMINAL, F),
    (B, F): (Outcome.FAILED, F),
    (B, B): (Outcome.UNCHANGED, B),
    (B, W): (Outcome.ADVANCED, W),
    (B, T): (Outcome.ADVANCED, T),
    (B, S): (Outcome.ADVANCED, S),
    (W, F): (Outcome.FAILED, F),
    (W, B): (Outcome.UNCHANGED, W),
    (W, W): (Outcome.UNCHANGED, W),
    (W, T): (Outcome.ADVANCED, T),
    (W, S): (Outcome.ADVANCED, S),
    (T, F): (Outcome.FAILED, F),
    (T, B): (Outcome.UNCHANGED, T),
    (T, W): (Outcome.UNCHANGED, T),
    (T, T): (Outcome.UNCHANGED, T),
    (T, S): (Outcome.ADVANCED, S),
    (S, F): (Outcome.FAILED, F),
    (S, B): (Outcome.UNCHANGED, S),
    (S, W): (Outcome.UNCHANGED, S),
    (S, T): (Outcome.UNCHANGED, S),
    (S, S): (Outcome.UNCHANGED, S),
}
EVERY_PAIR = {(current, new) for current in (None, *KVPoll) for new in KVPoll}
# The rule: strict closes exactly two holes (late creates, leaving Failed) and is "otherwise as seed".
STRICT_HOLES = {(None, T), (None, S), (F, B), (F, W), (F, T), (F, S)}


@pytest.mark.parametrize("table", [SEED_TABLE, STRICT_TABLE], ids=["seed", "strict"])
def test_tables_cover_every_pair(table: dict) -> None:
    assert set(table) == EVERY_PAIR


def test_the_tables_differ_exactly_where_design_says_strict_differs() -> None:
    assert {pair for pair in EVERY_PAIR if SEED_TABLE[pair] != STRICT_TABLE[pair]} == STRICT_HOLES
    assert all(STRICT_TABLE[pair][0] in (Outcome.REFUSED_CREATE, Outcome.REFUSED_TERMINAL) for pair in STRICT_HOLES)


@pytest.mark.parametrize("policy, table", [(Policy.SEED, SEED_TABLE), (Policy.STRICT, STRICT_TABLE)])
def test_reference_rule_matches_design_table(policy: Policy, table: dict) -> None:
    for (current, new), expected in table.items():
        assert tuple(apply_rule(current, new, policy)) == expected, (current, new, policy)


def test_default_policy_is_seed() -> None:
    assert apply_rule(F, S) == (Outcome.ADVANCED, S)


def test_refreshes_ttl_exactly_for_outcomes_that_leave_an_entry_written_or_touched() -> None:
    assert {o for o in Outcome if o.refreshes_ttl} == {
        Outcome.CREATED,
        Outcome.ADVANCED,
        Outcome.FAILED,
        Outcome.UNCHANGED,
    }


@pytest.mark.parametrize("value", [True, False, -1, 5, 1.0, "1", None, b"1"])
def test_to_status_rejects_everything_but_members_and_small_ints(value: object) -> None:
    with pytest.raises(InvalidStatusError, match="invalid status"):
        to_status(value)


def test_to_status_accepts_members_and_ints() -> None:
    assert [to_status(v) for v in (0, 1, 2, 3, 4, KVPoll.Success)] == [F, B, W, T, S, S]


@pytest.mark.parametrize("text, expected", [("failed", F), ("TRANSFERRING", T), (" 4 ", S), ("waitingforinput", W)])
def test_parse_status_takes_names_and_numbers(text: str, expected: KVPoll) -> None:
    assert parse_status(text) is expected


@pytest.mark.parametrize("text", ["", "done", "7", "-1", "1.0"])
def test_parse_status_names_the_choices(text: str) -> None:
    with pytest.raises(InvalidStatusError, match="Bootstrapping=1"):
        parse_status(text)


def test_policy_validation() -> None:
    assert to_policy("strict") is Policy.STRICT
    with pytest.raises(ValueError, match="'seed' or 'strict'"):
        to_policy("lenient")


def test_explain_names_the_rule_and_the_reason() -> None:
    text = explain(None, F)
    assert "IGNORED_MISSING" in text and "resurrect" in text
    assert "REFUSED_TERMINAL" in explain(F, S, Policy.STRICT)
    assert "ADVANCED -> Success(4)" in explain(F, S, Policy.SEED)
