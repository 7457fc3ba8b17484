"""kvstatus.sglang against the stand-in of sglang's KV manager (no sglang needed; always runs)."""

from __future__ import annotations

import sys
import threading

import fakeredis
import pytest
import redis

from kvstatus import InvalidArgumentError, KVPoll, Outcome, StatusStore
from kvstatus.sglang import (
    RoomStatusMap,
    SettingError,
    install,
    is_installed,
    participant_name,
    pp_participants,
    uninstall,
)
from kvstatus.sglang.plugin import ENV_URL, KNOWN_VARIABLES, install_from_env, install_options, register
from tests.helpers.backends import RedisUnderTest, fresh_namespace
from tests.nearcache.helpers import eventually
from tests.sglang import differential, standin
from tests.sglang.standin import CommonKVSender, DeferredBootstrap, DisaggregationMode, make_manager
from tests.sglang.support import counting_store, room_command_counts

ROOM = 4242


# -- the mapping


@pytest.fixture
def store(sync_backend: RedisUnderTest) -> StatusStore:
    return sync_backend.store(participant="prefill-tp0-pp0", policy="strict")


def test_mapping_reads_like_the_dict(store: StatusStore) -> None:
    m = RoomStatusMap(store)
    assert ROOM not in m and m.get(ROOM) is None and m.get(ROOM, KVPoll.Failed) == KVPoll.Failed
    with pytest.raises(KeyError):
        m[ROOM]
    m[ROOM] = KVPoll.Bootstrapping
    assert ROOM in m and m[ROOM] == KVPoll.Bootstrapping and m.get(ROOM) == 1
    assert store.get(ROOM) == KVPoll.Bootstrapping  # the map is a view of the store, not a copy


def test_item_assignment_applies_the_update_rule(store: StatusStore) -> None:
    m = RoomStatusMap(store)
    m[ROOM] = KVPoll.Transferring  # strict: a late non-opening status does not create the room
    assert ROOM not in m
    m[ROOM] = KVPoll.Failed  # a late abort on a missing room is ignored
    assert ROOM not in m
    m[ROOM] = KVPoll.Bootstrapping
    m[ROOM] = KVPoll.Transferring
    m[ROOM] = KVPoll.WaitingForInput  # never backwards
    assert m[ROOM] == KVPoll.Transferring
    m[ROOM] = KVPoll.Failed
    m[ROOM] = KVPoll.Success  # strict: Failed is terminal
    assert m[ROOM] == KVPoll.Failed
    assert m.update_status(ROOM, KVPoll.Success) == (Outcome.REFUSED_TERMINAL, KVPoll.Failed)


def test_pop_and_del(store: StatusStore) -> None:
    m = RoomStatusMap(store)
    assert m.pop(ROOM, None) is None
    with pytest.raises(KeyError):
        m.pop(ROOM)
    with pytest.raises(KeyError):
        del m[ROOM]
    m[ROOM] = KVPoll.WaitingForInput
    assert m.pop(ROOM, None) == KVPoll.WaitingForInput and ROOM not in m
    m[ROOM] = KVPoll.Bootstrapping
    store.record_failure(ROOM, "gone")
    del m[ROOM]
    assert not store.room(ROOM).exists  # the failure reason went with the entry
    m[ROOM] = KVPoll.Bootstrapping
    assert m.clear_room(ROOM) is True and m.clear_room(ROOM) is False


def test_len_and_iteration_refuse_instead_of_scanning(store: StatusStore) -> None:
    m = RoomStatusMap(store)
    m[ROOM] = KVPoll.Bootstrapping
    for attempt in (len, iter, list):
        with pytest.raises(TypeError, match="would SCAN"):
            attempt(m)
    assert bool(m) is True  # like PPConsensusStore, which has no __len__ either


def test_participants_do_not_see_each_other(store: StatusStore) -> None:
    prefill = RoomStatusMap(store)
    decode = RoomStatusMap(store.for_participant("decode-tp0-pp0"))
    prefill[ROOM] = KVPoll.Bootstrapping
    decode[ROOM] = KVPoll.WaitingForInput
    prefill.pop(ROOM, None)
    assert ROOM not in prefill and decode[ROOM] == KVPoll.WaitingForInput
    assert set(store.room(ROOM).participants) == {"decode-tp0-pp0"}


