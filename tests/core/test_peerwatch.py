"""The peer watch (kvstatus/peerwatch.py): a store with a lease fails its dead or restarted peers' open entries
in its own open rooms, on every backend (fakeredis, Redis, Cluster; sync and async).

The watch runs every second in the lease keeper's background; these tests call ``look_at_peers()`` (one
look, now) and move the watch's clock instead of waiting a lease TTL out. tests/demo/test_faults.py and
tests/sglang/test_real_peer_death.py let the background do it, with the peer a SIGKILLed process.
"""

from __future__ import annotations

import pytest

from kvstatus import InvalidArgumentError, KVPoll, LeaseLostError
from kvstatus.model import Stage
from tests.helpers.backends import RedisUnderTest
from tests.helpers.clock import hold_background_watch, shift_watch_clock

B, W, T, S, F = KVPoll.Bootstrapping, KVPoll.WaitingForInput, KVPoll.Transferring, KVPoll.Success, KVPoll.Failed
# Rooms over many slots (a cluster spreads them over its three masters).
ROOMS = [11, 2**40 + 3, 987_654_321_012, 5, 77_777]


@pytest.fixture(autouse=True)
def _looks_by_hand(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests call the looks themselves and count what each one failed."""
    hold_background_watch(monkeypatch)


def _pair(backend: RedisUnderTest):  # type: ignore[no-untyped-def]
    decode = backend.store(participant="decode-0", lease_ttl=3)
    prefill = backend.store(participant="prefill-0", lease_ttl=3)
    for room in ROOMS:
        decode.update_status(room, B)
        prefill.update_status(room, B)
    decode.update_status(ROOMS[0], W)
    prefill.update_status(ROOMS[0], T)
    prefill.update_status(ROOMS[1], S)  # the prefill's part is done here
    decode.update_status(ROOMS[2], S)  # the decode's part is done here: it waits on nobody
    assert decode.look_at_peers() == 0 and prefill.look_at_peers() == 0
    return decode, prefill


def _check_failed(backend: RedisUnderTest, decode, stage: Stage, reason: str) -> None:  # type: ignore[no-untyped-def]
    for room in (ROOMS[0], ROOMS[3], ROOMS[4]):
        assert decode.get(room) is F
        failure = decode.failure(room)
        assert failure.stage is stage and failure.origin == "prefill-0" and failure.reason == reason
        assert decode.room(room).participants["prefill-0"].status is F  # durable: the entry itself
        assert decode.room(room).participants["decode-0"].status is not F  # the read derives the rest
    assert decode.get(ROOMS[1]) is B and decode.failure(ROOMS[1]) is None  # the dead peer had finished
    assert decode.get(ROOMS[2]) is S  # not an open room of the decode's: left as it was
    assert decode.room(ROOMS[2]).participants["prefill-0"].status is B


def test_a_peer_that_closed_fails_its_open_entries_at_the_next_look(backend: RedisUnderTest) -> None:
    decode, prefill = _pair(backend)
    backend.release_lease(prefill)
    assert decode.look_at_peers() == 3
    _check_failed(backend, decode, Stage.LEASE_LOST, "participant prefill-0 lost its lease")
    assert decode.look_at_peers() == 0  # idempotent: nothing open is left


def test_a_peer_whose_lease_expired_fails_once_its_mark_is_stale(
    backend: RedisUnderTest, monkeypatch: pytest.MonkeyPatch
) -> None:
    decode, prefill = _pair(backend)
    backend.raw.hset(f"kvstatus:{backend.namespace}:lease:prefill-0", "deadline", 1)  # Redis' clock passed it
    assert decode.look_at_peers() == 0  # its mark changed less than 2.5 looks ago
    shift_watch_clock(monkeypatch, 3.5)
    assert decode.look_at_peers() == 3
    _check_failed(backend, decode, Stage.LEASE_LOST, "participant prefill-0 lost its lease")
    # Watched on: a room the decode opens later, where the dead peer had an entry, fails at the next look.
    later = 31_337
    backend.raw.hset(f"kvstatus:{backend.namespace}:{{{later}}}", "prefill-0", "1")
    decode.update_status(later, B)
    assert decode.get(later) is B
    assert decode.look_at_peers() == 1 and decode.get(later) is F


def test_a_paused_peer_is_not_failed(backend: RedisUnderTest, monkeypatch: pytest.MonkeyPatch) -> None:
    decode, prefill = _pair(backend)
    shift_watch_clock(monkeypatch, 3.5)  # no mark changed for a TTL: every peer is a suspect ...
    assert decode.look_at_peers() == 0  # ... but Redis says its lease is alive: nothing fails
    assert decode.get(ROOMS[0]) is W and decode.failure(ROOMS[0]) is None


def test_a_peer_restarted_under_its_name_fails_its_previous_incarnations_entries(backend: RedisUnderTest) -> None:
    decode, prefill = _pair(backend)
    again = backend.store(participant="prefill-0", lease_ttl=3)
    again.acquire_lease()
    assert again.lease.generation == 2
    assert decode.look_at_peers() == 3
    reason = "participant prefill-0 restarted; this entry was its previous incarnation's"
    _check_failed(backend, decode, Stage.SUPERSEDED, reason)
    # A room opened after the restart was seen is the new incarnation's: never failed by it.
    decode.update_status(99, B)
    again.update_status(99, B)
    assert decode.look_at_peers() == 0 and decode.get(99) is B


def test_the_lease_index_is_one_key_with_a_ttl(backend: RedisUnderTest) -> None:
    decode, prefill = _pair(backend)
    index = f"kvstatus:{backend.namespace}:leases"
    marks = {k.decode(): v.decode() for k, v in backend.raw.hgetall(index).items()}
    assert sorted(marks) == ["decode-0", "prefill-0"]
    incarnation, looks = marks["decode-0"].split(":")
    assert incarnation == decode.lease.incarnation and looks.isdigit()  # the incarnation, and a count of looks
    assert 0 < backend.raw.pttl(index) <= (600 + 3) * 1000
    assert backend.room_keys() == sorted(backend.room_keys())  # the index is not a room
    assert index not in backend.room_keys()


def test_the_watch_needs_a_lease(backend: RedisUnderTest) -> None:
    store = backend.store(participant="decode-0")
    with pytest.raises(InvalidArgumentError, match="no lease, so no peer watch: build it with lease_ttl"):
        store.look_at_peers()


def test_a_lost_lease_can_be_held_again_as_a_new_incarnation(backend: RedisUnderTest) -> None:
    decode, prefill = _pair(backend)
    backend.raw.hset(f"kvstatus:{backend.namespace}:lease:decode-0", "deadline", 1)
    with pytest.raises(LeaseLostError, match="lost its lease"):
        decode.acquire_lease()
    decode.acquire_lease(again=True)
    assert decode.lease.held and decode.lease.generation == 2
    decode.update_status(123, B)
    assert decode.get(123) is B
    # Its peer sees the restart: the decode's entries of the lost incarnation fail in the prefill's rooms.
    assert prefill.look_at_peers() >= 1
    assert prefill.failure(ROOMS[3]).stage is Stage.SUPERSEDED


def test_a_dead_peers_mark_is_dropped_once_its_record_would_be_gone(
    backend: RedisUnderTest, monkeypatch: pytest.MonkeyPatch
) -> None:
    decode, prefill = _pair(backend)
    backend.release_lease(prefill)
    assert decode.look_at_peers() == 3
    index = f"kvstatus:{backend.namespace}:leases"
    assert backend.raw.hexists(index, "prefill-0")
    shift_watch_clock(monkeypatch, 600 + 3 + 1)  # the room TTL plus the lease TTL: the record is gone
    assert decode.look_at_peers() == 0
    assert not backend.raw.hexists(index, "prefill-0") and backend.raw.hexists(index, "decode-0")


# -- a room waiting on a peer that never wrote it (issue 16 item 2: the peer judged by its address) -----------

ADDRESS = "127.0.0.1:8998"


def _waiting(backend: RedisUnderTest):  # type: ignore[no-untyped-def]
    """A decode with three rooms the prefill never wrote: one waits on the prefill's address, one on another
    address, one on none; the watch has seen both leases."""
    decode = backend.store(participant="decode-0", lease_ttl=3)
    prefill = backend.store(participant="prefill-0", lease_ttl=3, address=ADDRESS)
    prefill.acquire_lease()
    for room in ROOMS[:3]:
        decode.update_status(room, B)
    decode.awaits(ROOMS[0], ADDRESS)
    decode.awaits(ROOMS[1], "10.0.0.9:8998")
    assert decode.look_at_peers() == 0
    return decode, prefill


def _check_awaited_failed(decode, stage: Stage, reason: str) -> None:  # type: ignore[no-untyped-def]
    assert decode.get(ROOMS[0]) is F
    failure = decode.failure(ROOMS[0])
    assert (failure.stage, failure.origin, failure.reason) == (stage, "decode-0", reason)
    assert decode.room(ROOMS[0]).participants["decode-0"].status is F  # durable: its own entry
    assert "prefill-0" not in decode.room(ROOMS[0]).participants  # nothing written for the peer
    for room in ROOMS[1:3]:  # another address, or none: left alone
        assert decode.get(room) is B and decode.failure(room) is None


def test_a_room_waiting_on_a_peer_that_never_wrote_it_fails_when_its_lease_is_lost(
    backend: RedisUnderTest, monkeypatch: pytest.MonkeyPatch
) -> None:
    decode, prefill = _waiting(backend)
    backend.raw.hset(f"kvstatus:{backend.namespace}:lease:prefill-0", "deadline", 1)  # Redis' clock passed it
    assert decode.look_at_peers() == 0  # not a suspect yet
    shift_watch_clock(monkeypatch, 3.5)
    assert decode.look_at_peers() == 1
    _check_awaited_failed(
        decode, Stage.LEASE_LOST, f"participant prefill-0 lost its lease; this room waits on it at {ADDRESS}"
    )
    assert decode.look_at_peers() == 0  # idempotent
    # Watched on: a room opened later that waits on the dead address fails at the next look.
    later = 31_337
    decode.update_status(later, B)
    decode.awaits(later, ADDRESS)
    assert decode.get(later) is B
    assert decode.look_at_peers() == 1 and decode.get(later) is F


def test_a_room_waiting_on_a_live_or_paused_peer_is_not_failed(
    backend: RedisUnderTest, monkeypatch: pytest.MonkeyPatch
) -> None:
    decode, prefill = _waiting(backend)
    shift_watch_clock(monkeypatch, 3.5)  # every mark looks stale, but Redis says the lease is alive
    assert decode.look_at_peers() == 0
    assert [decode.get(room) for room in ROOMS[:3]] == [B, B, B]


def test_a_room_waiting_on_a_peer_that_restarted_before_writing_it_fails(backend: RedisUnderTest) -> None:
    decode, prefill = _waiting(backend)
    again = backend.store(participant="prefill-0", lease_ttl=3, address=ADDRESS)
    again.acquire_lease()
    assert decode.look_at_peers() == 1
    reason = f"participant prefill-0 restarted; this room waited on its previous incarnation at {ADDRESS}"
    _check_awaited_failed(decode, Stage.SUPERSEDED, reason)


def test_a_room_that_concluded_or_was_written_by_the_peer_is_judged_as_before(backend: RedisUnderTest) -> None:
    decode, prefill = _waiting(backend)
    prefill.update_status(ROOMS[1], B)  # the peer wrote this one: its own entry is what fails
    decode.awaits(ROOMS[1], ADDRESS)
    decode.update_status(ROOMS[2], S)  # the decode's part is done: it waits on nobody any more
    decode.awaits(ROOMS[2], ADDRESS)
    backend.release_lease(prefill)
    assert decode.look_at_peers() == 2
    assert decode.failure(ROOMS[1]).origin == "prefill-0"  # the peer's entry, failed as before
    assert decode.failure(ROOMS[1]).reason == "participant prefill-0 lost its lease"
    assert decode.get(ROOMS[0]) is F and decode.failure(ROOMS[0]).origin == "decode-0"
    assert decode.get(ROOMS[2]) is S


def test_a_room_still_open_here_after_the_peer_it_waits_on_died_at_success_fails(
    backend: RedisUnderTest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The prefill wrote Success, then died before it told the decode (SGLang: its completion message); the
    decode's entry is still open and nothing more will come. Once the prefill's lease expires, the decode's own
    entry fails there; the prefill's Success stays."""
    decode, prefill = _waiting(backend)
    prefill.update_status(ROOMS[0], B)
    prefill.update_status(ROOMS[0], S)
    backend.raw.hset(f"kvstatus:{backend.namespace}:lease:prefill-0", "deadline", 1)
    shift_watch_clock(monkeypatch, 3.5)
    assert decode.look_at_peers() == 1
    failure = decode.failure(ROOMS[0])
    reason = f"participant prefill-0 lost its lease; this room waits on it at {ADDRESS}"
    assert (failure.stage, failure.origin, failure.reason) == (Stage.LEASE_LOST, "decode-0", reason)
    assert decode.get(ROOMS[0]) is F
    assert decode.room(ROOMS[0]).participants["prefill-0"].status is S  # its part stays done
    for room in ROOMS[1:3]:  # another address, or none: left alone
        assert decode.get(room) is B and decode.failure(room) is None


def test_a_room_still_open_here_after_the_peer_it_waits_on_restarted_at_success_fails(backend: RedisUnderTest) -> None:
    """As above, but the prefill restarted under its name: the room fails at the look that sees the new
    incarnation, not at a lease TTL; a room where the new incarnation reached Success itself is left alone."""
    decode, prefill = _waiting(backend)
    prefill.update_status(ROOMS[0], B)
    prefill.update_status(ROOMS[0], S)
    decode.update_status(ROOMS[1], W)
    decode.awaits(ROOMS[1], ADDRESS)
    again = backend.store(participant="prefill-0", lease_ttl=3, address=ADDRESS)
    again.acquire_lease()
    again.update_status(ROOMS[1], B)
    again.update_status(ROOMS[1], S)
    assert decode.look_at_peers() == 1
    failure = decode.failure(ROOMS[0])
    reason = f"participant prefill-0 restarted; this room waited on its previous incarnation at {ADDRESS}"
    assert (failure.stage, failure.origin, failure.reason) == (Stage.SUPERSEDED, "decode-0", reason)
    assert decode.get(ROOMS[0]) is F
    assert decode.room(ROOMS[0]).participants["prefill-0"].status is S  # its part stays done
    assert decode.get(ROOMS[1]) is W and decode.failure(ROOMS[1]) is None  # the new incarnation's own Success
    assert decode.get(ROOMS[2]) is B and decode.failure(ROOMS[2]) is None  # waits on no address


def test_a_peer_that_released_its_lease_at_success_then_restarted_fails_nothing_here(backend: RedisUnderTest) -> None:
    decode, prefill = _waiting(backend)
    prefill.update_status(ROOMS[0], B)
    prefill.update_status(ROOMS[0], S)
    backend.release_lease(prefill)
    assert decode.look_at_peers() == 0  # the released mark is seen
    again = backend.store(participant="prefill-0", lease_ttl=3, address=ADDRESS)
    again.acquire_lease()
    assert decode.look_at_peers() == 0
    assert decode.get(ROOMS[0]) is B and decode.failure(ROOMS[0]) is None


def test_a_peer_that_released_its_lease_after_success_fails_nothing_here(backend: RedisUnderTest) -> None:
    """An orderly exit (the lease released) sends what it owes first: a room where the peer reached Success is
    left to finish."""
    decode, prefill = _waiting(backend)
    prefill.update_status(ROOMS[0], B)
    prefill.update_status(ROOMS[0], S)
    backend.release_lease(prefill)
    assert decode.look_at_peers() == 0
    assert decode.get(ROOMS[0]) is B and decode.failure(ROOMS[0]) is None


def test_the_lease_record_carries_the_address_of_its_incarnation(backend: RedisUnderTest) -> None:
    decode, prefill = _waiting(backend)
    key = f"kvstatus:{backend.namespace}:lease:prefill-0"
    assert backend.raw.hget(key, "addr") == ADDRESS.encode()
    assert backend.raw.hget(f"kvstatus:{backend.namespace}:lease:decode-0", "addr") is None
    again = backend.store(participant="prefill-0", lease_ttl=3)  # a new incarnation without one drops it
    again.acquire_lease()
    assert backend.raw.hget(key, "addr") is None


@pytest.mark.parametrize("address", ["8998", "127.0.0.1", "127.0.0.1:0", "a b:1", "127.0.0.1:99999", 8998])
def test_a_bad_address_is_refused_naming_it(backend: RedisUnderTest, address: object) -> None:
    store = backend.store(participant="decode-0", lease_ttl=3)
    with pytest.raises(InvalidArgumentError, match=r"invalid address .*expected host:port"):
        store.awaits(1, address)
    with pytest.raises(InvalidArgumentError, match=r"invalid address .*expected host:port"):
        backend.store(participant="prefill-0", lease_ttl=3, address=address)


def test_an_address_needs_a_lease(backend: RedisUnderTest) -> None:
    with pytest.raises(InvalidArgumentError, match="needs a lease: build the store with lease_ttl"):
        backend.store(participant="prefill-0", address=ADDRESS)
    with pytest.raises(InvalidArgumentError, match="no lease, so no peer watch"):
        backend.store(participant="decode-0").awaits(1, ADDRESS)


@pytest.mark.parametrize(
    "op, extra, refused",
    [
        ("acquire", ["a b:1"], "the address"),
        ("acquire", ["nohost"], "the address"),
        ("renew", [ADDRESS], "the address"),
        ("acquire", ["", "a b:1"], "the holder"),
        ("acquire", ["", "x" * 301], "the holder"),
        ("renew", ["", "host:1"], "the holder"),
    ],
)
def test_the_lease_script_refuses_a_malformed_address_or_holder_or_one_outside_an_acquire(
    backend: RedisUnderTest, op: str, extra: list[str], refused: str
) -> None:
    import redis

    from kvstatus import scripts

    key = f"kvstatus:{backend.namespace}:lease:p"
    lease = backend.raw.register_script(scripts.LEASE.source)
    with pytest.raises(redis.ResponseError, match=f"KVSTATUS_BADARG {refused}"):
        lease(keys=[key], args=[op, "ab", "3000", "60000", *extra])
    assert not backend.raw.exists(key)  # nothing written


def test_the_lease_record_names_its_holding_process(backend: RedisUnderTest) -> None:
    import os
    import socket

    store = backend.store(participant="prefill-0", lease_ttl=3)
    store.acquire_lease()
    holder = backend.raw.hget(f"kvstatus:{backend.namespace}:lease:prefill-0", "holder")
    assert holder == f"{socket.gethostname()}:{os.getpid()}".encode()


@pytest.mark.parametrize("fault", ["released", "restarted"])
def test_a_sweep_that_redis_failed_is_planned_again_at_the_next_look(
    backend: RedisUnderTest, monkeypatch: pytest.MonkeyPatch, fault: str
) -> None:
    """Redis fails the sweep of a look that judged a peer lost or restarted (an outage at that moment): the look
    raises, and the next one sweeps the same rooms. Before, the watch had already taken the peer's new mark in,
    so the lost peer's older rooms, or the restarted peer's, were never failed."""
    from kvstatus import BackendUnavailableError
    from kvstatus import leasestate as module

    decode, prefill = _pair(backend)
    if fault == "released":
        backend.release_lease(prefill)
    else:
        backend.store(participant="prefill-0", lease_ttl=3).acquire_lease()
    sweep = module.fail_entries_request

    def unreachable(*args: object, **kwargs: object) -> object:
        raise BackendUnavailableError("Redis unavailable (injected: the sweep's connection broke)")

    monkeypatch.setattr(module, "fail_entries_request", unreachable)
    with pytest.raises(BackendUnavailableError, match="injected"):
        decode.look_at_peers()
    assert decode.get(ROOMS[0]) is W  # nothing was failed
    monkeypatch.setattr(module, "fail_entries_request", sweep)
    assert decode.look_at_peers() == 3
    assert [decode.get(room) for room in (ROOMS[0], ROOMS[3], ROOMS[4])] == [F, F, F]
