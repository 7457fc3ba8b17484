"""Issue 20 items 2 and 4 in the exporter: the open rooms' waiting times, the prefill-decode pairs' health
gauges (bounded: at most --max-pairs pairs keep their labels), and /ready for a Kubernetes probe."""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from typing import Any

import fakeredis
import pytest
import redis
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kvstatus.admin.health import HealthSettings
from kvstatus.admin.reads import server_ms
from kvstatus.keys import KeySchema
from kvstatus.observe.exporter import (
    FIXED_SERIES,
    OTHER_PARTICIPANTS,
    build_registry,
    readiness,
    run_exporter,
    series_bound,
)
from kvstatus.observe.scanner import PassLoop
from tests.admin.test_health import build, stores, succeed
from tests.helpers.backends import RedisUnderTest, fresh_namespace
from tests.observe.support import ServerProcess, wait_until


def fake_backend() -> RedisUnderTest:
    server = fakeredis.FakeServer()
    return RedisUnderTest("fake", fakeredis.FakeRedis(server=server), lambda: fakeredis.FakeRedis(server=server), False)


def samples(text: bytes) -> dict[tuple[str, frozenset], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text.decode())
        for s in family.samples
        if s.labels.get("namespace")
    }


def one(found: dict[tuple[str, frozenset], float], name: str, **labels: str) -> float:
    return found[(name, frozenset(labels.items()))]


def test_pair_gauges_and_open_times() -> None:
    backend = fake_backend()
    build(backend)
    ns = backend.namespace
    loop = PassLoop(backend.raw, KeySchema(ns), batch=4, health=HealthSettings())
    result = loop.run_once()
    assert result is not None and result.health is not None
    assert result.stats.rooms == 5  # rooms 1, 2 and 12 are tombstones only: not live rooms
    found = samples(generate_latest(build_registry([loop])))
    ab = {"namespace": ns, "prefill": "prefill-a", "decode": "decode-b"}
    cd = {"namespace": ns, "prefill": "prefill-c", "decode": "decode-d"}
    assert [one(found, f"kvstatus_pair_{m}", **ab) for m in ("succeeded_rooms", "failed_rooms", "stuck_rooms")] == [
        2,
        1,
        0,
    ]
    assert [one(found, f"kvstatus_pair_{m}", **cd) for m in ("failed_rooms", "stuck_rooms", "unhealthy")] == [2, 1, 1]
    assert one(found, "kvstatus_pair_unhealthy", namespace=ns, prefill="prefill-e", decode="(none)") == 1
    assert one(found, "kvstatus_unhealthy_pairs", namespace=ns) == 2
    # rooms 11 and 20 started 60 s ago (their timelines say so); room 30 just now; room 3 failed: not open
    assert one(found, "kvstatus_oldest_open_room_age_seconds", namespace=ns, status="Bootstrapping") == pytest.approx(
        60, abs=5
    )
    assert one(found, "kvstatus_oldest_open_room_age_seconds", namespace=ns, status="WaitingForInput") == pytest.approx(
        60, abs=5
    )
    assert one(found, "kvstatus_oldest_open_room_age_seconds", namespace=ns, status="Transferring") == 0
    histogram = {"namespace": ns, "status": "Bootstrapping"}
    assert one(found, "kvstatus_open_entry_status_seconds_count", **histogram) == 3
    assert one(found, "kvstatus_open_entry_status_seconds_bucket", **histogram, le="30") == 1
    assert one(found, "kvstatus_open_entry_status_seconds_bucket", **histogram, le="120") == 3
    assert one(found, "kvstatus_open_entry_status_seconds_sum", **histogram) == pytest.approx(120, abs=10)
    assert readiness([loop]) == (503, f"unhealthy: prefill-c,decode-d ({ns}), prefill-e,(none) ({ns})\n")
    assert readiness([loop], "prefill-a,decode-b") == (200, "ready\n")
    assert readiness([loop], "prefill-e,(none)")[0] == 503
    assert readiness([loop], "prefill-z,decode-b")[0] == 404
    assert readiness([loop], "prefill-a")[0] == 400
    backend.close()


def test_not_ready_before_the_first_pass() -> None:
    loop = PassLoop(fakeredis.FakeRedis(), KeySchema("idle"), health=HealthSettings())
    assert readiness([loop]) == (503, "not ready: namespace idle: no completed pass yet\n")


PAIRS = 1_000


def populate_pairs(raw: Any, schema: KeySchema) -> int:
    """1,000 prefill and 1,000 decode instances, one pair per room: every third pair served a room (a
    tombstone), every third failed one, every third is stuck. Returns the Redis clock used."""
    now = server_ms(raw)
    with raw.pipeline(transaction=False) as pipe:
        for i in range(PAIRS):
            p, d = f"prefill-p{i}-tp0-pp0", f"decode-d{i}-tp0-pp0"
            if i % 3 == 0:
                tomb = schema.tombstone_key(i)
                pipe.hset(tomb, mapping={p: f"{now - 1000} 4", d: f"{now - 1000} 4"})
                pipe.pexpire(tomb, 60_000)
                continue
            key = schema.room_key(i)
            if i % 3 == 1:
                fields = {p: "0", d: "2", "room:fate": f"{now - 2000}:transfer:{p}:timed out"}
            else:
                fields = {p: "3", d: "2", f"t:{p}": f"3@{now - 60_000}", f"t:{d}": f"2@{now - 60_000}"}
            pipe.hset(key, mapping=fields)
            pipe.pexpire(key, 600_000)
        pipe.execute()
    return now