@pytest.mark.parametrize("shared_fate", [False, True])
def test_collect_reads_every_pp_rank_in_rank_order(sync_backend: RedisUnderTest, shared_fate: bool) -> None:
    store = sync_backend.store(participant="prefill-tp0-pp0", policy="strict", shared_fate=shared_fate)
    names = [f"prefill-tp0-pp{r}" for r in range(4)]
    ranks = [RoomStatusMap(store.for_participant(n), pp_participants=names) for n in names]
    assert ranks[0].collect(ROOM) == [None] * 4
    for r, status in ((0, 3), (2, 4), (3, 0)):
        ranks[r].update_status(ROOM, KVPoll.Bootstrapping)
        ranks[r][ROOM] = status
    # Rank 3 failed: with shared fate, rank 0's open entry reads Failed as rank 0 reads it itself; Success stays.
    expected = [0, None, 4, 0] if shared_fate else [3, None, 4, 0]
    assert ranks[0].collect(ROOM) == expected
    assert ranks[1].collect(ROOM) == expected  # any rank may ask (upstream: rank 0 only)
    assert ranks[0].collect_many([ROOM, 7, ROOM]) == {ROOM: expected, 7: [None] * 4}
    assert (ROOM in ranks[0]) and ranks[0][ROOM] == expected[0] == ranks[0].store.get(ROOM)
    with pytest.raises(InvalidArgumentError, match="pp_participants"):
        RoomStatusMap(store).collect(ROOM)
    with pytest.raises(InvalidArgumentError, match="distinct"):
        RoomStatusMap(store, pp_participants=["a", "a"])


# -- round trips of the poll path


def test_without_the_near_cache_a_poll_is_two_reads_and_the_read_after_in_is_current() -> None:
    store = counting_store()
    m = RoomStatusMap(store)
    m[ROOM] = KVPoll.Bootstrapping
    m[ROOM] = KVPoll.Transferring
    client = store.client
    before = client.round_trips
    for _ in range(10):
        assert (m[ROOM] if ROOM in m else None) == KVPoll.Transferring
    assert client.round_trips - before == 20  # `in`, then check_status: a read each
    # Another thread's write between `in` and the read: the read answers it.
    assert ROOM in m
    other = threading.Thread(target=lambda: m.__setitem__(ROOM, KVPoll.Success))
    other.start()
    other.join()
    assert m[ROOM] == KVPoll.Success
    # Another thread's pop between `in` and the read: the read answers the removed status, no KeyError
    # (kvstatus.sglang.outage.Removals); `get` and a later `in` find no entry, as in a dict.
    assert ROOM in m
    other = threading.Thread(target=lambda: m.pop(ROOM))
    other.start()
    other.join()
    assert m[ROOM] == KVPoll.Success and m.get(ROOM) is None and ROOM not in m


def test_pp_rank0_consensus_poll_without_the_near_cache_is_two_round_trips() -> None:
    store = counting_store()
    names = [f"prefill-tp0-pp{r}" for r in range(4)]
    managers = [make_manager(pp_rank=r, pp_size=4) for r in range(4)]
    for manager in managers:
        install(manager, store)
    for manager in managers:
        manager.update_status(ROOM, KVPoll.Bootstrapping)
        manager.update_status(ROOM, KVPoll.Transferring)
    assert managers[0].request_status.pp_participants == tuple(names)
    sender = CommonKVSender(managers[0], ROOM)
    assert sender.poll_pp_consensus() == KVPoll.Transferring  # the first poll loads the read script (NOSCRIPT)
    before = store.client.round_trips
    assert sender.poll_pp_consensus() == KVPoll.Transferring
    assert store.client.round_trips - before == 2  # `in`, then collect() reads every rank at once


# -- install() on the stand-in manager


def test_participant_names_from_role_and_ranks() -> None:
    assert participant_name(make_manager(tp_rank=3, pp_rank=1, pp_size=2)) == "prefill-tp3-pp1"
    decode = make_manager(mode=DisaggregationMode.DECODE, tp_rank=1)
    assert participant_name(decode) == "decode-tp1-pp0"
    assert participant_name(decode, instance="node7") == "decode-node7-tp1-pp0"
    decode.attn_dp_size, decode.attn_dp_rank = 4, 2
    decode.system_dp_size, decode.system_dp_rank = 2, 1
    assert participant_name(decode) == "decode-dp1-adp2-tp1-pp0"
    assert pp_participants(make_manager(pp_rank=2, pp_size=3), "x-pp2") == ["x-pp0", "x-pp1", "x-pp2"]
    assert pp_participants(make_manager(mode=DisaggregationMode.DECODE, pp_size=3), "x-pp0") is None
    with pytest.raises(InvalidArgumentError, match="must end with '-pp2'"):
        pp_participants(make_manager(pp_rank=2, pp_size=3), "prefill-a")


