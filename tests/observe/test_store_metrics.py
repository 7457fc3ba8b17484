"""Library metrics wired into the stores: the counters move as a real store on a real Redis works (issue 13).

The observer (:class:`StoreMetrics`) is given to the store (``metrics=``); nothing here calls a hook by hand.
"""

from __future__ import annotations

import socket
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from kvstatus import KVPoll, Outcome, StatusStore, scripts
from kvstatus.admin.acl import acl_rules
from kvstatus.errors import (
    BackendUnavailableError,
    CorruptedValueError,
    InvalidArgumentError,
    PermissionDeniedError,
    SupersededError,
)
from kvstatus.keys import KeySchema
from kvstatus.model import StoreObserver
from kvstatus.observe.metrics import StoreMetrics
from tests.helpers.backends import RedisUnderTest, fresh_namespace
from tests.nearcache.helpers import eventually
from tests.servers import RedisServer


class Series:
    """The values of one namespace's series in one registry."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self.registry = CollectorRegistry()

    def __call__(self, name: str, participant: str = "p", **labels: str) -> float:
        found = self.registry.get_sample_value(
            name, {"namespace": self.namespace, "participant": participant, **labels}
        )
        assert found is not None, (name, participant, labels)
        return found

    def observer(self, participant: str = "p") -> StoreMetrics:
        return StoreMetrics(self.namespace, participant, self.registry)


def observed(backend: RedisUnderTest, series: Series, participant: str = "p", **settings: Any) -> Any:
    return backend.store(participant=participant, metrics=series.observer(participant), **settings)


def test_every_outcome_and_call_is_counted_through_the_store(backend: RedisUnderTest) -> None:
    series = Series(backend.namespace)
    for script in scripts.ALL:  # so that no first call meets NOSCRIPT (a resend)
        backend.raw.script_load(script.source)
    seed = observed(backend, series, "prefill-0")
    strict = observed(backend, series, "decode-0", policy="strict")
    script = [
        (seed, 1, KVPoll.Failed),  # IGNORED_MISSING
        (seed, 1, KVPoll.Bootstrapping),  # CREATED
        (seed, 1, KVPoll.Transferring),  # ADVANCED
        (seed, 1, KVPoll.Bootstrapping),  # UNCHANGED
        (seed, 1, KVPoll.Failed),  # FAILED
        (strict, 2, KVPoll.Success),  # REFUSED_CREATE
        (strict, 2, KVPoll.Bootstrapping),  # CREATED
        (strict, 2, KVPoll.Failed),  # FAILED
        (strict, 2, KVPoll.Transferring),  # REFUSED_TERMINAL
    ]
    seen: dict[str, list[Outcome]] = {"prefill-0": [], "decode-0": []}
    for store, room, status in script:
        seen[store.participant].append(store.update_status(room, status).outcome)
    # A later incarnation of decode-0 stamped room 2 (lua/update.lua): a fenced write of an older one is refused,
    # and counted as such.
    fenced = observed(backend, series, "decode-0", lease_ttl=10)
    backend.raw.hset(f"kvstatus:{backend.namespace}:{{2}}", "inc:decode-0", 9_999_999_999_999)
    with pytest.raises(SupersededError):
        fenced.update_status(2, KVPoll.Transferring)
    seen["decode-0"].append(Outcome.REFUSED_SUPERSEDED)
    assert {o for outcomes in seen.values() for o in outcomes} == set(Outcome)
    batch = seed.update_many({10: KVPoll.Bootstrapping, 11: KVPoll.Failed, 1: KVPoll.Success})
    assert [r.outcome for r in batch.values()] == [Outcome.CREATED, Outcome.IGNORED_MISSING, Outcome.ADVANCED]
    seen["prefill-0"] += [r.outcome for r in batch.values()]
    for participant, outcomes in seen.items():
        for outcome in Outcome:
            assert series("kvstatus_updates_total", participant, outcome=outcome.name) == outcomes.count(outcome), (
                participant,
                outcome,
            )

    assert seed.get(1) is KVPoll.Success and seed.get_many([1, 10]) == {1: KVPoll.Success, 10: KVPoll.Bootstrapping}
    assert seed.room(1).participants["prefill-0"].status is KVPoll.Success
    seed.record_failure(10, "why")
    seed.clear(10)
    with pytest.raises(KeyError):
        seed.check_status(10)  # an answer ("no entry"), not an error
    calls = {
        op: series("kvstatus_call_duration_seconds_count", "prefill-0", operation=op)
        for op in ("update_status", "update_many", "get", "get_many", "room", "record_failure", "clear", "check_status")
    }
    assert calls == {
        "update_status": 5,
        "update_many": 1,
        "get": 1,
        "get_many": 1,
        "room": 1,
        "record_failure": 1,
        "clear": 1,
        "check_status": 1,
    }
    assert series("kvstatus_call_duration_seconds_sum", "prefill-0", operation="update_status") > 0
    assert series("kvstatus_errors_total", "prefill-0", type="other") == 0
    assert series("kvstatus_resends_total", "prefill-0") == 0


def test_a_script_flush_counts_one_resend_and_no_error(backend: RedisUnderTest) -> None:
    series = Series(backend.namespace)
    store = observed(backend, series)
    assert store.update_status(1, KVPoll.Bootstrapping).outcome is Outcome.CREATED  # loads the script if needed
    resends = series("kvstatus_resends_total")
    backend.raw.script_flush()  # the next EVALSHA meets NOSCRIPT; the loop loads the script and sends it again
    assert store.update_status(1, KVPoll.Transferring).outcome is Outcome.ADVANCED
    assert series("kvstatus_resends_total") == resends + 1
    backend.raw.script_flush()
    batch = store.update_many({1: KVPoll.Success, 2: KVPoll.Bootstrapping})  # one call, or one per slot: one resend
    assert [r.outcome for r in batch.values()] == [Outcome.ADVANCED, Outcome.CREATED]
    assert series("kvstatus_resends_total") == resends + 2
    assert series("kvstatus_updates_total", outcome="ADVANCED") == 2
    assert sum(series("kvstatus_errors_total", type=t) for t in ("other", "BackendError")) == 0


def test_errors_are_counted_by_type(backend: RedisUnderTest) -> None:
    series = Series(backend.namespace)
    store = observed(backend, series)
    backend.raw.hset(store._core.schema.room_key(3), "p", "garbage")
    for _ in range(2):
        with pytest.raises(CorruptedValueError):
            store.get(3)
    with pytest.raises(CorruptedValueError):
        store.update_status(3, KVPoll.Success)
    assert series("kvstatus_errors_total", type="CorruptedValueError") == 3
    assert series("kvstatus_call_duration_seconds_count", operation="get") == 2  # failed calls are timed
    assert series("kvstatus_errors_total", type="PermissionDeniedError") == 0


@pytest.mark.real
def test_acl_refusals_and_an_unreachable_server_are_counted_by_type(redis_server: RedisServer) -> None:
    series = Series(fresh_namespace("metrics"))
    namespace = series.namespace
    admin = redis_server.client()
    admin.execute_command("ACL", "SETUSER", "metrics-ro", *acl_rules(namespace, password="pw-m", read_only=True))
    try:
        url = f"redis://metrics-ro:pw-m@{redis_server.host}:{redis_server.port}/0"
        with StatusStore.from_url(url, namespace=namespace, participant="p", metrics=series.observer("p")) as store:
            assert store.get(1) is None
            with pytest.raises(PermissionDeniedError):
                store.update_status(1, KVPoll.Bootstrapping)
    finally:
        admin.execute_command("ACL", "DELUSER", "metrics-ro")
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with StatusStore.from_url(
        f"redis://127.0.0.1:{port}/0", namespace=namespace, participant="q", retries=0, metrics=series.observer("q")
    ) as down:
        with pytest.raises(BackendUnavailableError):
            down.get(1)
    assert series("kvstatus_errors_total", "p", type="PermissionDeniedError") == 1
    # A refused connection is its own class since issue 19 item 17 (nothing was sent), a BackendUnavailableError.
    assert series("kvstatus_errors_total", "q", type="BackendRefusedError") == 1
    assert series("kvstatus_errors_total", "q", type="BackendUnavailableError") == 0
    assert series("kvstatus_updates_total", "p", outcome="CREATED") == 0


@pytest.mark.real
def test_the_near_cache_counts_hits_misses_invalidations_and_its_size(redis_server: RedisServer) -> None:
    series = Series(fresh_namespace("metrics"))
    namespace = series.namespace
    with StatusStore.from_url(
        redis_server.url, namespace=namespace, participant="w", near_cache=True, metrics=series.observer("w")
    ) as cached:
        rooms = list(range(1, 257))
        assert cached.get_many(rooms) == {room: None for room in rooms}  # 256 misses, one fill
        assert series("kvstatus_nearcache_misses_total", "w") == 256
        assert series("kvstatus_nearcache_entries", "w") == 256
        for _ in range(3):
            assert cached.get_many(rooms)[5] is None
        assert cached.get(5) is None and cached.room(5).participants == {}
        assert series("kvstatus_nearcache_hits_total", "w") == 3 * 256 + 2
        assert series("kvstatus_nearcache_misses_total", "w") == 256

        # Another process's write (a raw client: this process's own stores drop what they write at once, without
        # a message): Redis invalidates the cached room.
        redis_server.client().hset(KeySchema(namespace).room_key(5), "w", int(KVPoll.Bootstrapping))
        eventually(lambda: cached.get(5) is KVPoll.Bootstrapping, what="the change, after its invalidation")
        assert series("kvstatus_nearcache_invalidations_total", "w") == 1
        assert series("kvstatus_nearcache_misses_total", "w") == 257
        # A miss is sent by the store's one send path and timed like any call; cached reads are not timed.
        assert series("kvstatus_call_duration_seconds_count", "w", operation="get") == 1  # the miss of room 5
        assert series("kvstatus_call_duration_seconds_count", "w", operation="get_many") == 1  # one fill

        cached.update_status(6, KVPoll.Bootstrapping)  # its own write: sent (timed), and dropped locally
        assert series("kvstatus_call_duration_seconds_count", "w", operation="update_status") == 1
        assert series("kvstatus_nearcache_entries", "w") == 255
        assert series("kvstatus_nearcache_invalidations_total", "w") == 1  # not a Redis message

        redis_server.client().flushdb()  # a null invalidation drops every room
        eventually(lambda: cached.get(5) is None, what="the flush")
        assert series("kvstatus_nearcache_invalidations_total", "w") == 1 + 255


def test_for_participant_carries_an_observer_of_its_own_participant(backend: RedisUnderTest) -> None:
    series = Series(backend.namespace)
    store = observed(backend, series, "prefill-0")
    other = store.for_participant("decode-0")
    assert isinstance(other.metrics, StoreMetrics) and other.metrics.participant == "decode-0"
    other.update_status(1, KVPoll.Bootstrapping)
    assert series("kvstatus_updates_total", "decode-0", outcome="CREATED") == 1
    assert series("kvstatus_updates_total", "prefill-0", outcome="CREATED") == 0


def test_metrics_are_off_by_default_and_a_wrong_observer_is_refused(backend: RedisUnderTest) -> None:
    assert backend.store().metrics is None
    assert isinstance(StoreMetrics("ns", "p", CollectorRegistry()), StoreObserver)
    for wrong in (True, "prometheus", object()):
        with pytest.raises(InvalidArgumentError, match="on_call, on_update"):
            backend.store(metrics=wrong)
