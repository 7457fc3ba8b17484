"""Issue 35 item 1: ``kvstatus cancel`` of a room already fully served fails nothing and records nothing, says so,
and exits 7; ``health`` (and so the exporter's pair gauges and ``/ready``, built on the same judgement) still
counts the room as served. The rule lives in ``lua/cancel.lua``; ``kvstatus.rule.cancel_outcome`` is its
reference. Against a real redis-server, as an operator scripts it."""

from __future__ import annotations

import json
from typing import Iterator

import pytest

from kvstatus import KVPoll, StatusStore
from kvstatus.admin.health import HealthSettings, read_health
from kvstatus.model import CancelOutcome
from kvstatus.rule import cancel_outcome
from tests.helpers.backends import fresh_namespace
from tests.helpers.cli import run_cli
from tests.servers import RedisServer

pytestmark = pytest.mark.real

EXIT_SERVED = 7


@pytest.fixture
def deployment(redis_server: RedisServer) -> Iterator[tuple[dict[str, str], StatusStore, StatusStore]]:
    namespace = fresh_namespace("served")
    env = {"KVSTATUS_URL": redis_server.url, "KVSTATUS_NAMESPACE": namespace}
    with (
        StatusStore.from_url(
            redis_server.url, namespace=namespace, participant="prefill-0", timeline=True, ttl=100
        ) as prefill,
        StatusStore.from_url(
            redis_server.url, namespace=namespace, participant="decode-0", timeline=True, ttl=100
        ) as decode,
    ):
        yield env, prefill, decode


def _serve(prefill: StatusStore, decode: StatusStore, room: int) -> None:
    for status in (KVPoll.Bootstrapping, KVPoll.Transferring, KVPoll.Success):
        prefill.update_status(room, status)
    for status in (KVPoll.WaitingForInput, KVPoll.Success):
        decode.update_status(room, status)


def _pair(env: dict[str, str]) -> dict[str, object]:
    done = run_cli("health", "--json", env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    (pair,) = json.loads(done.stdout)["pairs"]
    return pair


def test_cancel_of_a_fully_served_room_changes_nothing_and_exits_7(
    deployment: tuple[dict[str, str], StatusStore, StatusStore], redis_server: RedisServer
) -> None:
    env, prefill, decode = deployment
    _serve(prefill, decode, 11)
    assert _pair(env)["succeeded"] == 1
    key = prefill.schema.room_key(11)
    raw = redis_server.client()
    before = raw.hgetall(key)
    done = run_cli("cancel", "11", "--reason", "client went away", env=env)
    assert done.returncode == EXIT_SERVED, done.stdout + done.stderr
    assert done.stdout.splitlines() == [
        "room 11: already served (every entry is Success): nothing failed, no failure recorded"
    ]
    assert done.stderr.splitlines() == [
        "kvstatus: 1 room was already fully served (every entry Success): left as they are, nothing failed or recorded"
    ]
    assert raw.hgetall(key) == before  # no Failed entry, no first failure
    assert 0 < raw.pttl(key) <= 100_000  # the cancel's 600 s TTL was not applied either
    pair = _pair(env)
    assert (pair["succeeded"], pair["failed"], pair["verdict"]) == (1, 0, "healthy")
    judged = read_health(raw, prefill.schema, HealthSettings())  # what the exporter's gauges and /ready judge
    assert judged.healthy and judged.pairs[0].succeeded == 1 and judged.pairs[0].failed_total == 0
    assert prefill.get(11) is KVPoll.Success and decode.get(11) is KVPoll.Success


def test_a_batch_with_a_served_room_cancels_the_others_and_exits_7(
    deployment: tuple[dict[str, str], StatusStore, StatusStore],
) -> None:
    env, prefill, decode = deployment
    _serve(prefill, decode, 11)
    prefill.update_status(12, KVPoll.Success)  # served on one side, open on the other: not fully served
    decode.update_status(12, KVPoll.WaitingForInput)
    done = run_cli("cancel", "11", "12", "13", "--reason", "drain", "--json", env=env)
    assert done.returncode == EXIT_SERVED, done.stdout + done.stderr
    rooms = {room["room"]: (room["outcome"], room["failed"]) for room in json.loads(done.stdout)["rooms"]}
    assert rooms == {11: ("ALREADY_SERVED", 0), 12: ("CANCELLED", 1), 13: ("CANCELLED", 0)}
    assert decode.get(12) is KVPoll.Failed and prefill.room(12).failure is not None
    assert prefill.room(11).failure is None


def test_a_served_room_that_failed_before_is_already_failed_and_exits_0(
    deployment: tuple[dict[str, str], StatusStore, StatusStore],
) -> None:
    env, prefill, decode = deployment
    prefill.update_status(14, KVPoll.Transferring)
    prefill.update_status(14, KVPoll.Failed)  # the first failure is recorded
    prefill.update_status(14, KVPoll.Success)  # the seed policy lets the entry leave Failed; the record stays
    decode.update_status(14, KVPoll.Success)
    done = run_cli("cancel", "14", "--reason", "late", "--json", env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["rooms"][0]["outcome"] == "ALREADY_FAILED"


@pytest.mark.parametrize(
    "statuses, failed_before, expected",
    [
        ([KVPoll.Success, KVPoll.Success], False, CancelOutcome.ALREADY_SERVED),
        ([KVPoll.Success], False, CancelOutcome.ALREADY_SERVED),
        ([KVPoll.Success, KVPoll.Success], True, CancelOutcome.ALREADY_FAILED),
        ([KVPoll.Success, KVPoll.WaitingForInput], False, CancelOutcome.CANCELLED),
        ([KVPoll.Success, None], False, CancelOutcome.CANCELLED),  # a value kvstatus does not write
        ([], False, CancelOutcome.CANCELLED),  # no entry yet: a later writer reads Failed
        ([KVPoll.Success, KVPoll.Failed], True, CancelOutcome.ALREADY_FAILED),
    ],
)
def test_the_reference_of_the_cancel_rule(
    statuses: list[KVPoll | None], failed_before: bool, expected: CancelOutcome
) -> None:
    assert cancel_outcome(statuses, failed_before) is expected