def test_install_replaces_the_status_methods_and_uninstall_restores_them() -> None:
    store = counting_store()
    manager = make_manager(tp_rank=1)
    status_map = install(manager, store)
    assert is_installed(manager) and manager.request_status is status_map
    assert status_map.participant == "prefill-tp1-pp0"
    assert set(vars(manager)) >= {"update_status", "check_status", "check_status_pp_consensus"}
    assert manager.update_status(ROOM, KVPoll.Bootstrapping).outcome is Outcome.CREATED
    assert store.for_participant("prefill-tp1-pp0").check_status(ROOM) == KVPoll.Bootstrapping
    with pytest.raises(InvalidArgumentError, match="already"):
        install(manager, store)
    uninstall(manager)
    assert manager.request_status == {} and "update_status" not in vars(manager)
    manager.update_status(ROOM, KVPoll.Bootstrapping)
    assert manager.request_status == {ROOM: KVPoll.Bootstrapping}


def test_install_keeps_a_subclass_override_of_check_status() -> None:
    manager = make_manager(standin.NixlKVManager)
    install(manager, counting_store())
    assert "check_status" not in vars(manager) and "update_status" in vars(manager)
    assert manager.check_status(ROOM) == KVPoll.WaitingForInput  # nixl's default for an unknown room


def test_install_refuses_what_would_change_behaviour() -> None:
    seed_store = counting_store(policy="seed")
    with pytest.raises(InvalidArgumentError, match="policy is 'seed'"):
        install(make_manager(), seed_store)
    install(make_manager(), seed_store, policy="seed")
    busy = make_manager()
    busy.request_status[1] = KVPoll.Bootstrapping
    with pytest.raises(InvalidArgumentError, match="1 room"):
        install(busy, counting_store())
    with pytest.raises(InvalidArgumentError, match="namespace="):
        install(make_manager(), "redis://127.0.0.1:1/0")
    with pytest.raises(InvalidArgumentError, match="apply to a URL"):
        install(make_manager(), counting_store(), namespace="x")
    for near_cache in (True, False):  # a store brings its own cache: an explicit setting is refused either way
        with pytest.raises(InvalidArgumentError, match="apply to a URL"):
            install(make_manager(), counting_store(), near_cache=near_cache)
    # The near cache is install()'s argument alone: a URL naming it is refused before anything is connected.
    with pytest.raises(InvalidArgumentError, match=r"'near_cache' is a store setting, not a connection option"):
        install(make_manager(), "redis://127.0.0.1:1/0?near_cache=false", namespace="x", near_cache=True)


def test_side_effects_follow_the_outcome() -> None:
    manager = make_manager()
    manager.deferred_bootstrap = DeferredBootstrap()
    install(manager, counting_store())
    manager._deferred_ack_targets[ROOM] = ["old"]
    manager._deferred_ack_poisoned_rooms.add(ROOM)
    manager._staging_outstanding[ROOM] = 2
    manager.update_status(ROOM, KVPoll.Transferring)  # REFUSED_CREATE: the old request's state stays
    assert ROOM in manager._deferred_ack_targets
    manager.update_status(ROOM, KVPoll.Bootstrapping)  # CREATED: dropped, as upstream
    assert (
        ROOM in manager._deferred_ack_targets,
        ROOM in manager._deferred_ack_poisoned_rooms,
        ROOM in manager._staging_outstanding,
    ) == (False, False, False)
    manager.deferred_bootstrap.register(ROOM, ("10.0.0.2", 9))
    manager.update_status(ROOM, KVPoll.Failed)  # FAILED: the deferred bootstrap hears of it
    assert manager.sent_messages == [
        {
            "targets": [("10.0.0.2", 9)],
            "bootstrap_room": ROOM,
            "status": KVPoll.Failed,
            "failure_reason": "Prefill bootstrap failed",
        }
    ]
    manager.update_status(ROOM, KVPoll.Failed)  # UNCHANGED on Failed: upstream still calls fail()
    assert manager.deferred_bootstrap.failed == [ROOM, ROOM]
    manager.request_status.pop(ROOM, None)
    manager.update_status(ROOM, KVPoll.Failed)  # IGNORED_MISSING: nothing to notify
    assert manager.deferred_bootstrap.failed == [ROOM, ROOM]


