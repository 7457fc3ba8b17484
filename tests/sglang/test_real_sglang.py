"""kvstatus.sglang against the real sglang 0.5.23 classes (``./dev test-sglang``; skipped without sglang).

Managers are built with ``object.__new__`` plus the attributes the status
methods use: the real ``__init__`` needs the server-args context, a
bootstrap server and a transfer engine.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import subprocess
import sys
import textwrap
import threading
import time
import types
from collections import defaultdict
from pathlib import Path
from typing import Any, Optional

import pytest
import redis

from kvstatus import KVPoll, Outcome, StatusStore
from kvstatus.admin.reads import iter_rooms
from kvstatus.keys import KeySchema
from kvstatus.sglang import install, participant_name
from tests.helpers.backends import fresh_namespace
from tests.sglang import differential, standin

pytestmark = [pytest.mark.sglang, pytest.mark.real]
ROOT = Path(__file__).resolve().parents[2]
PP = 4


def real_manager(
    sg: Any,
    *,
    mode: Any = None,
    tp_rank: int = 0,
    pp_rank: int = 0,
    pp_size: int = 1,
    request_status: Any = None,
    deferred: Any = None,
) -> Any:
    """A real CommonKVManager without __init__: the attributes update/check_status and the sender's poll use."""
    m = object.__new__(sg.Manager)
    m.request_status = {} if request_status is None else request_status
    m._deferred_ack_targets = {}
    m._deferred_ack_poisoned_rooms = set()
    m._staging_outstanding = defaultdict(int)
    m.disaggregation_mode = sg.Mode.PREFILL if mode is None else mode
    m.kv_args = types.SimpleNamespace(engine_rank=tp_rank)
    m.pp_rank, m.pp_size = pp_rank, pp_size
    m.attn_tp_rank, m.attn_tp_size = tp_rank, 1
    m.attn_cp_rank, m.attn_cp_size = 0, 1
    m.attn_dp_rank, m.attn_dp_size = 0, 1
    m.system_dp_rank, m.system_dp_size = 0, 1
    m.bootstrap_timeout = 300
    m.req_to_decode_prefix_len, m.transfer_infos = {}, {}  # popped by the sender's clear()
    m.sent_messages = []
    m.send_kv_status_message = lambda **message: m.sent_messages.append(message)  # no peer to send to
    if deferred is not None:
        m.deferred_bootstrap = deferred
    return m


def real_sender(sg: Any, manager: Any, room: int) -> Any:
    from sglang.srt.observability.trace import TraceNullContext

    s = object.__new__(sg.Sender)
    s.kv_mgr, s.bootstrap_room, s.conclude_state = manager, room, None
    s.init_time, s._prefill_complete_time, s._transfer_start_time = time.time(), None, None
    s.trace_ctx = TraceNullContext()
    return s


def offline_pp_stores(sg: Any, pp_size: int) -> list[Any]:
    """Real PPConsensusStore objects without ZMQ; :func:`mirror` plays the replication to rank 0."""
    stores = []
    for rank in range(pp_size):
        st = object.__new__(sg.PPConsensusStore)
        st._pp_size, st._pp_rank = pp_size, rank
        st._local_map, st._peer_map = {}, {}
        st._cache_lock = threading.Lock()
        st._replication_queue = __import__("queue").Queue() if rank else None
        stores.append(st)
    return stores


class MirroredGroup(list):
    """Managers on offline PPConsensusStores whose rank-0 peer map is refreshed before every operation."""

    def __init__(self, managers: list[Any], stores: list[Any]) -> None:
        super().__init__(managers)
        self.stores = stores

    def __getitem__(self, rank: Any) -> Any:
        if len(self.stores) < 2:
            return super().__getitem__(rank)
        with self.stores[0]._cache_lock:
            self.stores[0]._peer_map = {r: dict(s._local_map) for r, s in enumerate(self.stores) if r}
        return super().__getitem__(rank)


@pytest.fixture
def store(redis_server: Any) -> StatusStore:
    return StatusStore.from_url(redis_server.url, namespace=fresh_namespace("sgr"), policy="strict")


# -- the stand-in of the default suite is faithful


