"""The real sglang 0.5.23 (``./dev test-sglang``): bad room ids fail one request, bad settings stop the start."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from typing import Any, Iterator

import pytest

from kvstatus import KVPoll, StatusStore
from kvstatus.sglang import install
from tests.helpers.backends import fresh_namespace
from tests.servers import free_port
from tests.sglang.test_real_sglang import PLUGIN_CHILD, real_manager, real_sender

pytestmark = [pytest.mark.sglang, pytest.mark.real]
BAD_ROOMS = [-1, 2**63, "42", None]
REASON = "is not a room id kvstatus can store"
SECRET = "Hunter2-real-Secr3t"


@pytest.fixture
def gloo_group() -> Iterator[Any]:
    """A gloo process group of one rank: what the scheduler's poll_and_all_reduce reduces over."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


def _with_failure_records(manager: Any) -> Any:
    manager.failure_records, manager.failure_lock = {}, threading.Lock()  # set by the real __init__
    return manager


def _real_receiver(sg: Any, manager: Any, room: Any) -> Any:
    r = object.__new__(sg.conn.CommonKVReceiver)
    r.kv_mgr, r.bootstrap_room, r.conclude_state = manager, room, None
    r._lifecycle_lock, r._prefill_wait_start = threading.RLock(), None
    return r


def test_bad_rooms_fail_one_request_through_the_schedulers_poll(sg: Any, gloo_group: Any, redis_server: Any) -> None:
    from sglang.srt.disaggregation.utils import poll_and_all_reduce

    namespace = fresh_namespace("sgbadreal")
    prefill = _with_failure_records(real_manager(sg))
    decode = _with_failure_records(real_manager(sg, mode=sg.Mode.DECODE))
    for manager in (prefill, decode):
        install(manager, redis_server.url, namespace=namespace)
    good = 31
    rooms = [*BAD_ROOMS, good]
    for room in rooms:  # CommonKVSender.__init__ opens its room
        prefill.update_status(room, sg.KVPoll.Bootstrapping)
    senders = [real_sender(sg, prefill, room) for room in rooms]
    # The prefill scheduler's poll of its bootstrap queue: upstream's own function, min-reduced over the group.
    assert poll_and_all_reduce(senders, gloo_group) == [sg.KVPoll.Failed] * len(BAD_ROOMS) + [sg.KVPoll.Bootstrapping]
    for sender in senders[:-1]:  # the scheduler asks each failed request why, and aborts only that request
        with pytest.raises(sg.conn.KVTransferError, match=REASON) as info:
            sender.failure_exception()
        assert not info.value.is_from_another_rank
    assert prefill.failure_records == {}
    # The decode's receivers poll check_status alone (on upstream's dict a missing room raised KeyError).
    for room in BAD_ROOMS:
        decode.update_status(room, sg.KVPoll.Bootstrapping)
        assert _real_receiver(sg, decode, room).poll() == sg.KVPoll.Failed
    # The good room goes on, and no bad id reached Redis.
    for status in (sg.KVPoll.WaitingForInput, sg.KVPoll.Transferring, sg.KVPoll.Success):
        prefill.update_status(good, status)
    assert senders[-1].poll() == sg.KVPoll.Success
    view = StatusStore.from_url(redis_server.url, namespace=namespace)
    assert view.room(good).participants["prefill-tp0-pp0"].status == KVPoll.Success
    prefill.request_status.close()
    decode.request_status.close()


def test_abort_messages_with_bad_rooms_are_harmless(sg: Any, redis_server: Any) -> None:
    prefill = _with_failure_records(real_manager(sg, deferred=sg.DeferredBootstrap(300)))
    install(prefill, redis_server.url, namespace=fresh_namespace("sgabort"))
    for room in (b"-1", b"9223372036854775808", b"-77"):  # upstream parses the room with int()
        prefill._handle_bootstrap_message([b"ABORT", room, b"127.0.0.1", b"9"])
    assert prefill.failure_records == {} and prefill.sent_messages == []
    prefill.request_status.close()


# -- the plugin, through sglang's own loader, in a fresh process


def _child(env: dict[str, str], prelude: str = "") -> subprocess.CompletedProcess[str]:
    script = textwrap.dedent(prelude) + "\nimport logging\nlogging.basicConfig(level=logging.INFO)\n" + PLUGIN_CHILD
    full_env = {**os.environ, **env}
    full_env.pop("SGLANG_PLUGINS", None)
    return subprocess.run(
        [sys.executable, "-W", "ignore", "-c", script],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=180,
        cwd="/",
    )


def test_an_unreachable_redis_stops_the_managers_construction(sg: Any) -> None:
    url = f"redis://worker:{SECRET}@127.0.0.1:{free_port()}/0?retries=0"
    result = _child({"KVSTATUS_SGLANG_URL": url})
    assert result.returncode == 1 and result.stdout == ""
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("kvstatus.sglang.startup.SettingError: KVSTATUS_SGLANG_URL=redis://worker:***@127.0.0.1:")
    assert "cannot reach Redis" in last and SECRET not in result.stderr


def test_an_unsupported_sglang_stops_the_start(sg: Any, redis_server: Any) -> None:
    prelude = """
        import importlib.metadata
        _version = importlib.metadata.version
        importlib.metadata.version = lambda name: "0.5.9" if name == "sglang" else _version(name)
    """
    result = _child({"KVSTATUS_SGLANG_URL": redis_server.url}, prelude)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.strip().splitlines()[-1] == (
        "kvstatus: KVSTATUS_SGLANG_URL is set, but sglang 0.5.9 is not supported: kvstatus needs sglang >= 0.5.23 "
        "(its CommonKVManager applies the strict update rule and has the deferred-ACK state install() resets); "
        "upgrade sglang, or unset the plugin's URL"
    )


def test_a_good_start_logs_one_line_with_the_lease(sg: Any, redis_server: Any) -> None:
    namespace = fresh_namespace("sglog")
    result = _child(
        {
            "KVSTATUS_SGLANG_URL": redis_server.url,
            "KVSTATUS_SGLANG_NAMESPACE": namespace,
            "KVSTATUS_SGLANG_LEASE_TTL": "5",
        }
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("INFO:kvstatus.sglang:")]
    assert lines == [
        f"INFO:kvstatus.sglang:kvstatus: SGLang KV manager decode-tp3-pp0 on "
        f"redis://{redis_server.host}:{redis_server.port}/0, namespace {namespace}, policy strict, "
        "scripts eval, near cache on, lease 5 s (generation 1), shared fate on, timeline on"
    ]
