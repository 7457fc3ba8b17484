"""Issue 20: the stage-duration histogram, observed by a real store as its clear and pop remove entries.

A store with ``timeline=True`` hands each removed entry's timeline to its observer's optional ``on_cleared``;
:class:`StoreMetrics` observes the stages of :func:`kvstatus.timeline.stage_seconds` by role, never by
participant or room. An observer without ``on_cleared`` keeps working.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any, Optional

import pytest
from prometheus_client import CollectorRegistry

from kvstatus import KVPoll
from kvstatus.model import HOOKS, ClearedObserver, Step, StoreObserver, check_observer
from kvstatus.observe.metrics import STAGE_BUCKETS, StoreMetrics
from kvstatus.timeline import STAGES, stage_seconds
from tests.helpers.backends import RedisUnderTest

B, W, T, S, F = KVPoll.Bootstrapping, KVPoll.WaitingForInput, KVPoll.Transferring, KVPoll.Success, KVPoll.Failed
PAUSE = 0.015  # seconds in each status, so that every stage lasts a measurable time by Redis' clock
HISTOGRAM = "kvstatus_stage_duration_seconds"


def sample(registry: CollectorRegistry, suffix: str, namespace: str, role: str, stage: str, **extra: str) -> float:
    found = registry.get_sample_value(
        HISTOGRAM + suffix, {"namespace": namespace, "role": role, "stage": stage, **extra}
    )
    assert found is not None, (suffix, role, stage, extra)
    return found


def walk(store: Any, room: int, statuses: tuple[KVPoll, ...]) -> tuple[Step, ...]:
    """Write ``statuses`` one after another, PAUSE apart; the timeline the entry carries then."""
    for i, status in enumerate(statuses):
        if i:
            time.sleep(PAUSE)
        store.update_status(room, status)
    steps = store.room(room).timelines[store.participant]
    assert [s.status for s in steps] == list(statuses)
    return steps  # type: ignore[no-any-return]


def test_cleared_and_popped_entries_fill_the_histogram_by_role_and_stage(backend: RedisUnderTest) -> None:
    registry = CollectorRegistry()
    namespace = backend.namespace
    stores = {
        name: backend.store(participant=name, timeline=True, metrics=StoreMetrics(namespace, name, registry))
        for name in ("decode-tp0-pp0", "prefill-0", "x")
    }
    expected: dict[tuple[str, str], list[float]] = defaultdict(list)

    def removed(role: str, steps: tuple[Step, ...]) -> None:
        for stage, seconds in stage_seconds(steps).items():
            expected[(role, stage)].append(seconds)

    decode = stores["decode-tp0-pp0"]
    steps = walk(decode, 1, (B, W, T, S))  # decode: one cleared, one popped
    assert decode.clear(1) is True
    removed("decode", steps)
    steps = walk(decode, 2, (B, W, T, S))
    assert decode.pop(2) is S
    removed("decode", steps)
    steps = walk(stores["prefill-0"], 3, (B, W, T, S))
    assert stores["prefill-0"].pop(3) is S
    removed("prefill", steps)
    steps = walk(stores["x"], 4, (B, W, T, S))
    assert stores["x"].clear(4) is True
    removed("other", steps)
    aborted = walk(decode, 5, (B, F))  # an abort: no stage but the total
    assert decode.clear(5) is True
    removed("decode", aborted)
    assert set(stage_seconds(aborted)) == {"total"}

    assert stores["prefill-0"].clear(3) is False  # nothing removed: nothing observed
    stores["x"].update_status(6, B)  # an entry left alone is not observed either

    for role in ("decode", "prefill", "other"):
        for stage in STAGES:
            values = expected[(role, stage)]
            assert sample(registry, "_count", namespace, role, stage) == len(values), (role, stage)
            assert sample(registry, "_sum", namespace, role, stage) == pytest.approx(sum(values)), (role, stage)
    # Every walked stage lasted at least PAUSE by Redis' clock, and far less than a second on this box.
    assert min(v for (role, stage), values in expected.items() if stage != "total" for v in values) >= PAUSE - 0.002
    assert sample(registry, "_count", namespace, "decode", "total") == 3
    assert sample(registry, "_count", namespace, "decode", "transfer") == 2
    assert sample(registry, "_bucket", namespace, "decode", "transfer", le="0.001") == 0
    assert sample(registry, "_bucket", namespace, "decode", "transfer", le="600.0") == 2
    assert STAGE_BUCKETS[0] == 0.001 and STAGE_BUCKETS[-1] == 600.0 and 300.0 in STAGE_BUCKETS
    labels = {
        frozenset(s.labels)
        for family in registry.collect()
        if family.name == HISTOGRAM
        for s in family.samples
        if s.name == HISTOGRAM + "_count"
    }
    assert labels == {frozenset({"namespace", "role", "stage"})}  # no participant, no room


def test_for_participant_carries_the_new_participants_role() -> None:
    registry = CollectorRegistry()
    metrics = StoreMetrics("ns", "prefill-a-tp1-pp0", registry).for_participant("decode-b-tp0-pp0")
    metrics.on_cleared((Step(B, 1_000), Step(W, 1_250), Step(T, 1_500), Step(S, 3_500)))
    assert sample(registry, "_sum", "ns", "decode", "bootstrap") == 0.25
    assert sample(registry, "_sum", "ns", "decode", "transfer") == 2.0
    assert sample(registry, "_sum", "ns", "decode", "total") == 2.5
    assert sample(registry, "_count", "ns", "prefill", "total") == 0  # pre-bound, never observed


class PlainObserver:
    """An observer written before timelines: every hook of HOOKS, no on_cleared."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def on_call(self, operation: str, seconds: float) -> None:
        self.calls.append(operation)

    def on_update(self, result: Any) -> None:
        pass

    def on_updates(self, results: Any) -> None:
        pass

    def on_error(self, exc: BaseException) -> None:
        raise AssertionError(f"no error expected: {exc!r}")

    def on_resend(self) -> None:
        pass

    def on_cache_hit(self, count: int = 1) -> None:
        pass

    def on_cache_miss(self, count: int = 1) -> None:
        pass

    def on_cache_invalidation(self, count: int = 1) -> None:
        pass

    def set_cache_size(self, entries: int) -> None:
        pass

    def for_participant(self, participant: Optional[str]) -> PlainObserver:
        return self


def test_an_observer_without_on_cleared_still_works(backend: RedisUnderTest) -> None:
    observer = PlainObserver()
    assert "on_cleared" not in HOOKS and check_observer(observer) is observer
    assert isinstance(observer, StoreObserver) and not isinstance(observer, ClearedObserver)
    assert isinstance(StoreMetrics("ns", "p", CollectorRegistry()), ClearedObserver)
    store = backend.store(participant="decode-0", timeline=True, metrics=observer)
    for room in (1, 2):
        walk(store, room, (B, W, T, S))
    assert store.clear(1) is True and store.pop(2) is S
    assert store.room(1).timelines == {} and observer.calls.count("clear") == 1 and "pop" in observer.calls
