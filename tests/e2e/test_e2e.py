"""End to end: a real sglang prefill and decode on CPU, KV over mooncake TCP, behind the sglang PD router.

One redis-server, then two deployments in turn, each a prefill + a decode started here:
plugin on (``KVSTATUS_SGLANG_URL`` set, kvstatus' defaults) and plugin off (upstream sglang).
In each: 50 requests served, then the faults, each through a fresh router. The fault table
(time to the client's error, HTTP status, cause shown; kvstatus against upstream, same run) is
written to ``build/e2e/fault-table.{json,md}``; ``python -m tests.e2e.table --paste`` puts it
into BENCHMARKS.md.

What this asserts: a ``kvstatus cancel`` of the rooms in flight fails their requests with an error naming
the cancel (shared fate: no process of the servers is told). A kill or a restart is asserted to end every
request in a client error within the tier's bound. The plugin's leases (on by default) fail a dead side's
rooms for the other side within the lease TTL plus about a second, but what the client sees then depends on
which side SGLang itself polls and reports first (docs/e2e.md); the table shows the figures, kvstatus
against upstream, measured in the same run.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Iterator

import pytest
import redis

from kvstatus import KVPoll, StatusStore
from kvstatus.admin.reads import iter_rooms
from kvstatus.keys import KeySchema, naming
from tests.e2e import deploy, scenarios, table

# A test's budget includes starting its deployment (two servers, ~30 s on 2 quiet cores, 5 min on a busy one).
pytestmark = [pytest.mark.real, pytest.mark.slow, pytest.mark.usefixtures("e2e_ready"), pytest.mark.timeout(1800)]

NAMESPACE = scenarios.NAMESPACE
ROLES = ("prefill", "decode")
"""One server of each role; each named by its address on the plugin's defaults (prefill-<host>-<port>-tp0-pp0)."""
SERVE_REQUESTS = 50
CANCELLED = f"cancelled by {scenarios.CANCEL_ORIGIN}: {scenarios.CANCEL_REASON}"
"""What the client's error says of a cancelled room (kvstatus.sglang's failure_exception text)."""
OPEN_CIRCUIT = "No available prefill workers (all circuits open or unhealthy)"
"""The router's own 503 once its circuit breaker has opened for the prefill."""
CLEAR_WAIT = 15.0
"""Seconds for both sides to clear their entries after the last answer (the prefill's clear may trail it)."""

answers: dict[str, list[list[int]]] = {}
faults: list[scenarios.FaultResult] = []


@pytest.fixture(scope="module", autouse=True)
def write_table() -> Iterator[None]:
    """After the module: the measured fault table, whatever was measured (a failed run shows what it got)."""
    began = time.monotonic()
    yield
    if faults:
        table.write(table.OUT, [f.row() for f in faults], round(time.monotonic() - began), deploy.plugin_label())


@pytest.fixture(scope="module")
def with_plugin(model: Path, logs: Path, redis_url: str) -> Iterator[scenarios.Deployment]:
    yield from scenarios.running("kvstatus", model, logs, redis_url)


def _rooms_left(client: redis.Redis) -> list[int]:
    """The rooms that still exist, as ``kvstatus ls`` lists them: a cleared room's key may hold its writers'
    stamps alone for the tombstone's TTL (the fence of lua/clear.lua), and counts as gone."""
    return [view.room for view in iter_rooms(client, KeySchema(NAMESPACE))]


def _tombstone_rooms(client: redis.Redis) -> list[int]:
    keys = [k.decode() for k in client.scan_iter(match=f"kvstatus:{NAMESPACE}:{{*}}:t", count=1000)]
    return [int(k.split("{", 1)[1].split("}", 1)[0]) for k in keys]


def _serve(dep: scenarios.Deployment) -> list[scenarios.Answer]:
    router = dep.router()
    try:
        bodies = [scenarios.generate_body(scenarios.prompt(i), 16) for i in range(SERVE_REQUESTS)]
        return scenarios.send_all(router.url, bodies, scenarios.SERVE_WAIT, workers=8)
    finally:
        router.stop()