def test_2000_participants_keep_the_series_under_the_bound() -> None:
    raw = fakeredis.FakeRedis()
    schema = KeySchema(fresh_namespace("pairs"))
    populate_pairs(raw, schema)
    loop = PassLoop(raw, schema, batch=500, health=HealthSettings())
    assert loop.run_once() is not None
    for participants, pairs in ((50, 50), (10, 0)):
        text = generate_latest(build_registry([loop], max_participants=participants, max_pairs=pairs))
        found = samples(text)
        assert (
            len(found) == series_bound(participants, pairs) == FIXED_SERIES + 5 * (participants + 1) + 4 * (pairs + 1)
        )
        failed = {labels: v for (name, labels), v in found.items() if name == "kvstatus_pair_failed_rooms"}
        assert len(failed) == pairs + 1 and sum(failed.values()) == 333  # nothing lost in the fold
        unhealthy = {labels: v for (name, labels), v in found.items() if name == "kvstatus_pair_unhealthy"}
        assert sum(unhealthy.values()) == 666 == one(found, "kvstatus_unhealthy_pairs", namespace=schema.namespace)
        other = frozenset(
            {"namespace": schema.namespace, "prefill": OTHER_PARTICIPANTS, "decode": OTHER_PARTICIPANTS}.items()
        )
        assert unhealthy[other] == 666 - pairs  # the unhealthy pairs keep their own labels first
        succeeded = sum(v for (name, _), v in found.items() if name == "kvstatus_pair_succeeded_rooms")
        assert succeeded == 334
        assert len(text) < 60_000
    assert series_bound() == 522


def http(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.mark.real
def test_ready_endpoint_of_the_exporter_process(redis_server: Any) -> None:
    raw = redis.Redis(host=redis_server.host, port=redis_server.port)
    backend = RedisUnderTest("real", raw, lambda: redis.Redis(host=redis_server.host, port=redis_server.port), False)
    try:
        build(backend)
        with ServerProcess(
            "--url", redis_server.url, "exporter", backend.namespace, "--port", "0", "--interval", "0.5"
        ) as exporter:
            code, text = wait_until(
                lambda: (r := http(exporter.base + "/ready")) and "unhealthy" in r[1] and r, 30, "a pass"
            )
            assert code == 503 and text == (
                f"unhealthy: prefill-c,decode-d ({backend.namespace}), prefill-e,(none) ({backend.namespace})\n"
            )
            assert http(exporter.base + "/ready?pair=prefill-a,decode-b") == (200, "ready\n")
            assert http(exporter.base + "/ready?pair=prefill-c,decode-d")[0] == 503
            assert http(exporter.base + "/ready?pair=prefill-e,%28none%29")[0] == 503
            assert http(exporter.base + "/ready?pair=prefill-x,decode-y")[0] == 404
            assert http(exporter.base + "/ready?pair=garbage")[0] == 400
            code, metrics = http(exporter.base + "/metrics")
            assert code == 200 and "kvstatus_pair_unhealthy{" in metrics
            assert exporter.terminate() == 0
    finally:
        backend.close()


@pytest.mark.real
def test_ready_is_200_when_every_pair_served(redis_server: Any) -> None:
    raw = redis.Redis(host=redis_server.host, port=redis_server.port)
    backend = RedisUnderTest("real", raw, lambda: redis.Redis(host=redis_server.host, port=redis_server.port), False)
    stop, bound = threading.Event(), []
    thread = threading.Thread(
        target=run_exporter,
        args=(raw, [KeySchema(backend.namespace)]),
        kwargs={"port": 0, "host": "127.0.0.1", "interval": 0.3, "ready": lambda h, p: bound.append(p), "stop": stop},
        daemon=True,
    )
    try:
        prefill, decode = stores(backend, "prefill-a-tp0-pp0", "decode-b-tp0-pp0")
        succeed(1, prefill, decode)
        decode.update_status(2, 1)  # in flight: a decode waiting for its prefill, not stuck yet
        thread.start()
        base = f"http://127.0.0.1:{wait_until(lambda: bound and bound[0], 30, 'the port')}"
        assert wait_until(lambda: http(base + "/ready")[0] == 200, 30, "a pass")
        assert http(base + "/ready") == (200, "ready\n")
        assert http(base + "/ready?pair=(none),decode-b") == (200, "ready\n")
    finally:
        stop.set()
        thread.join(30)
        backend.close()
    assert not thread.is_alive()
