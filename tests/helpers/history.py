"""A linearizability check of the store, per (room, participant) entry.

Worker processes × threads run random update / abort / clear / record_failure
/ update_many / get calls on a few shared rooms. Every call is recorded with
its invocation and response times (``time.monotonic_ns``, one clock for all
processes of the machine) and what it returned. :func:`find_violations` then
searches, for each entry, a single order of its calls that respects real time
(a call that returned before another was invoked comes first; each thread's
calls are sequential, so its own order is kept) and in which every returned
value is what the reference rule (:func:`kvstatus.rule.apply_rule`) gives.
An ``update_many`` is checked as one call per room it touches, all with the
same interval. Linearizability is local, so checking entries one by one is
the same as checking the whole store.

With ``naive=True`` the workers use the client-side read-then-write baseline
(:class:`kvstatus.demo.baselines.ClientSideStore`, its race window widened):
the check must reject it, which proves it has teeth.
"""

from __future__ import annotations

import multiprocessing
import random
import threading
import time
from collections import defaultdict
from typing import Any, NamedTuple, Optional

import redis

from kvstatus import KVPoll, StatusStore, apply_rule
from kvstatus.demo.workload import make_store
from kvstatus.model import Outcome, Policy

# An entry's state: (status value or None, reason or None).
State = tuple[Optional[int], Optional[str]]
EMPTY: State = (None, None)
RACE_WINDOW = 0.0005
"""Seconds the client-side baseline sleeps between read and write (a real client's window, widened)."""


class Call(NamedTuple):
    """One recorded call on one entry. ``result`` is what the store returned, in plain values."""

    thread: str
    start: int
    end: int
    room: int
    participant: str
    kind: str  # "update", "clear", "fail" (record_failure), "get", "state" (the final read)
    arg: Any
    result: Any


def step(state: State, kind: str, arg: Any, policy: Policy = Policy.SEED) -> tuple[State, Any]:
    """The reference model of one call: the next state and the value the store must return."""
    status, reason = state
    if kind == "update":
        current = None if status is None else KVPoll(status)
        outcome, after = apply_rule(current, KVPoll(arg), policy)
        if outcome is Outcome.ADVANCED and current == KVPoll.Failed:
            reason = None
        new_status = None if after is None else int(after)
        return (new_status, reason if new_status is not None else None), (int(outcome), new_status)
    if kind == "clear":
        return EMPTY, state != EMPTY
    if kind == "fail":
        if status is None or reason is not None:
            return state, False
        return (status, arg), True
    if kind == "get":
        return state, status
    if kind == "state":
        return state, state
    raise ValueError(kind)


class Inconclusive(Exception):
    """The search ran out of its step budget; make the history smaller."""


def linearizable(calls: list[Call], policy: Policy = Policy.SEED, budget: int = 2_000_000) -> bool:
    """True if some real-time-respecting order of ``calls`` (one entry's) explains every result."""
    calls = sorted(calls, key=lambda c: c.start)
    n = len(calls)
    full = (1 << n) - 1
    seen: set[tuple[int, State]] = set()
    steps = 0
    stack: list[tuple[int, State]] = [(0, EMPTY)]
    while stack:
        done, state = stack.pop()
        if done == full:
            return True
        if (done, state) in seen:
            continue
        seen.add((done, state))
        steps += 1
        if steps > budget:
            raise Inconclusive(f"{n} calls")
        pending = [i for i in range(n) if not done >> i & 1]
        horizon = min(calls[i].end for i in pending)
        for i in pending:
            call = calls[i]
            if call.start > horizon:
                break  # sorted by start: no later call can be minimal either
            after, expected = step(state, call.kind, call.arg, policy)
            if expected == call.result:
                stack.append((done | 1 << i, after))
    return False


def find_violations(calls: list[Call], policy: Policy = Policy.SEED) -> list[tuple[int, str]]:
    """The (room, participant) entries whose history no order explains."""
    by_entry: dict[tuple[int, str], list[Call]] = defaultdict(list)
    for call in calls:
        by_entry[call.room, call.participant].append(call)
    return [entry for entry, history in sorted(by_entry.items()) if not linearizable(history, policy)]


def _make_store(url: str, namespace: str, participant: str, naive: bool, policy: Policy) -> Any:
    implementation = "client-side" if naive else "kvstatus"
    return make_store(
        implementation,
        redis.Redis.from_url(url),
        namespace,
        participant=participant,
        policy=policy,
        race_window=RACE_WINDOW,
        # Each entry is checked as its own register: a get reads the entry alone, not as shared fate judges
        # it from the other entries (tests/core/test_shared_fate.py and the state machine cover that).
        shared_fate=False,
        # Timelines on (kvstatus only): tests/torture/test_history.py checks each is atomic with its status.
        **({} if naive else {"timeline": True}),
    )


