"""A step of Redis' clock (issue 36, low): the limit docs/operations.md states, held on a real redis-server.

A lease is alive while Redis' clock has not passed the deadline its last renewal set (lua/lease.lua), and every
judge of a lease (the renewal, the peer watch's check, the consensus read, the sweep) reads that same clock. So a
step forward loses live leases (their holders' renewals answer LOST and their peers fail their open entries): the
limit docs/operations.md states. A step back kept a silent holder's lease alive the step longer; the peer watch
now times a suspect's silence on its own monotonic clock and expires the lease in Redis (lua/lease.lua "expire"). The
step is simulated where the scripts read ``TIME`` (:func:`tests.helpers.clock.step_redis_clock`); the stores, the
scripts and the server are real. No look waits: the peer watch's own clock is moved (``shift_watch_clock``).
"""

from __future__ import annotations

from typing import Any

import pytest

from kvstatus import KVPoll, LeaseLostError, StatusStore
from kvstatus.rule import lost_reason
from tests.helpers.backends import fresh_namespace
from tests.helpers.clock import hold_background_watch, shift_watch_clock, step_redis_clock

pytestmark = pytest.mark.real

B, W, F = KVPoll.Bootstrapping, KVPoll.WaitingForInput, KVPoll.Failed
ROOM = 4242


def _pair(redis_server: Any, prefill_ttl: float) -> tuple[StatusStore, StatusStore]:
    """A decode (a long lease: its own renewals never meet the step) and a prefill in one room, marks learnt."""
    namespace = fresh_namespace("clock")
    decode = StatusStore(redis_server.client(), namespace=namespace, participant="decode-0", lease_ttl=300)
    prefill = StatusStore(redis_server.client(), namespace=namespace, participant="prefill-0", lease_ttl=prefill_ttl)
    prefill.update_status(ROOM, B)
    decode.update_status(ROOM, W)
    assert decode.look_at_peers() == 0  # the decode's watch learns the prefill's mark
    return decode, prefill


def test_a_step_forward_loses_a_live_lease(redis_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """40 s forward, as measured in the issue: the prefill runs and renews, yet its lease reads lost."""
    hold_background_watch(monkeypatch)
    decode, prefill = _pair(redis_server, prefill_ttl=10)
    shift_watch_clock(monkeypatch, 10)  # the prefill's mark looks stale (its looks are held): a suspect
    assert decode.look_at_peers() == 0  # checked against Redis' clock: alive, nothing failed
    step_redis_clock(monkeypatch, 40_000)
    assert decode.look_at_peers() == 1  # the same check after the step: lost, its open entry failed
    assert decode.get(ROOM) is F and decode.failure(ROOM).reason == lost_reason("prefill-0")
    with pytest.raises(LeaseLostError):
        prefill.acquire_lease()  # its own renewal answers LOST: its writes raise from now on
    decode.close()
    prefill.close()


def test_a_step_back_does_not_keep_a_silent_lease_alive(redis_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """120 s back: a prefill that stopped renewing (a hung or lost host: no socket closes, so no presence leaves)
    was judged alive until Redis' clock was past its deadline again, the step after its lease TTL ran out. The
    peer watch now times the silence on its own monotonic clock, and expires the lease in Redis after its TTL."""
    hold_background_watch(monkeypatch)
    decode, prefill = _pair(redis_server, prefill_ttl=3)
    prefill._keeper._background.stop()  # type: ignore[union-attr]  # no renewal from here on
    shift_watch_clock(monkeypatch, 10)  # its mark is stale: a suspect
    step_redis_clock(monkeypatch, -120_000 + 4_000)  # its 3 s TTL ran out, but the clock went 120 s back
    assert decode.look_at_peers() == 0  # alive by Redis' clock: the watch notes its last renewal
    assert decode.get(ROOM) is W
    shift_watch_clock(monkeypatch, 20)  # silent for more than its 3 s TTL by the watch's own clock
    assert decode.look_at_peers() == 1  # expired in Redis, and its open entry failed: Redis' clock is still back
    assert decode.get(ROOM) is F and decode.failure(ROOM).reason == lost_reason("prefill-0")
    assert decode.room_status(ROOM, ["prefill-0", "decode-0"]).lost == ("prefill-0",)  # every reader sees it
    with pytest.raises(LeaseLostError):
        prefill.acquire_lease()  # lost for good: its renewal answers LOST
    decode.close()
    prefill.close()


def test_a_renewal_between_two_looks_keeps_the_lease(redis_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The watch expires only the renewal it timed: a holder that renewed since (a slow look, not a silent host)
    keeps its lease and its room."""
    hold_background_watch(monkeypatch)
    decode, prefill = _pair(redis_server, prefill_ttl=3)
    shift_watch_clock(monkeypatch, 10)
    assert decode.look_at_peers() == 0  # a suspect, alive: its last renewal noted
    prefill.acquire_lease()  # renewed now (its looks are held, so its mark stays stale)
    shift_watch_clock(monkeypatch, 20)
    assert decode.look_at_peers() == 0  # a new renewal: timed from now, nothing expired
    assert decode.get(ROOM) is W
    prefill.update_status(ROOM, KVPoll.Transferring)  # its lease is held: it writes
    decode.close()
    prefill.close()
