"""Participants that die or freeze: real processes, SIGKILL and SIGSTOP, on a single Redis and on a 3-master Cluster.

- Three processes share rooms; one is SIGKILLed. Within its lease TTL (plus
  slack) its lease reads lost, every room reads Failed through the consensus
  view with the reason, its entries end Failed (the survivors' own peer watches
  and one sweep race for them: whichever writes first), and the survivors'
  entries are untouched.
- A SIGSTOPped process whose lease expires meanwhile learns so at its next
  write after SIGCONT (LeaseLostError), and writes nothing.
- A restart under the same name is a new incarnation.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any, Callable, Iterator

import pytest

from kvstatus import KVPoll, RoomConsensus, StatusStore
from kvstatus.admin.reads import list_leases, lost_participants
from kvstatus.admin.sweep import sweep
from kvstatus.connection import connect
from kvstatus.keys import KeySchema
from tests.helpers import ROOT
from tests.helpers.backends import fresh_namespace
from tests.helpers.timing import slack

LEASE_TTL = 3.0
SLACK = 2.0  # scheduling on a loaded 2-core box: the bound checked is TTL + this
ROOMS = list(range(500, 530))

WORKER = r"""
import sys, time
from kvstatus import KVPoll, LeaseLostError, StatusStore
url, namespace, name, ttl = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
rooms = [int(r) for r in sys.argv[5].split(",")]
store = StatusStore.from_url(url, namespace=namespace, participant=name, lease_ttl=ttl, policy="strict")
for room in rooms:
    store.update_status(room, KVPoll.Bootstrapping)
    store.update_status(room, KVPoll.Transferring)
print("ready", store.lease.generation, store.lease.incarnation, flush=True)
while True:
    time.sleep(0.1)
    try:
        store.update_status(rooms[0], KVPoll.Transferring)   # the heartbeat of a busy worker: a write
    except LeaseLostError as exc:
        print("lost:", exc, flush=True)
        sys.exit(3)
"""


class Worker:
    def __init__(self, url: str, namespace: str, name: str, rooms: list[int]) -> None:
        self.name = name
        self.proc = subprocess.Popen(
            [sys.executable, "-c", WORKER, url, namespace, name, str(LEASE_TTL), ",".join(map(str, rooms))],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        assert line.startswith("ready"), line + (self.proc.stdout.read() if self.proc.poll() is not None else "")
        _, generation, self.incarnation = line.split()
        self.generation = int(generation)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
        self.proc.wait(10)


@pytest.fixture(
    params=[pytest.param("single", marks=pytest.mark.real), pytest.param("cluster", marks=pytest.mark.real)]
)
def url(request: pytest.FixtureRequest) -> str:
    if request.param == "cluster":
        return request.getfixturevalue("redis_cluster").url
    return request.getfixturevalue("redis_server").url


@pytest.fixture
def workers() -> Iterator[list[Worker]]:
    started: list[Worker] = []
    yield started
    for worker in started:
        worker.stop()


def _within(seconds: float, condition: Callable[[], Any], what: str) -> float:
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < seconds, f"not within {seconds:g} s: {what}"
        time.sleep(0.05)
    return time.monotonic() - started


def test_a_killed_participant_fails_its_rooms_and_nobody_elses(url: str, workers: list[Worker]) -> None:
    namespace = fresh_namespace("lost")
    names = ["prefill-0", "decode-0", "decode-1"]
    workers += [Worker(url, namespace, name, ROOMS) for name in names]
    client = connect(url)
    schema = KeySchema(namespace)
    reader = StatusStore(client, namespace=namespace)
    assert set(reader.room_statuses(ROOMS, names).values()) == {RoomConsensus(KVPoll.Transferring)}

    workers[1].proc.kill()
    killed_at = time.monotonic()
    _within(
        LEASE_TTL + slack(SLACK), lambda: lost_participants(client, schema) == {"decode-0"}, "decode-0's lease lost"
    )
    assert time.monotonic() - killed_at >= LEASE_TTL - 1.0  # not before its last renewal's deadline
    # The survivors' peer watches fail decode-0's entries too: by its lease, or by its presence when they had
    # counted it present before the kill (a loaded box), each with its own reason.
    reasons = {"participant decode-0 lost its lease", "participant decode-0 died: its connection to Redis closed"}

    def all_failed_by_the_death() -> None:
        for room, view in reader.room_statuses(ROOMS, names).items():
            assert (view.status, view.lost, view.reason in reasons) == (KVPoll.Failed, ("decode-0",), True), room

    all_failed_by_the_death()  # before any sweep
    result = sweep(client, schema, batch=7)
    assert result.lost == ["decode-0"]
    # The sweep fails what the survivors' watches had not failed yet, in as many rooms (none when the watches won
    # the race, as on a loaded box); tests/admin hold its exact counts.
    assert result.rooms == result.swept <= len(ROOMS)
    all_failed_by_the_death()  # now a stored Failed + reason
    for room in ROOMS:
        view = reader.room(room)
        assert view.participants["decode-0"].status is KVPoll.Failed
        assert view.participants["decode-0"].reason in reasons
        assert view.participants["prefill-0"] == (KVPoll.Transferring, None)
        assert view.participants["decode-1"] == (KVPoll.Transferring, None)
    assert {i.participant: i.state for i in list_leases(client, schema)} == {
        "prefill-0": "alive",
        "decode-0": "expired",
        "decode-1": "alive",
    }
    assert sweep(client, schema).swept == 0  # idempotent
    client.close()


def test_a_paused_participant_learns_at_its_next_write_that_it_lost_its_lease(url: str, workers: list[Worker]) -> None:
    namespace = fresh_namespace("stop")
    workers.append(Worker(url, namespace, "prefill-3", ROOMS[:5]))
    client = connect(url)
    schema = KeySchema(namespace)
    proc = workers[0].proc
    proc.send_signal(signal.SIGSTOP)
    try:
        _within(LEASE_TTL + slack(SLACK), lambda: lost_participants(client, schema) == {"prefill-3"}, "lease lost")
        assert sweep(client, schema).swept == 5
    finally:
        proc.send_signal(signal.SIGCONT)
    out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 3, out
    assert "lost: participant prefill-3 lost its lease" in out and "not renewed within its TTL" in out
    reader = StatusStore(client, namespace=namespace)
    assert {reader.room(room).participants["prefill-3"].status for room in ROOMS[:5]} == {KVPoll.Failed}
    client.close()


def test_a_restart_under_the_same_name_is_a_new_incarnation(url: str, workers: list[Worker]) -> None:
    namespace = fresh_namespace("restart")
    first = Worker(url, namespace, "decode-2", ROOMS[:2])
    workers.append(first)
    first.proc.kill()
    first.proc.wait(10)
    second = Worker(url, namespace, "decode-2", ROOMS[:2])  # at once, inside the first one's TTL
    workers.append(second)
    assert (first.generation, second.generation) == (1, 2) and first.incarnation != second.incarnation
    client = connect(url)
    (info,) = list_leases(client, KeySchema(namespace))
    assert (info.state, info.generation, info.incarnation) == ("alive", 2, second.incarnation)
    client.close()
