"""The metrics observer, driven with the UpdateResults a real store returns from a real Redis."""

from __future__ import annotations

import subprocess
import sys
from typing import Optional

import pytest
from prometheus_client import CollectorRegistry

from kvstatus import KVPoll, Outcome, StatusStore, UpdateResult
from kvstatus.errors import BackendUnavailableError, InvalidRoomError, SupersededError
from kvstatus.observe.metrics import ERROR_TYPES, OPERATIONS, StoreMetrics, instruments
from tests.helpers.backends import fresh_namespace


def updates(registry: CollectorRegistry, namespace: str, participant: str, outcome: str) -> Optional[float]:
    return registry.get_sample_value(
        "kvstatus_updates_total", {"namespace": namespace, "participant": participant, "outcome": outcome}
    )


@pytest.mark.real
def test_counters_move_per_outcome_as_the_store_says(redis_server) -> None:
    registry = CollectorRegistry()
    namespace = fresh_namespace("metrics")
    seed = StatusStore(redis_server.client(), namespace=namespace, participant="prefill-0")
    strict = StatusStore(redis_server.client(), namespace=namespace, participant="decode-0", policy="strict")
    seen: dict[str, list[Outcome]] = {"prefill-0": [], "decode-0": []}
    observers = {
        "prefill-0": StoreMetrics(namespace, "prefill-0", registry),
        "decode-0": StoreMetrics(namespace, "decode-0", registry),
    }
    script = [
        (seed, 1, KVPoll.Failed),  # IGNORED_MISSING
        (seed, 1, KVPoll.Bootstrapping),  # CREATED
        (seed, 1, KVPoll.Transferring),  # ADVANCED
        (seed, 1, KVPoll.Bootstrapping),  # UNCHANGED
        (seed, 1, KVPoll.Failed),  # FAILED
        (seed, 1, KVPoll.Success),  # ADVANCED (seed: Failed -> Success)
        (strict, 2, KVPoll.Success),  # REFUSED_CREATE
        (strict, 2, KVPoll.Bootstrapping),  # CREATED
        (strict, 2, KVPoll.Failed),  # FAILED
        (strict, 2, KVPoll.Transferring),  # REFUSED_TERMINAL
    ]
    for store, room, status in script:
        result = store.update_status(room, status)
        seen[store.participant].append(result.outcome)
        observers[store.participant].on_update(result)
    # A later incarnation of decode-0 stamped room 2 (in 2286: any real epoch is older); a fenced write is refused.
    fenced = StatusStore(redis_server.client(), namespace=namespace, participant="decode-0", lease_ttl=10)
    redis_server.client().hset(f"kvstatus:{namespace}:{{2}}", "inc:decode-0", 9_999_999_999_999)
    with pytest.raises(SupersededError) as refused:
        fenced.update_status(2, KVPoll.Transferring)
    assert refused.value.results is not None
    result = refused.value.results[2]
    seen["decode-0"].append(result.outcome)
    observers["decode-0"].on_update(result)
    fenced.close()
    assert {o for outcomes in seen.values() for o in outcomes} == set(Outcome)
    for participant, outcomes in seen.items():
        for outcome in Outcome:
            assert updates(registry, namespace, participant, outcome.name) == outcomes.count(outcome), (
                participant,
                outcome,
            )

    batch = seed.update_many(
        {10: KVPoll.Bootstrapping, 11: KVPoll.Failed, 12: KVPoll.WaitingForInput, 1: KVPoll.Success}
    )
    observers["prefill-0"].on_updates(batch.values())
    expected = {o: seen["prefill-0"].count(o) + [r.outcome for r in batch.values()].count(o) for o in Outcome}
    assert expected[Outcome.CREATED] == 3 and expected[Outcome.IGNORED_MISSING] == 2
    for outcome, count in expected.items():
        assert updates(registry, namespace, "prefill-0", outcome.name) == count


def test_every_outcome_series_exists_at_zero_before_any_update() -> None:
    registry = CollectorRegistry()
    StoreMetrics("ns", None, registry)
    for outcome in Outcome:
        assert updates(registry, "ns", "default", outcome.name) == 0