def _thread_calls(
    url: str,
    namespace: str,
    name: str,
    seed: int,
    rooms: list[int],
    participants: list[str],
    ops: int,
    naive: bool,
    policy: Policy,
    out: list[Call],
) -> None:
    rng = random.Random(seed)
    stores = {p: _make_store(url, namespace, p, naive, policy) for p in participants}
    clock = time.monotonic_ns
    for _ in range(ops):
        participant = rng.choice(participants)
        store = stores[participant]
        room = rng.choice(rooms)
        kind = rng.choices(["update", "abort", "clear", "fail", "batch", "get"], [5, 2, 2, 1, 2, 1])[0]
        start = clock()
        if kind in ("update", "abort"):
            status = KVPoll.Failed if kind == "abort" else rng.choice(list(KVPoll)[1:])
            outcome, after = store.update_status(room, status)
            end = clock()
            out.append(
                Call(
                    name,
                    start,
                    end,
                    room,
                    participant,
                    "update",
                    int(status),
                    (int(outcome), None if after is None else int(after)),
                )
            )
        elif kind == "clear":
            removed = store.clear(room)
            out.append(Call(name, start, clock(), room, participant, "clear", None, removed))
        elif kind == "fail":
            reason = f"{name}-{start % 1000}"
            recorded = store.record_failure(room, reason)
            out.append(Call(name, start, clock(), room, participant, "fail", reason, recorded))
        elif kind == "get":
            status = store.get(room)
            out.append(
                Call(name, start, clock(), room, participant, "get", None, None if status is None else int(status))
            )
        else:
            updates = {r: rng.choice(list(KVPoll)) for r in rng.sample(rooms, 2)}
            results = store.update_many(updates)
            end = clock()
            for r, status in updates.items():
                outcome, after = results[r]
                out.append(
                    Call(
                        name,
                        start,
                        end,
                        r,
                        participant,
                        "update",
                        int(status),
                        (int(outcome), None if after is None else int(after)),
                    )
                )


def _process(
    url: str,
    namespace: str,
    index: int,
    threads: int,
    rooms: list[int],
    participants: list[str],
    ops: int,
    naive: bool,
    policy: Policy,
    queue: Any,
) -> None:
    calls: list[Call] = []
    errors: list[str] = []

    def thread(t: int) -> None:
        try:
            _thread_calls(
                url, namespace, f"p{index}t{t}", index * 100 + t, rooms, participants, ops, naive, policy, calls
            )
        except Exception as exc:  # noqa: BLE001 - reported to the parent, which fails the test with it
            errors.append(f"p{index}t{t}: {exc!r}")

    workers = [threading.Thread(target=thread, args=(t,)) for t in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    queue.put(([tuple(call) for call in calls], errors))


def run_history(
    url: str,
    namespace: str,
    *,
    naive: bool = False,
    processes: int = 4,
    threads: int = 3,
    rooms: int = 3,
    participants: int = 2,
    ops: int = 25,
    policy: Policy = Policy.SEED,
) -> list[Call]:
    """Run the workers and return every recorded call (fork start method: the test's imports are reused)."""
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    room_ids = [2**62 + i for i in range(rooms)]
    names = [f"node-{i}" for i in range(participants)]
    workers = [
        ctx.Process(target=_process, args=(url, namespace, i, threads, room_ids, names, ops, naive, policy, queue))
        for i in range(processes)
    ]
    for worker in workers:
        worker.start()
    calls: list[Call] = []
    errors: list[str] = []
    for _ in workers:
        recorded, failed = queue.get(timeout=120)
        calls += [Call(*fields) for fields in recorded]
        errors += failed
    for worker in workers:
        worker.join(timeout=30)
    if errors or any(worker.exitcode != 0 for worker in workers):
        raise RuntimeError(f"history workers failed: {errors} exit codes {[w.exitcode for w in workers]}")
    client = redis.Redis.from_url(url)
    schema = StatusStore(client, namespace=namespace).schema
    for room in room_ids:
        for name in names:
            start = time.monotonic_ns()
            status, reason = client.hmget(schema.room_key(room), name, f"reason:{name}")
            state = (None if status is None else int(status), None if reason is None else reason.decode())
            calls.append(Call("final", start, time.monotonic_ns(), room, name, "state", None, state))
    client.close()
    return calls
