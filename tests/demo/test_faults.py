"""``kvstatus demo --faults``: a peer killed, restarted or paused in another process, a room cancelled from a
third; run as an operator would, on the embedded redis-server (about 30 s: marked slow)."""

from __future__ import annotations

import json

import pytest

from kvstatus.demo.faults import FAULTS, UPSTREAM
from tests.helpers.cli import run_cli

pytestmark = [pytest.mark.slow, pytest.mark.real]


def test_every_fault_fails_the_room_for_the_survivor_with_its_cause_and_a_pause_fails_nothing() -> None:
    result = run_cli("demo", "--faults", "--json", timeout=300)
    assert result.returncode == 0, result.stderr
    assert "embedded redis-server" in result.stderr
    doc = json.loads(result.stdout)
    assert doc["lease_ttl_s"] == 3.0
    trials = {t["fault"]: t for t in doc["trials"]}
    assert list(trials) == list(FAULTS)
    for fault in (f for f in FAULTS if f != "pause"):
        assert trials[fault]["seconds_to_failed"] is not None, trials[fault]
        assert trials[fault]["sglang_alone"] == UPSTREAM[fault]
    # A SIGKILL closes the process's presence: the survivor's watch names the death, without the lease's TTL.
    assert trials["kill"]["cause"] == "failed: participant prefill-0 died: its connection to Redis closed"
    assert trials["kill-decode"]["cause"] == "failed: participant decode-0 died: its connection to Redis closed"
    assert trials["kill-unwritten"]["cause"] == (
        "failed: participant prefill-0 died: its connection to Redis closed; this room waits on it at 10.0.0.7:8998"
    )
    assert trials["kill-done"]["cause"] == trials["kill-unwritten"]["cause"]  # the prefill's Success stays
    assert trials["restart"]["cause"] == (
        "failed: participant prefill-0 restarted; this entry was its previous incarnation's"
    )
    assert trials["restart-done"]["cause"] == (
        "failed: participant prefill-0 restarted; this room waited on its previous incarnation at 10.0.0.7:8998"
    )
    for fault in ("cancel", "cancel-near"):
        assert trials[fault]["cause"] == "cancelled by router-0: the client went away"
    assert trials["pause"] == {
        "fault": "pause",
        "seconds_to_failed": None,
        "cause": "-",
        "sglang_alone": UPSTREAM["pause"],
    }


def test_the_fault_table_is_one_screen() -> None:
    result = run_cli("demo", "--faults", timeout=300)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    header = next(line for line in lines if line.startswith("FAULT"))
    assert header.split()[:4] == ["FAULT", "KVSTATUS:", "FAILED", "AFTER"]
    rows = lines[lines.index(header) + 1 :]
    assert [row.split()[0] for row in rows] == list(FAULTS)
    assert "nothing failed" in rows[-1] and "300 s" in rows[0]
    assert "docs/e2e.md" in result.stdout  # where the same faults are timed on real SGLang servers
    assert len(lines) <= 24
