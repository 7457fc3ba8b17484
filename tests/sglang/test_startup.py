"""An SGLang operator's first start: a bad setting stops it with the variable named, a good one logs one line."""

from __future__ import annotations

import logging
import traceback
from typing import Any, Iterator

import fakeredis
import pytest
import redis

from kvstatus import KVPoll, StatusStore
from kvstatus.admin.acl import acl_rules
from kvstatus.admin.functions import load_functions
from kvstatus.errors import InvalidURLError
from kvstatus.sglang import install, plugin
from kvstatus.sglang.manager import DEFAULT_LEASE_TTL
from kvstatus.sglang.plugin import (
    ENV_INSTANCE,
    ENV_LEASE_TTL,
    ENV_NAMESPACE,
    ENV_NEAR_CACHE,
    ENV_POLICY,
    ENV_SCRIPTS,
    ENV_SHARED_FATE,
    ENV_TIMELINE,
    ENV_TTL,
    ENV_URL,
    install_from_env,
    install_options,
)
from kvstatus.sglang.startup import SettingError, check_manager, check_sglang_version, version_tuple
from tests.helpers.backends import fresh_namespace
from tests.servers import RedisServer, free_port
from tests.sglang.standin import DisaggregationMode, make_manager

SECRET = "Hunter2-sglang-Secr3t"
ADMIN = "admin-Secr3t-sgl"
GOOD_URL = "redis://127.0.0.1:1/0"


def _all_text(exc: BaseException) -> str:
    """Everything an operator may see of ``exc``: its message, its causes' and the formatted traceback."""
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))


# -- every setting error names its variable (no Redis)


@pytest.mark.parametrize(
    "variable, value, needle",
    [
        (ENV_URL, "http://h:1/0", "unsupported scheme"),
        (ENV_URL, f"redis://u:{SECRET}@h:1/0?bogus=1", "unknown option"),
        (ENV_URL, f"redis://u:{SECRET}@h:1/0?lease_ttl=10", "store setting, not a connection option"),
        (ENV_SCRIPTS, "lua", "expected one of eval, functions"),
        (ENV_NAMESPACE, "prod a", "namespace"),
        (ENV_NAMESPACE, "{x}", "namespace"),
        (ENV_INSTANCE, "node 7", "instance"),
        (ENV_POLICY, "lenient", "lenient"),
        (ENV_TTL, "soon", "number of seconds"),
        (ENV_TTL, "0", "> 0"),
        (ENV_TTL, "nan", "number of seconds"),
        (ENV_NEAR_CACHE, "maybe", "1 or 0"),
        (ENV_SHARED_FATE, "maybe", "1 or 0"),
        (ENV_SHARED_FATE, "2", "1 or 0"),
        (ENV_TIMELINE, "often", "1 or 0"),
        (ENV_LEASE_TTL, "2", r"0 \(no lease\) or seconds in \[3, 3600\]"),
        (ENV_LEASE_TTL, "-1", "no lease"),
        (ENV_LEASE_TTL, "4000", "no lease"),
        (ENV_LEASE_TTL, "inf", "no lease"),
        (ENV_LEASE_TTL, "ten", "number of seconds"),
    ],
)
def test_each_bad_setting_is_refused_naming_its_variable(variable: str, value: str, needle: str) -> None:
    env = {ENV_URL: f"redis://u:{SECRET}@h:1/0", variable: value}
    with pytest.raises(SettingError, match=needle) as info:
        install_options(env)
    assert str(info.value).startswith(f"{variable}: ")
    assert info.value.setting == next(k for k, v in plugin.SETTING_VARIABLES.items() if v == variable)
    assert SECRET not in _all_text(info.value)


def test_an_unset_url_is_named() -> None:
    with pytest.raises(SettingError, match=f"^{ENV_URL}: not set"):
        install_options({})


def test_lease_ttl_setting() -> None:
    base = {ENV_URL: GOOD_URL}
    assert "lease_ttl" not in install_options(base)  # install()'s default, DEFAULT_LEASE_TTL
    assert install_options({**base, ENV_LEASE_TTL: "0"})["lease_ttl"] is None  # off
    assert install_options({**base, ENV_LEASE_TTL: "10"})["lease_ttl"] == 10.0
    assert install_options({**base, ENV_LEASE_TTL: " 3.5 "})["lease_ttl"] == 3.5