@pytest.mark.parametrize("pp_size", [1, PP])
def test_the_stand_in_behaves_like_the_real_manager(sg: Any, pp_size: int) -> None:
    assert sg.KVPoll.Failed == 0 and sg.KVPoll.Success == 4 and not isinstance(sg.KVPoll.Success, KVPoll)
    for seed in range(3):
        ops = differential.random_ops(100 + seed, 500, pp_size=pp_size)
        fake_pp = standin.PPGroupStore(pp_size)
        ours = [
            standin.make_manager(pp_rank=r, pp_size=pp_size, request_status=fake_pp.rank(r) if pp_size > 1 else None)
            for r in range(pp_size)
        ]
        left, right = standin.DeferredBootstrap(), standin.DeferredBootstrap()
        for m in ours:
            m.deferred_bootstrap = left
        stores = offline_pp_stores(sg, pp_size) if pp_size > 1 else [None]
        real = MirroredGroup(
            [
                real_manager(sg, pp_rank=r, pp_size=pp_size, request_status=stores[r], deferred=right)
                for r in range(pp_size)
            ],
            stores,
        )
        assert (
            differential.divergences(ops, differential.run(ours, ops, left), differential.run(real, ops, right)) == []
        )
    # The methods the stand-in copies are the ones the real class defines (same names, same owner).
    for name in ("update_status", "check_status", "check_status_pp_consensus", "_notify_bootstrap"):
        assert name in vars(sg.Manager) and name in vars(standin.CommonKVManager)


# -- the differential: installed real manager against the real manager on its dict


@pytest.mark.parametrize("pp_size", [1, PP])
def test_installed_real_manager_agrees_with_upstream(sg: Any, store: StatusStore, pp_size: int) -> None:
    """One participant with shared fate on (the store's default). PP ranks are several participants of each
    room, where shared fate deliberately differs from upstream's per-rank dicts: the rule is compared without it."""
    assert store.shared_fate
    if pp_size > 1:
        store = StatusStore(store.client, namespace=store.namespace, policy="strict", shared_fate=False)
    total = 0
    for seed in range(5):
        ops = differential.random_ops(seed, 600, pp_size=pp_size)
        left, right = sg.DeferredBootstrap(300), sg.DeferredBootstrap(300)
        stores = offline_pp_stores(sg, pp_size) if pp_size > 1 else [None]
        upstream = MirroredGroup(
            [
                real_manager(sg, pp_rank=r, pp_size=pp_size, request_status=stores[r], deferred=left)
                for r in range(pp_size)
            ],
            stores,
        )
        ours = [real_manager(sg, pp_rank=r, pp_size=pp_size, deferred=right) for r in range(pp_size)]
        for m in ours:  # a fresh set of participants per seed
            install(m, store, participant=f"s{seed}-prefill-tp0-pp{m.pp_rank}")
        expected = differential.run(upstream, ops, left)
        got = differential.run(ours, ops, right)
        assert differential.divergences(ops, expected, got) == []
        assert any(state[-1] for _, _, state in expected)  # real deferred-bootstrap notifications happened
        total += len(ops)
    assert total == 3000


def test_install_replaces_the_real_methods_and_keeps_nixl_override(sg: Any, store: StatusStore) -> None:
    m = real_manager(sg)
    install(m, store)
    assert {"update_status", "check_status", "check_status_pp_consensus"} <= set(vars(m))
    from sglang.srt.disaggregation.nixl.conn import NixlKVManager

    nixl = object.__new__(NixlKVManager)
    vars(nixl).update({k: v for k, v in vars(real_manager(sg)).items()})
    install(nixl, store, participant="nixl-tp0-pp0")
    assert "check_status" not in vars(nixl)
    assert nixl.check_status(99) == sg.KVPoll.WaitingForInput


# -- two managers, a prefill and a decode, on one real Redis


def test_prefill_and_decode_share_one_redis(sg: Any, redis_server: Any) -> None:
    namespace = fresh_namespace("sgpd")
    prefill = real_manager(sg, mode=sg.Mode.PREFILL, tp_rank=1)
    decode = real_manager(sg, mode=sg.Mode.DECODE, tp_rank=1)
    install(prefill, redis_server.url, namespace=namespace)
    install(decode, redis_server.url, namespace=namespace)
    standin.OPENED.extend((prefill, decode))  # from a URL each holds a lease: closed after the test
    assert (participant_name(prefill), participant_name(decode)) == ("prefill-tp1-pp0", "decode-tp1-pp0")
    room = 77
    sender = real_sender(sg, prefill, room)
    prefill.update_status(room, sg.KVPoll.Bootstrapping)
    decode.update_status(room, sg.KVPoll.WaitingForInput)
    assert sender.poll() == sg.KVPoll.Bootstrapping
    for status in (sg.KVPoll.WaitingForInput, sg.KVPoll.Transferring, sg.KVPoll.Success):
        prefill.update_status(room, status)
    decode.update_status(room, sg.KVPoll.Success)
    assert sender.poll() == sg.KVPoll.Success and sender.conclude_state == sg.KVPoll.Success
    view = StatusStore.from_url(redis_server.url, namespace=namespace).room(room)
    assert {n: e.status for n, e in view.participants.items()} == {"prefill-tp1-pp0": 4, "decode-tp1-pp0": 4}
    sender.clear()  # the real sender's clear(): get, then pop(room, None)
    assert room not in prefill.request_status and decode.check_status(room) == sg.KVPoll.Success
    prefill.update_status(room, sg.KVPoll.Failed)  # a late abort after clear: not resurrected
    assert room not in prefill.request_status
    decode.request_status.pop(room, None)
    assert not StatusStore.from_url(redis_server.url, namespace=namespace).room(room).exists


