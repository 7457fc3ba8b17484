"""The SGLang poll at the price of a dict, through the plugin's defaults (a lease, shared fate, the near cache):
a poll of an unchanged room sends nothing to Redis, PP rank 0's consensus included; a change made by another
process reaches the next polls; a read that cannot be served from memory takes the full path (issue 17). The
tests of a pop racing ``in`` and the read after it run with the near cache off too (every read a round trip)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from typing import Any

import pytest
import redis

from kvstatus import KVPoll
from kvstatus.cachestate import POLL_GATE
from kvstatus.sglang import outage
from kvstatus.sglang.plugin import ENV_NAMESPACE, ENV_NEAR_CACHE, ENV_URL, install_from_env
from tests.helpers.backends import fresh_namespace
from tests.nearcache.helpers import eventually
from tests.sglang.standin import CommonKVReceiver, CommonKVSender, DisaggregationMode, make_manager
from tests.sglang.support import room_commands

pytestmark = pytest.mark.real
ROOMS = list(range(7000, 7032))


def _installed(url: str, namespace: str, near_cache: bool = True, **shape: Any) -> Any:
    manager = make_manager(**shape)
    env = {ENV_URL: url, ENV_NAMESPACE: namespace}
    if not near_cache:
        env[ENV_NEAR_CACHE] = "0"
    install_from_env(manager, env)
    return manager


def _raw(server: Any) -> redis.Redis:
    return redis.Redis(host=server.host, port=server.port)


def test_polls_of_unchanged_rooms_send_nothing_and_a_change_costs_one_read(redis_server: Any) -> None:
    namespace = fresh_namespace("sgdict")
    prefill = _installed(redis_server.url, namespace)
    decode = _installed(redis_server.url, namespace, mode=DisaggregationMode.DECODE)
    store = prefill.request_status.store
    assert store.near_cache is not None and store.lease is not None and store.shared_fate  # the defaults
    senders, receivers = [], []
    for room in ROOMS:
        receivers.append(CommonKVReceiver(decode, room))
        decode.update_status(room, KVPoll.WaitingForInput)
        prefill.update_status(room, KVPoll.Bootstrapping)
        prefill.update_status(room, KVPoll.Transferring)
        senders.append(CommonKVSender(prefill, room))

    def poll_all() -> None:
        for sender, receiver in zip(senders, receivers):
            assert sender.poll() == KVPoll.Transferring and receiver.poll() == KVPoll.WaitingForInput

    poll_all()  # the first polls after the writes read the rooms
    base = store.prefix + ":" + namespace + ":"
    assert room_commands(_raw(redis_server), base, lambda: [poll_all() for _ in range(5)]) == []
    # Another process cancels one room: Redis' invalidation reaches the prefill, whose next polls read it once.
    room = ROOMS[3]
    script = (
        "import sys; from kvstatus import StatusStore; "
        "StatusStore.from_url(sys.argv[1], namespace=sys.argv[2], participant='router-1').cancel(int(sys.argv[3]), 'gone')"
    )
    subprocess.run([sys.executable, "-c", script, redis_server.url, namespace, str(room)], check=True, timeout=60)

    def failed() -> bool:
        return bool(senders[3].poll() == KVPoll.Failed)

    commands = room_commands(_raw(redis_server), base, lambda: eventually(failed, what="the cancel"))
    assert [c.split()[0] for c in commands] == ["HGETALL", "PTTL"] and all(f"{{{room}}}" in c for c in commands)
    for manager in (prefill, decode):
        manager.request_status.close()


def test_the_pp_consensus_of_unchanged_rooms_sends_nothing(redis_server: Any) -> None:
    namespace = fresh_namespace("sgdictpp")
    ranks = [_installed(redis_server.url, namespace, pp_rank=rank, pp_size=4) for rank in range(4)]
    for manager in ranks:
        for room in ROOMS:
            manager.update_status(room, KVPoll.Bootstrapping)
    for room in ROOMS[::2]:
        ranks[2].update_status(room, KVPoll.Transferring)
    senders = [CommonKVSender(ranks[0], room) for room in ROOMS]
    assert [s.poll_pp_consensus() for s in senders] == [KVPoll.Bootstrapping] * len(ROOMS)
    store = ranks[0].request_status.store
    base = store.prefix + ":" + namespace + ":"
    polls = room_commands(
        _raw(redis_server), base, lambda: [[s.poll_pp_consensus() for s in senders] for _ in range(5)]
    )
    assert polls == []
    # A rank's failure reaches rank 0's consensus at once in this process (its write drops the room here too).
    ranks[3].update_status(ROOMS[5], KVPoll.Failed)
    assert senders[5].poll_pp_consensus() == KVPoll.Failed
    assert ranks[0].request_status.collect(ROOMS[4]) == [
        KVPoll.Bootstrapping,
        KVPoll.Bootstrapping,
        KVPoll.Transferring,
        KVPoll.Bootstrapping,
    ]
    for manager in ranks:
        manager.request_status.close()


def test_ids_that_equal_a_cached_room_are_not_taken_for_it(redis_server: Any) -> None:
    """``True`` and ``1.0`` equal room 1 in a dict: the dict-speed path serves ints only,
    and the full path answers for them as for any id kvstatus cannot store (Failed)."""
    manager = _installed(redis_server.url, fresh_namespace("sgdictid"))
    status_map = manager.request_status
    manager.update_status(1, KVPoll.WaitingForInput)
    assert status_map[1] == KVPoll.WaitingForInput and 1 in status_map  # cached now
    for other in (True, 1.0):
        assert other in status_map  # a room that failed from the start
        assert status_map[other] == KVPoll.Failed and status_map.get(other) == KVPoll.Failed
        assert manager.check_status(other) == KVPoll.Failed
    assert status_map[1] == KVPoll.WaitingForInput
    status_map.close()


def test_a_poll_gate_shorter_than_a_scheduler_step() -> None:
    assert 0 < POLL_GATE <= 0.001  # a change reaches the polls within a millisecond of its invalidation


@pytest.mark.parametrize("near_cache", [True, False], ids=["near-cache", "near-cache-off"])
def test_a_room_another_thread_pops_between_in_and_the_read_answers_its_status(
    redis_server: Any, monkeypatch: pytest.MonkeyPatch, near_cache: bool
) -> None:
    """mooncake's transfer thread tests ``room not in request_status or check_status(room) == Success`` while the
    scheduler pops the concluded room: the read after ``in`` must not raise KeyError (it killed the transfer
    thread in the e2e tier). It answers the popped status; the popping thread itself, and anyone later, get
    the dict's KeyError. Without the near cache ``in`` and the read are two round trips: the same answers."""
    manager = _installed(redis_server.url, fresh_namespace("sgdictpop"), near_cache=near_cache)
    status_map = manager.request_status
    room = 4321
    for each in (room, room + 1):
        manager.update_status(each, KVPoll.Bootstrapping)
        manager.update_status(each, KVPoll.Success)
    found_in, popped = threading.Event(), threading.Event()
    seen: list[object] = []

    def transfer_thread() -> None:
        present = room in status_map
        found_in.set()
        popped.wait(10)
        try:
            seen.append((present, manager.check_status(room)))
        except KeyError as exc:
            seen.append(exc)

    reader = threading.Thread(target=transfer_thread)
    reader.start()
    found_in.wait(10)
    assert status_map.pop(room) == KVPoll.Success  # the scheduler's clear()
    assert status_map.pop(room + 1) == KVPoll.Success  # and the next concluded room's
    popped.set()
    reader.join(10)
    assert seen == [(True, KVPoll.Success)]
    with pytest.raises(KeyError):
        manager.check_status(room)  # the popping thread: the entry is gone

    def other_thread_reads() -> tuple[object, object]:
        """(``m[room]`` or its KeyError, ``m.get(room, "gone")``) read by another thread."""
        answer: list[object] = []

        def read() -> None:
            try:
                answer.append(status_map[room])
            except KeyError as exc:
                answer.append(exc)
            answer.append(status_map.get(room, "gone"))

        thread = threading.Thread(target=read)
        thread.start()
        thread.join(10)
        return answer[0], answer[1]

    # Within the grace m[room] answers the removed status; get keeps the dict's default (mooncake's
    # get(room, Failed) stops sending a popped room's chunks).
    assert other_thread_reads() == (KVPoll.Success, "gone")
    manager.update_status(room, KVPoll.Bootstrapping)  # a new request in the room ends the grace at once
    assert other_thread_reads() == (KVPoll.Bootstrapping, KVPoll.Bootstrapping)
    assert status_map.pop(room) == KVPoll.Bootstrapping
    monkeypatch.setattr(outage, "REMOVAL_RACE_SECONDS", 0.05)
    time.sleep(0.1)
    missing, got = other_thread_reads()
    assert isinstance(missing, KeyError) and got == "gone"  # past the grace, the dict's answers
    status_map.close()