def test_serve_with_the_plugin_on(with_plugin: scenarios.Deployment, redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    assert _rooms_left(client) == [] and _tombstone_rooms(client) == []
    served = _serve(with_plugin)
    failed = [(a.index, a.status, a.cause()) for a in served if not a.ok]
    assert failed == [], f"requests failed with the plugin on: {failed}"
    assert all(a.output_ids for a in served), "the /generate answers carry no output_ids"
    answers["kvstatus"] = [a.output_ids or [] for a in served]

    deadline = time.monotonic() + CLEAR_WAIT
    while _rooms_left(client) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _rooms_left(client) == [], "rooms left after every request was answered"
    rooms = _tombstone_rooms(client)
    assert len(rooms) == SERVE_REQUESTS, f"{len(rooms)} tombstones for {SERVE_REQUESTS} requests"
    store = StatusStore(client, namespace=NAMESPACE, participant="e2e-reader")
    for room in rooms:
        tombstone = store.room(room).tombstone
        assert tombstone is not None, room
        cleared = {naming(name).role: entry.status for name, entry in tombstone.cleared.items()}
        assert len(tombstone.cleared) == len(ROLES) and cleared == {role: KVPoll.Success for role in ROLES}, (
            room,
            tombstone,
        )


def test_a_cancel_fails_the_rooms_in_flight_with_its_cause(with_plugin: scenarios.Deployment) -> None:
    """Issue 16 item 4 through real servers: a cancel reaches both sides by shared fate (no process of theirs is
    told), and the client's error names the canceller and the reason, not "unknown reason from another rank"."""
    result = scenarios.cancel_in_flight(with_plugin, table.CANCEL, scenarios.IN_FLIGHT_DELAY, retries=False)
    faults.append(result)
    check_faults([result])
    unnamed = [(a.index, a.status, a.cause()) for a in result.failed if CANCELLED not in a.message()]
    assert unnamed == [], f"errors that do not name the cancel ({CANCELLED!r}): {unnamed}"


def test_a_router_at_its_defaults_retries_a_cancelled_request(with_plugin: scenarios.Deployment) -> None:
    """The router's defaults: a request whose room failed is sent again under a new room, and the cancel's
    failures may open the prefill's circuit, after which the router answers 503 itself. Every request ends within
    the bound, and every error is one of those two: the cancel, named, or the router's open circuit."""
    result = scenarios.cancel_in_flight(with_plugin, table.CANCEL_RETRIED, scenarios.IN_FLIGHT_DELAY, retries=True)
    faults.append(result)
    late = [a.index for a in result.answers if a.ended - a.sent > result.bound + 5]
    assert late == [], f"requests past the {result.bound} s bound: {late}"
    other = [
        (a.index, a.status, a.cause())
        for a in result.failed
        if CANCELLED not in a.message() and not (a.status == 503 and OPEN_CIRCUIT in a.message())
    ]
    assert other == [], f"errors that are neither the cancel nor the router's open circuit: {other}"


def test_faults_with_the_plugin_on(with_plugin: scenarios.Deployment) -> None:
    check_faults(run_faults(with_plugin, faults))


@pytest.fixture(scope="module")
def upstream(
    model: Path, logs: Path, redis_url: str, with_plugin: scenarios.Deployment
) -> Iterator[scenarios.Deployment]:
    with_plugin.stop()  # one deployment at a time: the two would not fit the box's cores and memory together
    yield from scenarios.running("upstream", model, logs, redis_url)


def test_serve_with_the_plugin_off_gives_the_same_answers(upstream: scenarios.Deployment, redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    before = set(_tombstone_rooms(client))
    served = _serve(upstream)
    failed = [(a.index, a.status, a.cause()) for a in served if not a.ok]
    assert failed == [], f"requests failed with the plugin off: {failed}"
    # The plugin-on run's tombstones may expire meanwhile (their own 60 s TTL): no new one may appear.
    written = set(_tombstone_rooms(client)) - before
    assert written == set(), f"the plugin wrote to Redis while it was off: rooms {sorted(written)}"
    if "kvstatus" not in answers:
        pytest.fail("the plugin-on serve scenario did not record answers to compare with", pytrace=False)
    off = [a.output_ids or [] for a in served]
    mismatched = [i for i, (on, up) in enumerate(zip(answers["kvstatus"], off)) if on != up]
    assert mismatched == [], f"answers differ token for token at requests {mismatched}"
    assert len(off) == len(answers["kvstatus"]) == SERVE_REQUESTS


def test_faults_with_the_plugin_off(upstream: scenarios.Deployment) -> None:
    check_faults(run_faults(upstream, faults))


def run_faults(dep: scenarios.Deployment, record: list[scenarios.FaultResult]) -> list[scenarios.FaultResult]:
    """The four faults in an order that needs the fewest restarts; each result is also appended to ``record``
    as soon as it is measured (the table then shows what a run got, even one that failed half way)."""
    results: list[scenarios.FaultResult] = []

    def keep(measured: list[scenarios.FaultResult]) -> None:
        results.extend(measured)
        record.extend(measured)

    keep(
        scenarios.kill_in_flight(
            dep, "prefill", table.KILL_PREFILL, scenarios.IN_FLIGHT_DELAY, then_send=table.DEAD_PREFILL
        )
    )
    dep.restart("prefill")
    restarted: list[deploy.Process] = []
    keep(
        scenarios.kill_in_flight(
            dep,
            "prefill",
            table.RESTART_PREFILL,
            scenarios.IN_FLIGHT_DELAY,
            after_kill=lambda: restarted.append(dep.restart("prefill", wait=False)),
        )
    )
    dep.wait(restarted[0])
    keep(
        scenarios.kill_in_flight(
            dep, "decode", table.KILL_DECODE, scenarios.IN_FLIGHT_DELAY, bound=scenarios.DECODE_FAULT_WAIT
        )
    )
    return results


def check_faults(results: list[scenarios.FaultResult]) -> None:
    """Every request ends within the bound; every fault fails at least one request; no fault hangs forever."""
    for result in results:
        assert result.answers, result.fault
        assert result.failed, f"{result.fault} ({result.mode}): no request failed, so the fault missed them"
        late = [a.index for a in result.answers if a.ended - a.sent > result.bound + 5]
        assert late == [], f"{result.fault} ({result.mode}): requests past the {result.bound} s bound: {late}"