# -- one room, one fate: the real failure_exception names the room's first failure


def test_real_failure_exception_names_the_peer_and_the_canceller(sg: Any, redis_server: Any) -> None:
    namespace = fresh_namespace("sgfate")
    prefill = real_manager(sg, mode=sg.Mode.PREFILL)
    decode = real_manager(sg, mode=sg.Mode.DECODE)
    for m in (prefill, decode):
        m.failure_records, m.failure_lock = {}, threading.Lock()  # set by the real __init__
        install(m, redis_server.url, namespace=namespace)
        standin.OPENED.append(m)
    router = StatusStore.from_url(redis_server.url, namespace=namespace, participant="router-1")
    for room, fail in (
        (81, lambda room: (decode.record_failure(room, "KV receiver timed out"), decode.update_status(room, 0))),
        (82, lambda room: router.cancel(room, "client went away")),
    ):
        sender = real_sender(sg, prefill, room)
        decode.update_status(room, sg.KVPoll.WaitingForInput)
        for status in (sg.KVPoll.Bootstrapping, sg.KVPoll.Transferring):
            prefill.update_status(room, status)
        assert sender.poll() == sg.KVPoll.Transferring
        fail(room)
        assert sender.poll() == sg.KVPoll.Failed  # the real _poll_with_status: `in`, then check_status
        with pytest.raises(sg.conn.KVTransferError) as info:
            sender.failure_exception()  # the real one: clear(), then failure_records.pop(room)
        assert not info.value.is_from_another_rank
        expected = (
            "failed at waiting by decode-tp0-pp0: KV receiver timed out"
            if room == 81
            else ("cancelled by router-1: client went away")
        )
        assert info.value.failure_reason.startswith(expected + " (the room's first failure, at ")
        assert prefill.failure_records == {} and room not in prefill.request_status
    # Shared fate off (the store's option): the prefill's entry is read alone, as upstream's dict.
    alone = real_manager(sg, mode=sg.Mode.PREFILL, tp_rank=1)
    alone.failure_records, alone.failure_lock = {}, threading.Lock()
    install(alone, redis_server.url, namespace=namespace, shared_fate=False)
    standin.OPENED.append(alone)
    alone.update_status(83, sg.KVPoll.Bootstrapping)
    decode.update_status(83, sg.KVPoll.WaitingForInput)
    decode.update_status(83, sg.KVPoll.Failed)
    assert real_sender(sg, alone, 83).poll() == sg.KVPoll.Bootstrapping and alone.failure_records == {}


# -- the late-abort race across processes


def _race_owner(url: str, namespace: str, index: int, rooms: list[int], requests: int, out: Any) -> None:
    from sglang.srt.disaggregation.common.conn import CommonKVManager  # noqa: F401 (inherited from the parent)

    sg = _sg_namespace()
    m = real_manager(sg, tp_rank=index)
    install(m, url, namespace=namespace, lease_ttl=None)  # its aborter acts as the same manager: no lease
    stale = 0
    for n in range(requests):
        room = rooms[n % len(rooms)]
        if room in m.request_status:  # the new request's first poll must find nothing left behind
            stale += 1
        for status in (1, 2, 3, 4):
            m.update_status(room, status)
        sender = real_sender(sg, m, room)
        sender.poll()
        sender.clear()
    out.put(("owner", index, stale, 0))


def _race_aborter(url: str, namespace: str, index: int, rooms: list[int], aborts: int, out: Any) -> None:
    sg = _sg_namespace()
    m = real_manager(sg, tp_rank=index)
    install(m, url, namespace=namespace, participant=participant_name(m), lease_ttl=None)  # abort() of the same manager
    rng = random.Random(index)
    resurrected = 0
    for _ in range(aborts):
        result = m.update_status(rng.choice(rooms), 0)
        if result.outcome is Outcome.CREATED:
            resurrected += 1
        time.sleep(rng.random() * 0.0005)
    out.put(("aborter", index, 0, resurrected))