@pytest.mark.parametrize("near_cache", [True, False], ids=["near-cache", "near-cache-off"])
def test_a_read_during_another_threads_pop_waits_for_the_removed_status(redis_server: Any, near_cache: bool) -> None:
    """The entry is gone from Redis but the pop has not returned yet: the read waits for it, then answers the
    removed status (a time window alone lost this race on a loaded box)."""
    manager = _installed(redis_server.url, fresh_namespace("sgdictpop2"), near_cache=near_cache)
    status_map, store = manager.request_status, manager.request_status.store
    room = 4343
    manager.update_status(room, KVPoll.Bootstrapping)
    manager.update_status(room, KVPoll.Success)
    removed_in_redis, original = threading.Event(), store.pop

    def slow_pop(*args: Any) -> Any:
        status = original(*args)
        removed_in_redis.set()
        time.sleep(0.3)  # the reply's way back, a GIL switch, a starved thread
        return status

    store.pop = slow_pop
    popper = threading.Thread(target=lambda: status_map.pop(room))
    popper.start()
    removed_in_redis.wait(10)
    assert manager.check_status(room) == KVPoll.Success
    popper.join(10)
    status_map.close()


@pytest.mark.slow
@pytest.mark.parametrize("near_cache", [True, False], ids=["near-cache", "near-cache-off"])
def test_transfer_threads_racing_the_schedulers_pops_never_see_a_keyerror(redis_server: Any, near_cache: bool) -> None:
    """SGLang's shape under load: a scheduler thread pops concluded rooms while two transfer threads test
    ``room not in request_status or check_status(room) == Success`` and a CPU-bound thread starves them of the
    GIL. Before the map's Removals (kvstatus.sglang.outage) waited for pops under way and kept removals 5 s, 8 s of this raised
    KeyError 1-3 times (the e2e tier's dead transfer thread)."""
    manager = _installed(redis_server.url, fresh_namespace("sgdictstress"), near_cache=near_cache)
    status_map = manager.request_status
    start = time.monotonic()
    live: list[int] = []
    lock = threading.Lock()
    errors: list[int] = []
    checks = [0]

    def running() -> bool:
        """8 s and at least 1,000 checks (the near-cache-off checks are two round trips each), at most 60 s."""
        elapsed = time.monotonic() - start
        return elapsed < 60 and (elapsed < 8 or checks[0] <= 1000)

    def scheduler() -> None:
        room = 100_000
        while running():
            room += 1
            manager.update_status(room, KVPoll.Bootstrapping)
            manager.update_status(room, KVPoll.Success)
            with lock:
                live.append(room)
                concluded, live[:] = live[:-2], live[-2:]
            for done in concluded:
                status_map.pop(done, None)

    def transfer() -> None:
        while running():
            with lock:
                rooms = list(live)
            for room in rooms:
                try:
                    if room not in status_map or manager.check_status(room) == KVPoll.Success:
                        checks[0] += 1
                except KeyError:
                    errors.append(room)

    def burner() -> None:
        spins = 0
        while running():
            spins += 1

    threads = [threading.Thread(target=work) for work in (scheduler, transfer, transfer, burner)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(90)
    status_map.close()
    assert errors == [] and checks[0] > 1000


def test_hits_served_by_many_threads_without_a_lock_are_all_counted(redis_server: Any) -> None:
    """The dict-speed path's hit count (kvstatus.cachestate.Freshness) is written by every polling thread with no
    lock, and taken by the driver under its lock, while the threads switch as often as the interpreter allows:
    the observer's hit total equals the reads served, from memory or through the driver."""
    from prometheus_client import CollectorRegistry

    from kvstatus import StatusStore
    from kvstatus.observe.metrics import StoreMetrics
    from kvstatus.sglang.mapping import RoomStatusMap

    namespace, registry = fresh_namespace("sghits"), CollectorRegistry()

    def hits() -> float:
        found = registry.get_sample_value("kvstatus_nearcache_hits_total", {"namespace": namespace, "participant": "p"})
        return found or 0.0

    threads_count, polls = 4, 5000
    with StatusStore.from_url(
        redis_server.url,
        namespace=namespace,
        participant="p",
        near_cache=True,
        metrics=StoreMetrics(namespace, "p", registry),
    ) as store:
        statuses = RoomStatusMap(store)
        store.update_status(7, KVPoll.Bootstrapping)
        assert statuses[7] == KVPoll.Bootstrapping  # the fill: a miss
        before = hits()
        start = threading.Barrier(threads_count)

        def poll() -> None:
            start.wait()
            for _ in range(polls):
                assert 7 in statuses and statuses[7] == KVPoll.Bootstrapping

        switch = sys.getswitchinterval()
        sys.setswitchinterval(1e-6)  # threads switch between any two bytecodes, mid-increment included
        try:
            workers = [threading.Thread(target=poll) for _ in range(threads_count)]
            for worker in workers:
                worker.start()
            for worker in workers:
                worker.join()
        finally:
            sys.setswitchinterval(switch)
        assert store.get(7) == KVPoll.Bootstrapping  # a read through the driver, which takes the count
        assert hits() - before == threads_count * polls * 2 + 1