def test_the_stand_in_sender_polls_through_the_map() -> None:
    manager = make_manager()
    install(manager, counting_store())
    sender = CommonKVSender(manager, ROOM)
    assert sender.poll() == KVPoll.Failed  # absent: Failed, as upstream
    sender = CommonKVSender(manager, ROOM)
    manager.update_status(ROOM, KVPoll.Bootstrapping)
    assert sender.poll() == KVPoll.Bootstrapping
    manager.update_status(ROOM, KVPoll.Success)
    assert sender.poll() == KVPoll.Success
    sender.clear()
    assert ROOM not in manager.request_status and sender.conclude_state == KVPoll.Success


# -- the differential: installed stand-in against the stand-in on its dict


def _groups(pp_size: int, store: StatusStore) -> tuple[list, list, DeferredBootstrap, DeferredBootstrap]:
    upstream_pp = standin.PPGroupStore(pp_size) if pp_size > 1 else None
    upstream = [
        make_manager(pp_rank=r, pp_size=pp_size, request_status=upstream_pp.rank(r) if upstream_pp else None)
        for r in range(pp_size)
    ]
    ours = [make_manager(pp_rank=r, pp_size=pp_size) for r in range(pp_size)]
    left, right = DeferredBootstrap(), DeferredBootstrap()
    for manager in upstream:
        manager.deferred_bootstrap = left
    for manager in ours:
        manager.deferred_bootstrap = right
        install(manager, store)
    return upstream, ours, left, right


@pytest.mark.parametrize("pp_size", [1, 4])
@pytest.mark.parametrize("seed", range(4))
def test_installed_stand_in_agrees_with_the_upstream_rule(seed: int, pp_size: int) -> None:
    """One participant: shared fate on (the default) changes nothing it reads. PP ranks are several participants
    of each room, and there shared fate is the point (a rank's failure fails the others' open entries, which
    upstream's per-rank dicts do not show: see test_fate.py), so their per-entry rule is compared with it off."""
    store = StatusStore(
        fakeredis.FakeRedis(server=fakeredis.FakeServer()),
        namespace=fresh_namespace("sg"),
        policy="strict",
        shared_fate=pp_size == 1,
    )
    upstream, ours, left, right = _groups(pp_size, store)
    ops = differential.random_ops(seed, 400, pp_size=pp_size)
    expected = differential.run(upstream, ops, left)
    got = differential.run(ours, ops, right)
    assert differential.divergences(ops, expected, got) == []
    assert {kind for kind, _, _ in expected} >= {"update", "clear", "poll", "abort"}
    assert any(state[-1] for _, _, state in expected)  # some deferred-bootstrap notification was exercised


def test_the_differential_catches_a_wrong_rule() -> None:
    """The harness has teeth: the seed policy (Failed -> Success allowed) diverges from upstream."""
    store = StatusStore(
        fakeredis.FakeRedis(server=fakeredis.FakeServer()), namespace=fresh_namespace("sg"), policy="seed"
    )
    upstream = [make_manager()]
    ours = [make_manager()]
    install(ours[0], store, policy="seed")
    ops = differential.random_ops(0, 400)
    assert differential.divergences(
        ops, differential.run(upstream, ops, DeferredBootstrap()), differential.run(ours, ops, DeferredBootstrap())
    )


# -- the plugin's switch


def test_the_plugin_does_nothing_without_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_URL, raising=False)
    register()  # must neither import sglang nor fail
    assert "sglang" not in sys.modules or "sglang.srt.plugins.hook_registry" in sys.modules


def test_plugin_settings_are_checked() -> None:
    env = {ENV_URL: "redis://h:1/0", "KVSTATUS_SGLANG_TTL": "30", "KVSTATUS_SGLANG_INSTANCE": "node7"}
    assert install_options(env) == {
        "store_or_url": "redis://h:1/0",
        "namespace": "sglang",
        "instance": "node7",
        "ttl": 30.0,
    }  # nothing unset is passed: install() and the store hold each default
    for bad, needle in (
        ({"KVSTATUS_SGLANG_TTL": "soon"}, "KVSTATUS_SGLANG_TTL"),
        ({"KVSTATUS_SGLANG_NEAR_CACHE": "maybe"}, "KVSTATUS_SGLANG_NEAR_CACHE"),
    ):
        with pytest.raises(InvalidArgumentError, match=needle):
            install_options({ENV_URL: "redis://h:1/0", **bad})
    with pytest.raises(InvalidArgumentError, match=ENV_URL):
        install_options({})


