"""The sweeper and the lease tools, as a library (every backend) and through the CLI, and two sweepers at once."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import fakeredis
import pytest
import redis

from kvstatus import KVPoll, Outcome, PermissionDeniedError, RoomConsensus, StatusStore
from kvstatus.admin.stats import collect_stats
from kvstatus.admin.sweep import sweep
from kvstatus.keys import KeySchema
from tests.helpers import ROOT
from tests.helpers.backends import RedisUnderTest, fresh_namespace
from tests.helpers.cli import invoke, json_lines

B, W, T, S, F = KVPoll.Bootstrapping, KVPoll.WaitingForInput, KVPoll.Transferring, KVPoll.Success, KVPoll.Failed


def _expire(raw: Any, namespace: str, participant: str) -> None:
    raw.hset(f"kvstatus:{namespace}:lease:{participant}", "deadline", 1)


def _populate(backend: RedisUnderTest) -> dict[str, Any]:
    """dead-0 (lease, expires), live-0 (lease), plain-0 (no lease, never sweepable) in rooms 1..6."""
    dead = backend.store(participant="dead-0", lease_ttl=3, policy="strict")
    live = backend.store(participant="live-0", lease_ttl=60)  # alive throughout: no lapse under CPU starvation
    plain = backend.store(participant="plain-0")
    for room, status in {1: B, 2: W, 3: T, 4: S, 5: F, 6: T}.items():
        dead.update_status(room, B)  # strict: only Bootstrapping or WaitingForInput create an entry
        if status is F:
            dead.update_status(room, T)
            dead.update_status(room, F)
            dead.record_failure(room, "NIXL transfer timed out")
        else:
            dead.update_status(room, status)
        live.update_status(room, T)
        plain.update_status(room, B)
    dead.clear(6)  # a cleared entry is not swept, and the room is not reborn
    return {"dead": dead, "live": live, "plain": plain}


def test_a_sweep_fails_only_the_open_entries_of_lost_participants(backend: RedisUnderTest) -> None:
    stores = _populate(backend)
    schema = KeySchema(backend.namespace)
    assert sweep(backend.raw, schema).lost == []  # nobody lost yet: nothing scanned, nothing written
    _expire(backend.raw, backend.namespace, "dead-0")
    before = {room: stores["live"].room(room) for room in range(1, 7)}
    result = sweep(backend.raw, schema, batch=2)
    assert (result.lost, result.swept, result.rooms, result.raced) == (["dead-0"], 3, 3, 0)
    reason = "participant dead-0 lost its lease"
    for room in range(1, 7):
        after = stores["live"].room(room)
        expected = {1: (F, reason), 2: (F, reason), 3: (F, reason), 4: (S, None), 5: (F, "NIXL transfer timed out")}
        if room in expected:
            assert after.participants["dead-0"] == expected[room], room
        else:
            assert "dead-0" not in after.participants  # cleared before: not recreated
        for other in ("live-0", "plain-0"):
            assert after.participants[other] == before[room].participants[other]
        assert after.ttl_ms <= before[room].ttl_ms  # the sweeper never extends a room's life
    # Under strict, the dead participant's late write cannot undo the sweep (its store refuses anyway).
    late = backend.store(participant="dead-0", policy="strict")
    assert late.update_status(1, T).outcome is Outcome.REFUSED_TERMINAL
    assert stores["live"].room_status(1, ["dead-0", "live-0"]) == RoomConsensus(F, reason, ("dead-0",))
    assert sweep(backend.raw, schema).swept == 0  # idempotent
    assert backend.keys_without_ttl() == []


def test_a_participant_back_under_a_new_incarnation_is_not_swept(backend: RedisUnderTest) -> None:
    stores = _populate(backend)
    _expire(backend.raw, backend.namespace, "dead-0")
    back = backend.store(participant="dead-0", lease_ttl=3)
    back.acquire_lease()
    assert sweep(backend.raw, KeySchema(backend.namespace)).lost == []
    assert stores["live"].room(3).participants["dead-0"].status is T


def test_sweeping_one_participant_leaves_the_other_lost_ones(backend: RedisUnderTest) -> None:
    _populate(backend)
    other = backend.store(participant="dead-1", lease_ttl=3)
    other.update_status(1, B)
    for name in ("dead-0", "dead-1"):
        _expire(backend.raw, backend.namespace, name)
    schema = KeySchema(backend.namespace)
    assert sweep(backend.raw, schema, participants=["dead-1"]).by_participant == {"dead-1": 1}
    assert sweep(backend.raw, schema).by_participant == {"dead-0": 3, "dead-1": 0}


def test_stats_count_rooms_stuck_on_lost_participants(backend: RedisUnderTest) -> None:
    _populate(backend)
    _expire(backend.raw, backend.namespace, "dead-0")
    stats = collect_stats(backend.raw, KeySchema(backend.namespace))
    assert (stats.lost_participants, stats.rooms_on_lost_participants) == (["dead-0"], 3)
    sweep(backend.raw, KeySchema(backend.namespace))
    assert collect_stats(backend.raw, KeySchema(backend.namespace)).rooms_on_lost_participants == 0


def test_the_cli_lists_leases_lost_rooms_and_sweeps() -> None:
    server = fakeredis.FakeServer()
    namespace = fresh_namespace("cli")
    raw = fakeredis.FakeRedis(server=server)
    dead = StatusStore(fakeredis.FakeRedis(server=server), namespace=namespace, participant="dead-0", lease_ttl=3)
    live = dead.for_participant("live-0")
    for room in (1, 2, 3):
        dead.update_status(room, T if room != 3 else S)
        live.update_status(room, B)
    _expire(raw, namespace, "dead-0")

    def cli(*args: str) -> Any:
        return invoke(lambda url: fakeredis.FakeRedis(server=server), "--namespace", namespace, *args)

    table = cli("participants").output.splitlines()
    assert table[0].split() == ["PARTICIPANT", "STATE", "INCARNATION", "LAST", "SEEN", "LEASE", "TTL"]
    assert [line.split()[:3] for line in table[1:]] == [["dead-0", "expired", "1"], ["live-0", "alive", "1"]]
    doc = json.loads(cli("participants", "--json").output)
    assert [(p["participant"], p["state"]) for p in doc["participants"]] == [("dead-0", "expired"), ("live-0", "alive")]
    assert sorted(r["room"] for r in json_lines(cli("ls", "--lost", "--json").output)) == [1, 2]
    stats = cli("stats")
    assert "STUCK: 2 rooms have an open entry a dead participant left (lease lost: dead-0;" in stats.output
    out = cli("sweep")
    assert out.exit_code == 0 and "lost participants: dead-0" in out.output and "failed 2 open entries" in out.output
    assert json.loads(cli("sweep", "--json").output)["entries_failed"] == 0
    assert cli("ls", "--lost").output.splitlines()[1:] == []
    assert "rooms stuck on lost participants: 0" in cli("stats").output
    live.close()
    dead.close()  # their lease keepers are threads: left open, they would renew for the rest of the worker


@pytest.mark.real
@pytest.mark.parametrize("topology", ["single", "cluster"])
def test_two_sweepers_at_once_fail_each_entry_exactly_once(topology: str, request: pytest.FixtureRequest) -> None:
    server = request.getfixturevalue("redis_cluster" if topology == "cluster" else "redis_server")
    namespace = fresh_namespace("sweep2")
    dead = StatusStore.from_url(server.url, namespace=namespace, participant="dead-0", lease_ttl=3)
    rooms = range(2_000)
    dead.update_many({room: T for room in rooms})
    dead.update_many({room: S for room in rooms if room % 4 == 0})
    raw = dead.client
    _expire(raw, namespace, "dead-0")
    command = [
        sys.executable,
        "-m",
        "kvstatus.cli",
        "--url",
        server.url,
        "--namespace",
        namespace,
        "sweep",
        "--batch",
        "50",
        "--json",
    ]
    procs = [
        subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT) for _ in range(2)
    ]
    docs = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        docs.append(json.loads(out))
    assert sum(doc["entries_failed"] for doc in docs) == 1_500  # each open entry failed once, by one of them
    assert all(doc["entries_failed"] + doc["raced"] <= 1_500 for doc in docs)
    statuses = dead.get_many(rooms)
    assert {room: s for room, s in statuses.items() if s is not F} == {room: S for room in rooms if room % 4 == 0}
    dead.close()  # its lease keeper too, not only its client


@pytest.mark.real
def test_leases_consensus_tombstones_and_sweep_work_under_the_readme_acl_users(redis_server: Any) -> None:
    from kvstatus import scripts
    from kvstatus.admin.acl import acl_rules

    namespace = fresh_namespace("acl12")
    with redis_server.client() as admin:  # the tenant recipe: an admin loads the function library once
        admin.function_load(scripts.LIBRARY, replace=True)
        admin.execute_command("ACL", "SETUSER", f"{namespace}-rw", *acl_rules(namespace, password="pw"))
        admin.execute_command("ACL", "SETUSER", f"{namespace}-ro", *acl_rules(namespace, read_only=True, password="pw"))
    url = f"redis://{{}}:pw@{redis_server.host}:{redis_server.port}/0"
    rw = StatusStore.from_url(
        url.format(f"{namespace}-rw"), namespace=namespace, participant="dead-0", lease_ttl=3, scripts="functions"
    )
    rw.update_status(1, B)
    rw.update_status(2, B)
    assert rw.clear(2) is True and rw.update_status(2, F).outcome is Outcome.IGNORED_MISSING
    assert rw.room(2).tombstone.cleared["dead-0"].late_failed_at is not None
    ro = StatusStore.from_url(url.format(f"{namespace}-ro"), namespace=namespace, scripts="functions")
    assert ro.room_status(1, ["dead-0"]) == RoomConsensus(B)
    _expire(rw.client, namespace, "dead-0")
    assert ro.room_status(1, ["dead-0"]).status is F
    with redis_server.client() as operator:  # a sweep scans and writes: neither tenant user may do both
        assert sweep(operator, KeySchema(namespace)).swept == 1
    rw.close()
    ro.close()


@pytest.mark.real
def test_a_sweep_the_acl_half_allows_writes_nothing_even_with_timelines(redis_server: Any) -> None:
    """A user allowed HSET and TIME but refused HSETNX: the sweep is refused before its first write (the timeline's
    TIME check must not hide the HSETNX refusal), so no entry is left Failed without its reason."""
    namespace = fresh_namespace("sweep-acl")
    user = f"{namespace}-half"
    with redis_server.client() as admin:
        admin.execute_command(
            "ACL", "SETUSER", user, "on", ">pw", f"~kvstatus:{namespace}:*", "+@read", "+scan", "+time", "+eval",
            "+evalsha", "+script|load", "+hset", "-hsetnx",
        )  # fmt: skip
    with StatusStore.from_url(
        redis_server.url, namespace=namespace, participant="dead-0", lease_ttl=3, timeline=True
    ) as dead:
        dead.update_status(1, B)
        _expire(dead.client, namespace, "dead-0")
        half = redis.Redis(host=redis_server.host, port=redis_server.port, username=user, password="pw")
        with pytest.raises(PermissionDeniedError, match="hsetnx"):
            sweep(half, KeySchema(namespace))
        half.close()
        with redis_server.client() as admin:
            assert admin.hget(f"kvstatus:{namespace}:{{1}}", "dead-0") == b"1"  # untouched