def _sg_namespace() -> Any:
    import sglang.srt.disaggregation.common.conn as conn
    from sglang.srt.disaggregation.utils import DisaggregationMode

    return types.SimpleNamespace(Manager=conn.CommonKVManager, Sender=conn.CommonKVSender, Mode=DisaggregationMode)


def test_late_abort_race_across_processes(sg: Any, redis_server: Any) -> None:
    namespace = fresh_namespace("sgrace")
    ctx = multiprocessing.get_context("fork")  # sglang is imported once, in the parent
    out = ctx.Queue()
    owners = 4
    procs = []
    for i in range(owners):
        rooms = [10_000 * (i + 1) + k for k in range(3)]
        procs.append(ctx.Process(target=_race_owner, args=(redis_server.url, namespace, i, rooms, 150, out)))
        procs.append(ctx.Process(target=_race_aborter, args=(redis_server.url, namespace, i, rooms, 400, out)))
    for p in procs:
        p.start()
    reports = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(10)
        assert p.exitcode == 0
    assert len(reports) == 2 * owners
    assert sum(r[2] for r in reports) == 0, "a new request found its room left over from an earlier one"
    assert sum(r[3] for r in reports) == 0, "an abort re-created a cleared room"
    raw = redis.Redis.from_url(redis_server.url)
    # every room cleared, nothing leaked (a clear's tombstone, {room}:t, and the fence it leaves in the room's key,
    # the writer's stamp, stay for their own short TTL)
    assert list(iter_rooms(raw, KeySchema(namespace))) == []


# -- PP consensus over 4 ranks: kvstatus against the real PPConsensusStore over ZMQ


class _BroadcastGroup:
    info: Optional[tuple[str, int]] = None

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        if obj is not None:
            _BroadcastGroup.info = obj
        return _BroadcastGroup.info


def zmq_pp_managers(sg: Any, pp_size: int) -> tuple[list[Any], list[Any]]:
    import sglang.srt.disaggregation.pp_consensus_store as pcs

    pcs.get_local_ip_auto = lambda *a, **k: "127.0.0.1"  # rank 0's PULL socket on loopback
    stores = [sg.PPConsensusStore(pp_size, r, _BroadcastGroup()) for r in range(pp_size)]  # rank 0 first
    return [real_manager(sg, pp_rank=r, pp_size=pp_size, request_status=stores[r]) for r in range(pp_size)], stores


def test_pp_consensus_over_four_ranks_matches_pp_consensus_store(sg: Any, redis_server: Any) -> None:
    namespace = fresh_namespace("sgpp")
    upstream, _ = zmq_pp_managers(sg, PP)
    ours = [real_manager(sg, pp_rank=r, pp_size=PP) for r in range(PP)]
    for m in ours:  # one connection per rank, as one process per rank would have
        install(m, redis_server.url, namespace=namespace)
    standin.OPENED.extend(ours)  # from a URL each holds a lease: closed after the test
    _agree_over_four_ranks(upstream, ours)


def _agree_over_four_ranks(upstream: list[Any], ours: list[Any]) -> None:
    assert ours[0].request_status.pp_participants == tuple(f"prefill-tp0-pp{r}" for r in range(PP))
    room = 1001
    steps = [
        [(r, 1) for r in range(PP)],
        [(r, 3) for r in range(PP)],
        [(0, 4), (1, 4), (2, 4)],
        [(3, 4)],
        [(2, 0)],
        [(1, "pop")],
        [(2, "pop"), (0, "pop"), (3, "pop")],
    ]
    seen = []
    for step in steps:
        for rank, what in step:
            for group in (upstream, ours):
                if what == "pop":
                    group[rank].request_status.pop(room, None)
                else:
                    group[rank].update_status(room, what)
        deadline = time.monotonic() + 2
        while True:  # replication to PPConsensusStore's rank 0 is asynchronous; Redis' is not
            expected = upstream[0].request_status.collect(room)
            if (
                expected == [int(s) if s is not None else None for s in ours[0].request_status.collect(room)]
                or time.monotonic() > deadline
            ):
                break
            time.sleep(0.01)
        got = ours[0].check_status_pp_consensus(room)
        assert got == upstream[0].check_status_pp_consensus(room)
        assert ours[0].request_status.collect(room) == expected
        seen.append(int(got))
    assert seen == [1, 3, 3, 4, 0, 1, 1]


# -- the process-wide switch: sglang's own plugin loader finds and applies the entry point