@pytest.mark.parametrize("variable, option", [(ENV_SHARED_FATE, "shared_fate"), (ENV_NEAR_CACHE, "near_cache")])
def test_a_switch(variable: str, option: str) -> None:
    base = {ENV_URL: GOOD_URL}
    assert option not in install_options(base)  # unset: the default, on
    for value, expected in (
        ("1", True),
        ("true", True),
        (" YES ", True),
        ("0", False),
        ("false", False),
        ("no", False),
    ):
        assert install_options({**base, variable: value})[option] is expected
    with pytest.raises(SettingError, match=f"^{variable}: invalid value 'maybe': expected 1 or 0"):
        install_options({**base, variable: "maybe"})


def test_timelines_are_on_unless_the_variable_turns_them_off() -> None:
    """The store's default is off; install() turns it on (issue 20: what a deployment gets is the default)."""
    assert "timeline" not in install_options({ENV_URL: GOOD_URL})  # install()'s default, on
    assert install_options({ENV_URL: GOOD_URL, ENV_TIMELINE: "0"})["timeline"] is False
    assert install_options({ENV_URL: GOOD_URL, ENV_TIMELINE: "1"})["timeline"] is True


def test_scripts_setting() -> None:
    assert "scripts" not in install_options({ENV_URL: GOOD_URL})  # the store's default, eval
    assert install_options({ENV_URL: GOOD_URL, ENV_SCRIPTS: "functions"})["scripts"] == "functions"
    assert install_options({ENV_URL: GOOD_URL, ENV_SCRIPTS: " eval "})["scripts"] == "eval"


@pytest.mark.parametrize("option", ["scripts=functions", "lease_ttl=10", "near_cache=0", "shared_fate=0", "timeline=1"])
def test_a_store_setting_in_the_url_is_refused_naming_its_variable_and_argument(option: str) -> None:
    """The URL carries connection settings only: each store setting has one source, so none needs an agreement check."""
    name = option.partition("=")[0]
    with pytest.raises(SettingError, match=f"^{ENV_URL}: invalid Redis URL .*'{name}' is a store setting") as info:
        install_options({ENV_URL: f"redis://u:{SECRET}@h:1/0?{option}"})
    assert SECRET not in _all_text(info.value)
    assert f"the SGLang plugin: {plugin.SETTING_VARIABLES[name]}" in str(info.value)  # the variable to set instead
    with pytest.raises(InvalidURLError, match=f"'{name}' is a store setting, not a connection option; pass {name}="):
        StatusStore.from_url(f"redis://127.0.0.1:1/0?{option}", namespace="ns")


# -- the sglang version and the manager's shape


def test_sglang_versions() -> None:
    assert version_tuple("0.5.23.post1") == (0, 5, 23) and version_tuple("0.6.0rc1") == (0, 6, 0)
    for supported in ("0.5.23", "0.5.23.post2", "0.5.24", "0.6.0", "1.0"):
        assert check_sglang_version(supported) == supported
    for old in ("0.5.22", "0.4.10.post1", "0.5", "dev", ""):
        with pytest.raises(SettingError, match=r"is not supported: kvstatus needs sglang >= 0\.5\.23"):
            check_sglang_version(old)