def test_latency_histogram_by_operation() -> None:
    registry = CollectorRegistry()
    metrics = StoreMetrics("ns", "p", registry)
    metrics.on_call("update_status", 0.0002)
    metrics.on_call("update_status", 0.03)
    metrics.on_call("get", 0.00004)
    metrics.on_call("something_new", 1.0)
    labels = {"namespace": "ns", "participant": "p"}
    count = lambda op: registry.get_sample_value("kvstatus_call_duration_seconds_count", {**labels, "operation": op})
    assert count("update_status") == 2 and count("get") == 1 and count("other") == 1 and count("clear") == 0
    assert registry.get_sample_value(
        "kvstatus_call_duration_seconds_sum", {**labels, "operation": "update_status"}
    ) == pytest.approx(0.0302)
    assert (
        registry.get_sample_value(
            "kvstatus_call_duration_seconds_bucket", {**labels, "operation": "update_status", "le": "0.00025"}
        )
        == 1
    )
    assert set(OPERATIONS) >= {"update_status", "update_many", "get", "get_many", "clear", "room"}


def test_errors_by_kvstatus_type_and_resends() -> None:
    registry = CollectorRegistry()
    metrics = StoreMetrics("ns", "p", registry)

    class Custom(BackendUnavailableError):
        pass

    for exc in (BackendUnavailableError("down"), Custom("down"), InvalidRoomError("bad"), RuntimeError("x")):
        metrics.on_error(exc)
    metrics.on_resend()
    metrics.on_resend()
    value = lambda t: registry.get_sample_value(
        "kvstatus_errors_total", {"namespace": "ns", "participant": "p", "type": t}
    )
    assert value("BackendUnavailableError") == 2  # a subclass counts as its nearest kvstatus type
    assert value("InvalidRoomError") == 1 and value("other") == 1 and value("KVStatusError") == 0
    assert "KVStatusError" in ERROR_TYPES and "PermissionDeniedError" in ERROR_TYPES
    assert registry.get_sample_value("kvstatus_resends_total", {"namespace": "ns", "participant": "p"}) == 2


def test_near_cache_instruments() -> None:
    registry = CollectorRegistry()
    metrics = StoreMetrics("ns", "p", registry)
    metrics.on_cache_hit()
    metrics.on_cache_hit(255)
    metrics.on_cache_miss()
    metrics.on_cache_invalidation(3)
    metrics.set_cache_size(42)
    labels = {"namespace": "ns", "participant": "p"}
    assert registry.get_sample_value("kvstatus_nearcache_hits_total", labels) == 256
    assert registry.get_sample_value("kvstatus_nearcache_misses_total", labels) == 1
    assert registry.get_sample_value("kvstatus_nearcache_invalidations_total", labels) == 3
    assert registry.get_sample_value("kvstatus_nearcache_entries", labels) == 42


def test_two_stores_share_one_family_and_no_label_names_a_room() -> None:
    registry = CollectorRegistry()
    a = StoreMetrics("ns", "prefill-0", registry)
    b = a.for_participant("decode-0")
    assert instruments(registry) is instruments(registry)
    b.on_update(UpdateResult(Outcome.CREATED, KVPoll.Bootstrapping))
    assert (
        registry.get_sample_value(
            "kvstatus_updates_total", {"namespace": "ns", "participant": "decode-0", "outcome": "CREATED"}
        )
        == 1
    )
    assert (
        registry.get_sample_value(
            "kvstatus_updates_total", {"namespace": "ns", "participant": "prefill-0", "outcome": "CREATED"}
        )
        == 0
    )
    label_names = {name for family in registry.collect() for sample in family.samples for name in sample.labels}
    assert label_names == {"namespace", "participant", "outcome", "operation", "type", "le", "role", "stage"}
    stage_labels = {
        frozenset(sample.labels)
        for family in registry.collect()
        if family.name == "kvstatus_stage_duration_seconds"
        for sample in family.samples
    }
    assert stage_labels == {frozenset({"namespace", "role", "stage", "le"}), frozenset({"namespace", "role", "stage"})}


def test_core_and_cli_do_not_import_the_optional_extras() -> None:
    code = (
        "import sys, kvstatus, kvstatus.cli\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('prometheus_client', 'starlette', 'uvicorn', 'selenium', 'anyio', 'h11', 'kvstatus') and "
        "(not m.startswith('kvstatus') or m.startswith('kvstatus.observe.')))\n"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
