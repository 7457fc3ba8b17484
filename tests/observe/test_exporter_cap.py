"""Issue 19 item 9: the exporter's series stay bounded as participants grow (2,000 participants gave 10,020
series and 836 KB per scrape): the participants with the most entries keep their label, the rest are summed
under participant="(other)", and no entry goes uncounted."""

from __future__ import annotations

from typing import Any

import fakeredis
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kvstatus.keys import KeySchema
from kvstatus.observe.exporter import OTHER_PARTICIPANTS, NamespaceCollector, build_registry
from kvstatus.observe.scanner import PassLoop
from tests.helpers.backends import fresh_namespace
from tests.observe.support import ServerProcess, scrape, wait_until

PARTICIPANTS = 2_000
PER_NAMESPACE = 23  # every series of a namespace but kvstatus_entries (17, and 6 of kvstatus_rooms_by_failure_stage)


def populate(raw: Any, schema: KeySchema, participants: int = PARTICIPANTS) -> None:
    """Room r holds participants 10r..10r+9; the low-numbered ones also hold entries in room 0 (more entries)."""
    with raw.pipeline(transaction=False) as pipe:
        for first in range(0, participants, 10):
            key = schema.room_key(1 + first // 10)
            pipe.hset(key, mapping={f"decode-{n}": str(1 + n % 4) for n in range(first, first + 10)})
            pipe.pexpire(key, 600_000)
        busy = schema.room_key(0)
        pipe.hset(busy, mapping={f"decode-{n}": "0" for n in range(3)})
        pipe.pexpire(busy, 600_000)
        pipe.execute()


def series(text: bytes) -> dict[str, list[Any]]:
    found: dict[str, list[Any]] = {}
    for family in text_string_to_metric_families(text.decode()):
        for s in family.samples:
            if s.labels.get("namespace"):
                found.setdefault(s.name, []).append(s)
    return found


@pytest.mark.parametrize("cap", [0, 3, 50])
def test_2000_participants_give_a_bounded_number_of_series_and_every_entry_counted(cap: int) -> None:
    raw = fakeredis.FakeRedis()
    schema = KeySchema(fresh_namespace("cap"))
    populate(raw, schema)
    loop = PassLoop(raw, schema, batch=500)
    assert loop.run_once() is not None
    text = generate_latest(build_registry([loop], max_participants=cap))
    found = series(text)
    entries = found["kvstatus_entries"]
    assert len(entries) == 5 * (cap + 1)  # was 5 x 2,000
    assert sum(len(samples) for samples in found.values()) == PER_NAMESPACE + 5 * (cap + 1)
    assert sum(s.value for s in entries) == PARTICIPANTS + 3  # nothing lost in the fold
    names = {s.labels["participant"] for s in entries}
    assert OTHER_PARTICIPANTS in names
    assert {"decode-0", "decode-1", "decode-2"} <= names or cap < 3  # the busiest keep their own label
    other_failed = [
        s.value for s in entries if s.labels["participant"] == OTHER_PARTICIPANTS and s.labels["status"] == "Failed"
    ]
    assert other_failed == [max(3 - cap, 0)]
    assert len(text) < 40_000  # was 836 KB


def test_no_other_series_while_under_the_cap() -> None:
    raw = fakeredis.FakeRedis()
    schema = KeySchema(fresh_namespace("cap"))
    populate(raw, schema, participants=20)
    loop = PassLoop(raw, schema)
    loop.run_once()
    entries = series(generate_latest(build_registry([loop], max_participants=50)))["kvstatus_entries"]
    assert {s.labels["participant"] for s in entries} == {f"decode-{n}" for n in range(20)}


def test_a_negative_cap_is_refused() -> None:
    with pytest.raises(ValueError, match="max_participants"):
        NamespaceCollector([], max_participants=-1)


@pytest.mark.real
def test_the_exporter_process_caps_2000_participants(redis_server: Any) -> None:
    schema = KeySchema(fresh_namespace("cap"))
    populate(redis_server.client(), schema)
    with ServerProcess(
        "--url",
        redis_server.url,
        "exporter",
        schema.namespace,
        "--port",
        "0",
        "--interval",
        "0.5",
        "--max-participants",
        "10",
    ) as exporter:
        samples = wait_until(
            lambda: (s := scrape(exporter.base + "/metrics")) and any(n == "kvstatus_entries" for n, _ in s) and s,
            30,
            "a completed pass",
        )
    entries = {labels: v for (name, labels), v in samples.items() if name == "kvstatus_entries"}
    assert len(entries) == 5 * 11
    assert sum(entries.values()) == PARTICIPANTS + 3


def test_the_help_states_the_bound() -> None:
    from kvstatus.observe.exporter import FIXED_SERIES, series_bound
    from tests.helpers.cli import invoke

    text = " ".join(invoke(lambda url: None, "exporter", "--help").output.split())
    assert (
        f"per namespace {FIXED_SERIES}," in text and f"(with the defaults, 50 and 50: at most {series_bound()})" in text
    )
    assert series_bound(50, 50) == series_bound() == 522  # the help's numbers are the defaults'
    assert "--max-participants" in text and "--max-pairs" in text and 'participant "(other)"' in text
    assert '4 kvstatus_pair_* series for each of at most --max-pairs pairs and one more pair "(other)"' in text