def test_a_variable_the_plugin_does_not_read_stops_the_start() -> None:
    """A misspelt variable (LEASE_TT for LEASE_TTL) would leave its setting at the default without a word."""
    env = {ENV_URL: "redis://h:1/0", "KVSTATUS_SGLANG_LEASE_TT": "30", "KVSTATUS_SGLANG_TTL": "60"}
    with pytest.raises(SettingError) as info:
        install_options(env)
    message = str(info.value)
    assert message.startswith("KVSTATUS_SGLANG_LEASE_TT: no such variable; the plugin reads KVSTATUS_SGLANG_URL, ")
    assert all(variable in message for variable in KNOWN_VARIABLES) and info.value.setting == "KVSTATUS_SGLANG_LEASE_TT"
    manager = make_manager()
    with pytest.raises(SettingError, match="KVSTATUS_SGLANG_LEASE_TT"):
        install_from_env(manager, env)
    assert isinstance(manager.request_status, dict)  # left as upstream built it
    assert install_options({ENV_URL: "redis://h:1/0", "KVSTATUS_URL": "x", "SGLANG_X": "y"})  # other prefixes: not ours


@pytest.mark.real
def test_install_from_env_on_a_real_redis(redis_server) -> None:
    namespace = fresh_namespace("sg")
    env = {ENV_URL: redis_server.url, "KVSTATUS_SGLANG_NAMESPACE": namespace, "KVSTATUS_SGLANG_TTL": "30"}
    manager = make_manager(mode=DisaggregationMode.DECODE, tp_rank=2)
    status_map = install_from_env(manager, env)
    manager.update_status(ROOM, KVPoll.WaitingForInput)
    view = StatusStore.from_url(redis_server.url, namespace=namespace).room(ROOM)
    assert view.participants["decode-tp2-pp0"].status == KVPoll.WaitingForInput and 0 < view.ttl_ms <= 30_000
    assert status_map.store.policy.value == "strict"
    status_map.close()


@pytest.mark.real
def test_pp_consensus_reads_are_cached_too(redis_server) -> None:
    """Rank 0's consensus poll (``in`` + ``collect``) and ``collect_many`` read cached rooms: no round trip."""
    namespace = fresh_namespace("sg")
    managers = [make_manager(pp_rank=rank, pp_size=2) for rank in range(2)]
    maps = [install(m, redis_server.url, namespace=namespace, near_cache=True) for m in managers]
    rooms = [ROOM, ROOM + 1]
    for manager in managers:
        for room in rooms:
            manager.update_status(room, KVPoll.Bootstrapping)
    rank0 = managers[0]
    assert [rank0.check_status_pp_consensus(room) for room in rooms] == [KVPoll.Bootstrapping] * 2  # warms
    assert maps[0].collect_many(rooms) == {room: [KVPoll.Bootstrapping] * 2 for room in rooms}
    raw = redis.Redis(host=redis_server.host, port=redis_server.port)

    def consensus_polls() -> None:
        for _ in range(20):
            for room in rooms:
                assert room in rank0.request_status
                assert rank0.check_status_pp_consensus(room) == KVPoll.Bootstrapping
            assert maps[0].collect_many(rooms)[ROOM] == [KVPoll.Bootstrapping] * 2

    base = maps[0].store.prefix + ":" + namespace + ":"
    assert room_command_counts(raw, base, consensus_polls) == {}
    # Rank 1 advances: rank 0's cached room is invalidated, and its consensus follows.
    for room in rooms:
        managers[1].update_status(room, KVPoll.WaitingForInput)
        managers[0].update_status(room, KVPoll.WaitingForInput)
    eventually(
        lambda: rank0.check_status_pp_consensus(ROOM) == KVPoll.WaitingForInput,
        what="rank 1's write, through rank 0's near cache",
    )
    assert maps[0].collect_many(rooms) == {room: [KVPoll.WaitingForInput] * 2 for room in rooms}
    for status_map in maps:
        status_map.close()


@pytest.mark.real
def test_install_on_a_cached_store_keeps_its_cache(redis_server) -> None:
    namespace = fresh_namespace("sg")
    store = StatusStore.from_url(redis_server.url, namespace=namespace, policy="strict", near_cache=True)
    status_map = install(make_manager(), store)
    assert status_map.store.participant == "prefill-tp0-pp0" and status_map.store.near_cache is store.near_cache
    store.close()
