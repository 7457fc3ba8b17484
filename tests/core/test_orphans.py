"""Issue 33 item 3: a prefill's room that no decode joins fails well before SGLang's 300 s bootstrap timeout,
naming the cause; a decode that joins in time, however slowly, is never failed (kvstatus/peerwatch.py, 7).

The looks are called here, with the watch's clock moved instead of waiting (the background held still)."""

from __future__ import annotations

import pytest

from kvstatus import KVPoll
from kvstatus.leasestate import orphan_reason
from kvstatus.model import Stage
from kvstatus.peerwatch import ORPHAN_AFTER_DEATH_SECONDS, ORPHAN_SECONDS
from tests.helpers.backends import RedisUnderTest
from tests.helpers.clock import hold_background_watch, shift_watch_clock

B, W, F = KVPoll.Bootstrapping, KVPoll.WaitingForInput, KVPoll.Failed
PREFILL, DECODE = "prefill-10.0.0.7-8998-tp0-pp0", "decode-10.0.0.8-30000-tp0-pp0"


@pytest.fixture(autouse=True)
def _looks_by_hand(monkeypatch: pytest.MonkeyPatch) -> None:
    hold_background_watch(monkeypatch)


def test_a_room_no_decode_joined_fails_the_prefills_entry_naming_the_cause(
    backend: RedisUnderTest, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefill = backend.store(participant=PREFILL, lease_ttl=60)
    decode = backend.store(participant=DECODE, lease_ttl=60)
    orphan, joined, moved_on = 11, 2**40 + 3, 987_654_321_012
    for room in (orphan, joined, moved_on):
        prefill.update_status(room, B)
    decode.update_status(joined, B)  # its decode took the request in
    prefill.update_status(moved_on, W)  # bootstrapped: the decode had joined and left
    shift_watch_clock(monkeypatch, ORPHAN_SECONDS - 1)
    assert prefill.look_at_peers() == 0  # not yet
    shift_watch_clock(monkeypatch, ORPHAN_SECONDS + 1)
    assert prefill.look_at_peers() == 1
    assert prefill.get(orphan) is F
    failure = prefill.failure(orphan)
    assert (failure.origin, failure.stage) == (PREFILL, Stage.BOOTSTRAP)
    assert failure.reason == orphan_reason(orphan, ORPHAN_SECONDS)
    assert prefill.get(joined) is B and prefill.failure(joined) is None
    assert prefill.get(moved_on) is W
    assert prefill.look_at_peers() == 0  # judged once


def test_a_slow_decode_that_joins_in_time_is_never_failed(
    backend: RedisUnderTest, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefill = backend.store(participant=PREFILL, lease_ttl=60)
    decode = backend.store(participant=DECODE, lease_ttl=60)
    prefill.update_status(5, B)
    shift_watch_clock(monkeypatch, 0.9 * ORPHAN_SECONDS)
    assert prefill.look_at_peers() == 0
    decode.update_status(5, B)  # a decode whose scheduler took the request in 27 s late
    shift_watch_clock(monkeypatch, 3 * ORPHAN_SECONDS)
    assert prefill.look_at_peers() == 0
    assert prefill.get(5) is B and decode.get(5) is B and prefill.failure(5) is None


def test_while_a_decode_is_dead_a_room_no_decode_joined_fails_in_seconds(
    backend: RedisUnderTest, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefill = backend.store(participant=PREFILL, lease_ttl=60)
    dead = backend.store(participant=DECODE, lease_ttl=60)
    dead.update_status(1, B)
    prefill.update_status(1, B)
    assert prefill.look_at_peers() == 0  # the watch knows the decode
    backend.release_lease(dead)  # gone (its release tells the watch at once; a SIGKILL, its presence)
    assert prefill.look_at_peers() == 1  # its entry in room 1 failed
    prefill.update_status(2, B)  # a router still sends it requests: nobody joins this room
    shift_watch_clock(monkeypatch, ORPHAN_AFTER_DEATH_SECONDS + 0.5)
    assert prefill.look_at_peers() == 1
    assert prefill.failure(2).reason == orphan_reason(2, ORPHAN_AFTER_DEATH_SECONDS)


def test_only_a_prefill_judges_orphans(backend: RedisUnderTest, monkeypatch: pytest.MonkeyPatch) -> None:
    decode = backend.store(participant=DECODE, lease_ttl=60)
    other = backend.store(participant="worker-0", lease_ttl=60)
    decode.update_status(3, B)
    other.update_status(4, B)
    shift_watch_clock(monkeypatch, 10 * ORPHAN_SECONDS)
    assert decode.look_at_peers() == 0 and other.look_at_peers() == 0
    assert decode.get(3) is B and other.get(4) is B
