"""``kvstatus demo --stuck`` (issue 20): a slow decode and a dead prefill beside a pair that serves; ``ls --stuck``
names the rooms and who holds each, ``health`` names both pairs. Run as an operator would, on the embedded
redis-server (about 10 s: marked slow)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kvstatus.demo.stuck import DEAD, FIRST_ROOM, SERVED, SLOW
from tests.helpers.cli import run_cli

pytestmark = [pytest.mark.slow, pytest.mark.real]


def test_the_stuck_demo_names_the_rooms_their_holders_and_the_unhealthy_pairs() -> None:
    result = run_cli("demo", "--stuck", "--json", timeout=300)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    slow = list(range(FIRST_ROOM + SERVED, FIRST_ROOM + SERVED + SLOW))
    after_death = FIRST_ROOM + SERVED + SLOW + DEAD
    holders = {row["room"]: row["holder"] for row in doc["stuck"]}
    assert holders == {**dict.fromkeys(slow, "decode-b-tp0-pp0"), after_death: "prefill (no entry)"}
    pairs = {(p["prefill"], p["decode"]): p for p in doc["health"]["pairs"]}
    served, slowed, dead = (
        pairs["prefill-a", "decode-a"],
        pairs["prefill-a", "decode-b"],
        pairs["prefill-b", "decode-a"],
    )
    assert (served["succeeded"], served["verdict"]) == (SERVED, "healthy")
    assert (slowed["stuck"], slowed["verdict"]) == (SLOW, "UNHEALTHY")
    assert (dead["failed"], dead["failed_by_stage"], dead["verdict"]) == (DEAD, {"lease-lost": DEAD}, "UNHEALTHY")
    assert pairs["(none)", "decode-a"]["stuck"] == 1  # the request sent to the dead prefill
    assert doc["health_exit_code"] == 5


def _table_lines(text: str) -> set[str]:
    """The output's table lines, numbers and spacing aside (rows come in SCAN order)."""
    skipped = ("$", "#", "(exit", "prefill-a serves")
    return {
        re.sub(r"\s+", " ", re.sub(r"[0-9]+(\.[0-9]+)?", "N", line)).strip()
        for line in text.splitlines()
        if line.strip() and not line.startswith(skipped)
    }


def test_the_stuck_demo_prints_both_commands_and_what_the_readme_shows() -> None:
    result = run_cli("demo", "--stuck", timeout=300)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "ls --stuck --older-than 2s" in out and "health --older-than 2s" in out
    assert "(exit code 5)" in out
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    block = readme[readme.index("# kvstatus ls --stuck --older-than 2s") :]
    block = block[: block.index("```")]
    assert _table_lines(out) == _table_lines(block)


def test_faults_and_stuck_are_two_demos() -> None:
    result = run_cli("demo", "--stuck", "--faults")
    assert result.returncode == 2 and "choose one" in result.stderr and "Traceback" not in result.stderr