BOOTSTRAP_PORT = 8998
"""The bootstrap port of the children's managers (nothing listens on it: their address is only matched)."""


def plugin_child(mode: str, engine_rank: int, body: str) -> str:
    """A child process' script: a fake ``CommonKVManager.__init__`` (a ``mode`` manager of ``engine_rank``),
    sglang's own plugin loader, then ``body`` (dedented), which builds managers and uses them."""
    prelude = textwrap.dedent(f"""
        import json, sys, time
        from collections import defaultdict
        import sglang.srt.disaggregation.common.conn as conn
        from sglang.srt.disaggregation.utils import DisaggregationMode

        def fake_init(self, *args, **kwargs):  # stands in for the real __init__ (server args, bootstrap, engine)
            self.request_status = {{}}
            self._deferred_ack_targets, self._deferred_ack_poisoned_rooms = {{}}, set()
            self._staging_outstanding = defaultdict(int)
            self.disaggregation_mode = DisaggregationMode.{mode}
            self.kv_args = type("A", (), {{"engine_rank": {engine_rank}}})()
            self.pp_rank, self.pp_size = 0, 1
            self.bootstrap_host, self.bootstrap_port = "127.0.0.1", {BOOTSTRAP_PORT}  # the server's, as upstream's

        conn.CommonKVManager.__init__ = fake_init
        from sglang.srt.plugins import load_plugins
        load_plugins()
    """)
    return prelude + textwrap.dedent(body)


PLUGIN_CHILD = plugin_child(
    "DECODE",
    3,
    """
    from sglang.srt.disaggregation.mooncake.conn import MooncakeKVManager

    class Manager(MooncakeKVManager):  # a subclass reaches the hook through super().__init__
        def __init__(self):
            super(MooncakeKVManager, self).__init__()

    m = Manager()
    m.update_status(5, conn.KVPoll.Bootstrapping)
    print(json.dumps({"installed": type(m.request_status).__name__, "participant": m.request_status.participant}))
    """,
)


def test_the_plugin_puts_every_manager_of_a_process_on_kvstatus(sg: Any, redis_server: Any) -> None:
    namespace = fresh_namespace("sgplug")
    env = {**os.environ, "KVSTATUS_SGLANG_URL": redis_server.url, "KVSTATUS_SGLANG_NAMESPACE": namespace}
    env.pop("SGLANG_PLUGINS", None)
    result = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", PLUGIN_CHILD],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        cwd="/",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == '{"installed": "RoomStatusMap", "participant": "decode-tp3-pp0"}'
    view = StatusStore.from_url(redis_server.url, namespace=namespace).room(5)
    assert view.participants["decode-tp3-pp0"].status == KVPoll.Bootstrapping


def test_the_plugin_does_nothing_without_its_variable(sg: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry

    from kvstatus.sglang import plugin

    monkeypatch.delenv(plugin.ENV_URL, raising=False)
    before = dict(HookRegistry._hooks)
    plugin.register()
    assert plugin.HOOK_TARGET not in HookRegistry._hooks and dict(HookRegistry._hooks) == before


def test_a_room_reused_after_success_and_clear_and_a_teardown_on_the_real_class(sg: Any, redis_server: Any) -> None:
    """sglang 0.5.23's own CommonKVManager: a room id serves a second lifecycle after Success and the engine's
    pop (PR#39357), a late abort in between is ignored; its base ``teardown`` (no runtime role switch for this
    backend) still raises, and the manager's store stays open, its lease held."""
    manager = real_manager(sg)
    manager.bootstrap_host, manager.bootstrap_port, manager.local_ip = "127.0.0.1", 8998, "127.0.0.1"
    status_map = install(manager, redis_server.url, namespace=fresh_namespace("sgreal"), lease_ttl=10)
    try:
        assert status_map.store.participant == "prefill-127.0.0.1-8998-tp0-pp0"
        for lifecycle in range(2):
            manager.update_status(7, sg.KVPoll.Bootstrapping)
            assert manager.check_status(7) == sg.KVPoll.Bootstrapping, lifecycle
            manager.update_status(7, sg.KVPoll.Transferring)
            manager.update_status(7, sg.KVPoll.Success)
            assert manager.check_status(7) == sg.KVPoll.Success
            manager.request_status.pop(7)
            manager.update_status(7, sg.KVPoll.Failed)  # a late abort of the finished lifecycle
            assert 7 not in manager.request_status
        with pytest.raises(NotImplementedError):
            manager.teardown()
        assert status_map.store.lease.held
    finally:
        status_map.close()
