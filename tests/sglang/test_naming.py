"""Issue 33 item 1: every SGLang server gets its own participant name on the defaults, so two servers of one
role never look like a restart of each other (which failed the first one's rooms as "superseded")."""

from __future__ import annotations

import os
import socket
import types
from typing import Any

import pytest

from kvstatus import KVPoll
from kvstatus.sglang.manager import participant_name
from kvstatus.sglang.plugin import ENV_INSTANCE, ENV_LEASE_TTL, ENV_NAMESPACE, ENV_URL, install_from_env
from kvstatus.sglang.startup import SettingError
from tests.helpers.backends import fresh_namespace
from tests.sglang.standin import DisaggregationMode, make_manager

PREFILL, DECODE = DisaggregationMode.PREFILL, DisaggregationMode.DECODE


def server(mode: DisaggregationMode, host: str, port: int, tp_rank: int = 0, local_ip: str = "10.0.0.9") -> Any:
    """A stand-in manager with what sglang 0.5.23's carries: a prefill's bootstrap address, a decode's
    server_args, and the node's IP."""
    manager = make_manager(mode=mode, tp_rank=tp_rank)
    manager.local_ip = local_ip
    if mode is PREFILL:
        manager.bootstrap_host, manager.bootstrap_port = host, port
    else:
        manager.server_args = types.SimpleNamespace(host=host, port=port)
    return manager


@pytest.mark.parametrize(
    "manager, name",
    [
        (lambda: server(PREFILL, "10.0.0.7", 8998), "prefill-10.0.0.7-8998-tp0-pp0"),
        (lambda: server(PREFILL, "10.0.0.7", 8999, tp_rank=3), "prefill-10.0.0.7-8999-tp3-pp0"),
        (lambda: server(DECODE, "10.0.0.8", 30000), "decode-10.0.0.8-30000-tp0-pp0"),
        (lambda: server(PREFILL, "0.0.0.0", 8998), "prefill-10.0.0.9-8998-tp0-pp0"),  # bound to every interface
        (lambda: server(DECODE, "::", 30000, local_ip="fd00::7"), "decode-fd00..7-30000-tp0-pp0"),
        (lambda: server(DECODE, "node-3.example", 30000), "decode-node-3.example-30000-tp0-pp0"),
        (lambda: make_manager(), "prefill-tp0-pp0"),  # no address: not an sglang manager, no server part
    ],
)
def test_a_name_carries_the_servers_address(manager: Any, name: str) -> None:
    assert participant_name(manager()) == name


def test_the_instance_setting_overrides_the_address() -> None:
    assert participant_name(server(PREFILL, "10.0.0.7", 8998), "blue") == "prefill-blue-tp0-pp0"


def test_two_servers_of_one_role_never_share_a_name() -> None:
    names = {
        participant_name(server(mode, "10.0.0.7", port, tp_rank=rank))
        for mode in (PREFILL, DECODE)
        for port in (8998, 8999)
        for rank in (0, 1)
    }
    assert len(names) == 8


@pytest.mark.real
def test_two_prefills_and_two_decodes_on_the_defaults_fail_none_of_each_others_rooms(redis_server: Any) -> None:
    """The plugin's settings alone (no instance): each server writes its rooms, every watch looks, and no room of
    any server is failed by another's start (the second prefill used to fail the first one's as superseded)."""
    env = {ENV_URL: redis_server.url, ENV_NAMESPACE: fresh_namespace("sgn"), ENV_LEASE_TTL: "10"}
    managers = [
        server(PREFILL, "127.0.0.1", 8998),
        server(PREFILL, "127.0.0.1", 8999),
        server(DECODE, "127.0.0.1", 30000),
        server(DECODE, "127.0.0.1", 30001),
    ]
    maps = []
    try:
        for i, manager in enumerate(managers):
            maps.append(install_from_env(manager, env))
            manager.update_status(100 + i, KVPoll.Bootstrapping)  # its own room, open before the next one starts
        assert len({m.store.participant for m in maps}) == 4
        for status_map in maps:
            status_map.store.look_at_peers()
        for status_map in maps:
            status_map.store.look_at_peers()  # every mark read twice: a restart would show now
        for i, manager in enumerate(managers):
            assert manager.check_status(100 + i) == KVPoll.Bootstrapping
            assert maps[i].store.failure(100 + i) is None
    finally:
        for status_map in maps:
            status_map.close()