def test_register_stops_the_process_on_an_unsupported_sglang(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.metadata

    monkeypatch.setenv(ENV_URL, GOOD_URL)
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.5.10")
    with pytest.raises(SystemExit) as info:
        plugin.register()
    assert str(info.value.code) == (
        f"kvstatus: {ENV_URL} is set, but sglang 0.5.10 is not supported: kvstatus "
        "needs sglang >= 0.5.23 (its CommonKVManager applies the strict update rule "
        "and has the deferred-ACK state install() resets); upgrade sglang, or unset the "
        "plugin's URL"
    )


def test_a_manager_without_what_install_relies_on_is_refused() -> None:
    old = make_manager()
    del old._deferred_ack_targets, old._staging_outstanding
    with pytest.raises(
        ValueError,
        match=r"no _deferred_ack_targets, _staging_outstanding: not the KV manager of a "
        r"supported sglang \(kvstatus needs sglang >= 0\.5\.23",
    ):
        check_manager(old)
    with pytest.raises(ValueError, match="_deferred_ack_targets"):
        install(old, StatusStore(fakeredis.FakeRedis(), namespace="ns", policy="strict"))
    assert old.request_status == {}  # untouched


# -- install() checks the server: real Redis servers


@pytest.fixture(scope="module")
def acl_server() -> Iterator[RedisServer]:
    """A password-protected server with the recipe's users for namespace ``sgok``."""
    with RedisServer(password=ADMIN) as server:
        with server.client() as admin:
            admin.execute_command("ACL", "SETUSER", "worker", *acl_rules("sgok", password=SECRET, scripts="eval"))
            admin.execute_command(
                "ACL", "SETUSER", "reader", *acl_rules("sgok", password=SECRET, scripts="eval", read_only=True)
            )
            admin.execute_command(
                "ACL", "SETUSER", "notrack", *acl_rules("sgok", password=SECRET, scripts="eval"), "-client|tracking"
            )
            admin.execute_command("ACL", "SETUSER", "tenant", *acl_rules("sgok", password=SECRET))
        yield server


def _url(server: RedisServer, user: str, password: str = SECRET, query: str = "") -> str:
    return f"redis://{user}:{password}@{server.host}:{server.port}/0{query}"


def _refused(env: dict[str, str], needle: str, variable: str) -> SettingError:
    manager = make_manager(mode=DisaggregationMode.DECODE)
    with pytest.raises(SettingError, match=needle) as info:
        install_from_env(manager, env)
    assert str(info.value).startswith(f"{variable}"), str(info.value)
    assert manager.request_status == {} and "update_status" not in vars(manager)  # left as it was
    assert SECRET not in _all_text(info.value) and ADMIN not in _all_text(info.value)
    return info.value


@pytest.mark.real
def test_an_unreachable_redis_stops_the_start(caplog: pytest.LogCaptureFixture) -> None:
    url = f"redis://worker:{SECRET}@127.0.0.1:{free_port()}/0?retries=0"
    error = _refused({ENV_URL: url}, "cannot reach Redis", ENV_URL)
    assert str(error).startswith(f"{ENV_URL}=redis://worker:***@127.0.0.1:")
    assert SECRET not in caplog.text


@pytest.mark.real
def test_a_wrong_password_stops_the_start(acl_server: RedisServer) -> None:
    _refused({ENV_URL: _url(acl_server, "worker", "not-the-password")}, "refused the URL's credentials", ENV_URL)
    _refused({ENV_URL: _url(acl_server, "nobody")}, "refused the URL's credentials", ENV_URL)


@pytest.mark.real
def test_a_namespace_outside_the_users_keys_is_named(acl_server: RedisServer) -> None:
    _refused(
        {ENV_URL: _url(acl_server, "worker"), ENV_NAMESPACE: "other"}, "may not read namespace 'other'", ENV_NAMESPACE
    )


@pytest.mark.real
def test_a_read_only_user_is_refused_at_the_start(acl_server: RedisServer) -> None:
    _refused(
        {ENV_URL: _url(acl_server, "reader"), ENV_NAMESPACE: "sgok"}, "may read namespace 'sgok' but not write", ENV_URL
    )


@pytest.mark.real
@pytest.mark.parametrize("asked", ["1", ""])
def test_a_near_cache_the_acl_forbids_says_so_once_and_runs_uncached(
    acl_server: RedisServer, caplog: pytest.LogCaptureFixture, asked: str
) -> None:
    """The near cache is the plugin's default: a user without CLIENT TRACKING gets one warning line naming the
    permission, and a manager that works, uncached."""
    env = {ENV_URL: _url(acl_server, "notrack"), ENV_NAMESPACE: "sgok", ENV_NEAR_CACHE: asked}
    caplog.set_level(logging.INFO, logger="kvstatus")
    manager = make_manager(mode=DisaggregationMode.DECODE)
    status_map = install_from_env(manager, env)
    try:
        room = 4242 + len(asked)
        manager.update_status(room, KVPoll.WaitingForInput)
        for _ in range(5):
            assert room in status_map and manager.check_status(room) == KVPoll.WaitingForInput
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1, caplog.text
        assert "refused to track reads" in warnings[0].getMessage()
        assert "Grant +client|tracking +client|id" in warnings[0].getMessage()
        assert "near cache refused by the server (uncached)" in caplog.text  # the manager's start line
        assert SECRET not in caplog.text
        assert status_map.store.near_cache.refused
    finally:
        status_map.clear_room(4242 + len(asked))
        status_map.close()


@pytest.mark.real
def test_functions_that_are_not_loaded_stop_the_start(acl_server: RedisServer) -> None:
    env = {ENV_URL: _url(acl_server, "tenant"), ENV_NAMESPACE: "sgok", ENV_SCRIPTS: "functions"}
    with acl_server.client() as admin:
        admin.function_flush()
    _refused(env, "is not loaded on this Redis: an admin runs `kvstatus --url ADMIN_URL functions load`", ENV_URL)
    _refused({**env, ENV_SCRIPTS: "eval"}, r"scripts=functions", ENV_SCRIPTS)  # eval under the tenant
    with acl_server.client() as admin:
        load_functions(admin)
    status_map = install_from_env(make_manager(), env)
    assert status_map.store.scripts == "functions"
    status_map.close()


@pytest.mark.real
def test_a_good_start_logs_one_line_per_manager_and_leaves_nothing(
    acl_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    env = {ENV_URL: _url(acl_server, "worker"), ENV_NAMESPACE: "sgok", ENV_NEAR_CACHE: "1", ENV_LEASE_TTL: "6"}
    caplog.set_level(logging.INFO, logger="kvstatus.sglang")
    maps = [install_from_env(make_manager(tp_rank=rank), env) for rank in range(2)]
    lines = [r.getMessage() for r in caplog.records if r.name == "kvstatus.sglang"]
    server = f"redis://worker:***@{acl_server.host}:{acl_server.port}/0"
    assert lines == [
        f"kvstatus: SGLang KV manager prefill-tp{rank}-pp0 on {server}, namespace sgok, policy strict, "
        f"scripts eval, near cache on, lease 6 s (generation {maps[rank].store.lease.generation}), shared fate on, timeline on"
        for rank in range(2)
    ]
    assert SECRET not in caplog.text
    # Each manager holds its lease from the start; the probe left no entry behind.
    with acl_server.client() as admin:
        assert admin.exists("kvstatus:sgok:lease:prefill-tp0-pp0", "kvstatus:sgok:lease:prefill-tp1-pp0") == 2
        assert admin.hgetall("kvstatus:sgok:{9223372036854775807}") == {}
    for status_map in maps:
        assert status_map.store.lease.held
        status_map.close()


@pytest.mark.real
def test_the_plugin_on_its_defaults_and_install_on_its_own_build_the_same_store(redis_server: Any) -> None:
    """Each default is written once: the plugin passes nothing unset, so a manager on the plugin's defaults and one
    installed by a library call with only a URL and a namespace get one configuration."""
    namespace = fresh_namespace("sgdef")
    by_plugin = install_from_env(make_manager(tp_rank=0), {ENV_URL: redis_server.url, ENV_NAMESPACE: namespace})
    by_call = install(make_manager(tp_rank=1), redis_server.url, namespace=namespace)
    try:
        for status_map in (by_plugin, by_call):
            store = status_map.store
            assert store.lease is not None and store.lease.ttl == DEFAULT_LEASE_TTL == 10.0 and store.lease.held
            assert (store.timeline, store.shared_fate, store.scripts, store.policy.value) == (
                True,
                True,
                "eval",
                "strict",
            )
            assert store.near_cache is not None and store.namespace == namespace
    finally:
        by_plugin.close()
        by_call.close()


@pytest.mark.real
def test_install_with_a_url_checks_and_names_the_option(redis_server: Any) -> None:
    """The library call (no plugin) fails at install too, naming install()'s own option."""
    with pytest.raises(SettingError, match="cannot reach Redis") as info:
        install(make_manager(), f"redis://127.0.0.1:{free_port()}/0?retries=0", namespace="x")
    assert info.value.setting == "url"
    manager = make_manager()
    namespace = fresh_namespace("sgst")
    install(manager, redis_server.url, namespace=namespace, lease_ttl=5)
    assert manager.request_status.store.lease.held
    manager.update_status(7, KVPoll.Bootstrapping)
    raw = redis.Redis(host=redis_server.host, port=redis_server.port)
    assert raw.hget(f"kvstatus:{namespace}:lease:prefill-tp0-pp0", "deadline") is not None
    manager.request_status.close()
