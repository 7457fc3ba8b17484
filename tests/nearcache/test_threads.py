"""The near cache shared by threads, as SGLang shares a manager's store between its scheduler and its transfer
threads: cache hits in some threads while others fill. Before the fix a hit's poll of the links took a fill's
reply arriving on the data connection for a closed connection and dropped the link mid-read: the filling thread
raised KeyError('') (108 times in 3 s with five threads), which killed SGLang's transfer thread in the e2e tier.
"""

from __future__ import annotations

import random
import threading
import time

import pytest

from kvstatus import KVPoll, StatusStore

pytestmark = pytest.mark.real

SECONDS = 1.5  # the workload's length, not a bound: the assertions are about errors and answers


def test_hits_and_fills_in_threads_never_break_each_others_reads(cached: StatusStore, writer: StatusStore) -> None:
    writer.update_status(1, KVPoll.Bootstrapping)
    assert cached.get(1) is KVPoll.Bootstrapping  # room 1 is cached from here on
    flushes_before = cached.near_cache.state.flushes
    errors: list[str] = []
    wrong: list[object] = []
    reads = [0]
    stop = time.monotonic() + SECONDS

    def hits() -> None:
        while time.monotonic() < stop:
            try:
                if cached.get(1) is not KVPoll.Bootstrapping:
                    wrong.append("room 1")
            except Exception as exc:  # noqa: BLE001 - every error is the finding
                errors.append(repr(exc))
            reads[0] += 1

    def fills() -> None:
        rng = random.Random()
        while time.monotonic() < stop:
            room = rng.randrange(10**6, 10**9)  # never written: each read is a fill
            try:
                if cached.get(room) is not None:
                    wrong.append(room)
            except Exception as exc:  # noqa: BLE001
                errors.append(repr(exc))
            reads[0] += 1

    threads = [threading.Thread(target=hits) for _ in range(3)] + [threading.Thread(target=fills) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == [] and wrong == []
    assert reads[0] > 100
    assert cached.get(1) is KVPoll.Bootstrapping
    # No thread took another's reply for a closed connection: the link opened once and was never dropped
    # (before the fix of Links.reads, 146 flushes in 2 s emptied the cache and reopened the link).
    state = cached.near_cache.state
    assert state.flushes == flushes_before, state.flush_reasons