@pytest.mark.real
def test_a_live_twin_is_refused_naming_the_variable_and_both_processes(redis_server: Any) -> None:
    """Two servers given the same instance: the second one's start is refused while the first one lives; once the
    first one is gone without a release (its presence dropped, as a SIGKILL does), a restart takes the name over."""
    env = {
        ENV_URL: redis_server.url,
        ENV_NAMESPACE: fresh_namespace("sgtwin"),
        ENV_LEASE_TTL: "10",
        ENV_INSTANCE: "blue",
    }
    first = install_from_env(server(PREFILL, "127.0.0.1", 8998), env)
    try:
        first.store.update_status(100, KVPoll.Bootstrapping)
        with pytest.raises(SettingError) as info:
            install_from_env(server(PREFILL, "127.0.0.1", 8999), env)
        message = str(info.value)
        assert info.value.setting == "instance" and message.startswith("KVSTATUS_SGLANG_INSTANCE=blue: ")
        this = f"{socket.gethostname()}:{os.getpid()}"
        assert f"held by a live process, {this} " in message and f"this process, {this}, will not" in message
        assert first.store.lease.held and first.store.get(100) is KVPoll.Bootstrapping  # the twin changed nothing
        keeper = first.store._keeper
        keeper._background.stop()  # what a SIGKILL leaves: no renewals, and Redis drops its presence
        keeper.presence.drop()
        again = install_from_env(server(PREFILL, "127.0.0.1", 8999), env)
        assert again.store.lease.generation == first.store.lease.generation + 1
        again.close()
    finally:
        first.close()


@pytest.mark.real
def test_a_role_switch_releases_the_lease_and_the_presence_and_fails_nothing(redis_server: Any) -> None:
    """sglang 0.5.23's runtime role switch (disaggregation/role_switch.py) calls the manager's teardown() and builds
    a manager of the other role: the torn-down one's lease is released and its presence gone, its peers fail
    nothing, and the new manager starts under its own name."""
    env = {ENV_URL: redis_server.url, ENV_NAMESPACE: fresh_namespace("sgswitch"), ENV_LEASE_TTL: "10"}
    decode = server(DECODE, "127.0.0.1", 30000)
    decode_map = install_from_env(decode, env)
    switching = server(PREFILL, "127.0.0.1", 8998)
    torn_down: list[str] = []
    switching.teardown = lambda: torn_down.append("upstream")  # mooncake's: stops its threads, closes sockets
    prefill_map = install_from_env(switching, env)
    try:
        switching.update_status(100, KVPoll.Bootstrapping)
        switching.update_status(100, KVPoll.Success)
        switching.request_status.pop(100)  # served: the engine removed the room before the switch
        decode.update_status(100, KVPoll.Bootstrapping)  # a decode room of another request, open meanwhile
        old = prefill_map.store
        switching.teardown()
        assert torn_down == ["upstream"] and old.lease.released
        channel = f"kvstatus:{env[ENV_NAMESPACE]}:presence:{{{env[ENV_NAMESPACE]}}}:{old.participant}"
        with redis_server.client() as admin:
            assert admin.pubsub_numsub(channel) == [(channel.encode(), 0)]
        rebuilt = server(DECODE, "127.0.0.1", 8998)  # the same server, now a decode
        rebuilt_map = install_from_env(rebuilt, env)
        assert rebuilt_map.store.participant == "decode-127.0.0.1-8998-tp0-pp0" != old.participant
        decode_map.store.look_at_peers()
        assert decode.check_status(100) == KVPoll.Bootstrapping and decode_map.store.failure(100) is None
        rebuilt_map.close()
    finally:
        decode_map.close()
        prefill_map.close()


@pytest.mark.real
def test_a_room_id_reused_after_success_and_clear_serves_a_second_lifecycle(redis_server: Any) -> None:
    """sglang PR#39357: a retracted request comes back under its room id. After Success and the engine's clear,
    the id opens again on both sides, the strict rule creates it afresh, and nothing of the first lifecycle shows."""
    env = {ENV_URL: redis_server.url, ENV_NAMESPACE: fresh_namespace("sgreuse"), ENV_LEASE_TTL: "10"}
    prefill, decode = server(PREFILL, "127.0.0.1", 8998), server(DECODE, "127.0.0.1", 30000)
    maps = [install_from_env(prefill, env), install_from_env(decode, env)]
    try:
        for lifecycle in range(2):
            for manager in (prefill, decode):
                manager.update_status(7, KVPoll.Bootstrapping)
            assert prefill.check_status(7) == decode.check_status(7) == KVPoll.Bootstrapping, lifecycle
            for manager in (prefill, decode):
                manager.update_status(7, KVPoll.Transferring)
                manager.update_status(7, KVPoll.Success)
            assert prefill.check_status(7) == decode.check_status(7) == KVPoll.Success
            for manager in (prefill, decode):
                manager.request_status.pop(7)
                manager.update_status(7, KVPoll.Failed)  # a late abort of the finished lifecycle: ignored
            assert 7 not in prefill.request_status and 7 not in decode.request_status
            assert maps[0].store.failure(7) is None
    finally:
        for status_map in maps:
            status_map.close()
