"""Two real sglang 0.5.23 KV managers in two processes, on kvstatus through the plugin's environment: SIGKILL
the prefill's process, and the decode's check_status answers Failed, its failure record naming the dead prefill
(``./dev test-sglang``). The time it takes is reported by benchmarks/peerfaults.py, not asserted here beyond a
bound that says "not SGLang's 300 s timeout"."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from typing import Any, Iterator

import pytest

from kvstatus.sglang.plugin import ENV_LEASE_TTL, ENV_NAMESPACE, ENV_URL, install_from_env
from tests.helpers.backends import fresh_namespace
from tests.sglang.test_real_sglang import BOOTSTRAP_PORT, plugin_child, real_manager
from tests.sglang.test_real_startup import _with_failure_records

pytestmark = [pytest.mark.sglang, pytest.mark.real]
ROOM = 770_077
LEASE_TTL = 3
BOUND_SECONDS = 30  # far above the lease TTL plus a second, far below SGLang's 300 s

PREFILL_CHILD = plugin_child(
    "PREFILL",
    0,
    """
    m = conn.CommonKVManager()
    room = int(sys.argv[1])
    m.update_status(room, conn.KVPoll.Bootstrapping)
    m.update_status(room, conn.KVPoll.Transferring)
    print("transferring", flush=True)
    time.sleep(600)
    """,
)


IDLE_PREFILL_CHILD = plugin_child(
    "PREFILL",
    0,
    """
    m = conn.CommonKVManager()  # installed: it holds its lease, carrying its bootstrap address, and writes nothing
    print("transferring", flush=True)
    time.sleep(600)
    """,
)
DONE_PREFILL_CHILD = plugin_child(
    "PREFILL",
    0,
    """
    m = conn.CommonKVManager()
    room = int(sys.argv[1])
    m.update_status(room, conn.KVPoll.Bootstrapping)
    m.update_status(room, conn.KVPoll.Success)  # its part done; killed before its completion message is sent
    print("transferring", flush=True)
    time.sleep(600)
    """,
)
ADDRESS = f"127.0.0.1:{BOOTSTRAP_PORT}"
PREFILL = f"prefill-127.0.0.1-{BOOTSTRAP_PORT}-tp0-pp0"  # its name on the defaults: its bootstrap address
DIED = f"participant {PREFILL} died: its connection to Redis closed"  # its presence left Redis


@contextlib.contextmanager
def _prefill(script: str, env: dict[str, str]) -> Iterator[subprocess.Popen[str]]:
    child_env = {**os.environ, **env}
    child_env.pop("SGLANG_PLUGINS", None)
    prefill = subprocess.Popen(
        [sys.executable, "-W", "ignore", "-c", script, str(ROOM)],
        env=child_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd="/",
    )
    try:
        assert prefill.stdout is not None
        line = prefill.stdout.readline()
        assert line == "transferring\n", prefill.stderr.read() if prefill.stderr else ""
        yield prefill
    finally:
        prefill.kill()
        prefill.wait()


def _failed_after_sigkill(sg: Any, decode: Any, prefill: subprocess.Popen[str], waiting: Any) -> str:
    """SIGKILL ``prefill`` once the decode's watch has seen it; returns the reason failure_exception() reports."""
    time.sleep(1.5)  # the decode's watch has seen the prefill's lease
    assert decode.check_status(ROOM) == waiting  # a live prefill fails nothing
    prefill.send_signal(signal.SIGKILL)
    killed = time.monotonic()
    while decode.check_status(ROOM) != sg.KVPoll.Failed and time.monotonic() - killed < BOUND_SECONDS:
        time.sleep(0.01)  # the receiver's poll of the room: check_status
    took = time.monotonic() - killed
    assert decode.check_status(ROOM) == sg.KVPoll.Failed, f"the room did not fail within {BOUND_SECONDS} s"
    print(f"failed {took:.2f} s after the SIGKILL (lease TTL {LEASE_TTL} s)")
    # What the receiver's failure_exception() pops and raises as its KVTransferError's reason.
    reason: str = decode.failure_records[ROOM]
    assert "unknown reason" not in reason
    return reason


def _decode(sg: Any, env: dict[str, str]) -> Any:
    decode = _with_failure_records(real_manager(sg, mode=sg.Mode.DECODE))
    decode.addr_to_rooms_tracker = defaultdict(set)  # upstream's decode manager has one
    install_from_env(decode, env)
    return decode


def test_a_sigkilled_prefill_fails_the_decodes_room_naming_it(sg: Any, redis_server: Any) -> None:
    env = {ENV_URL: redis_server.url, ENV_NAMESPACE: fresh_namespace("sgdeath"), ENV_LEASE_TTL: str(LEASE_TTL)}
    decode = _decode(sg, env)
    try:
        decode.update_status(ROOM, sg.KVPoll.Bootstrapping)
        decode.update_status(ROOM, sg.KVPoll.WaitingForInput)
        with _prefill(PREFILL_CHILD, env) as prefill:
            reason = _failed_after_sigkill(sg, decode, prefill, sg.KVPoll.WaitingForInput)
        assert DIED in reason, reason
    finally:
        decode.request_status.close()


def test_a_room_sent_to_a_prefill_that_never_wrote_it_fails_when_the_prefill_dies(sg: Any, redis_server: Any) -> None:
    """Issue 16 item 2's last part: the room holds only the decode's entry. The decode's receiver files it under
    the prefill's bootstrap address (upstream's CommonKVReceiver.__init__: ``addr_to_rooms_tracker[addr].add(room)``,
    then ``update_status(room, Bootstrapping)``), the prefill's lease carries that address, and the decode's watch
    fails the room when the lease is lost, naming the prefill and the address."""
    env = {ENV_URL: redis_server.url, ENV_NAMESPACE: fresh_namespace("sgaddr"), ENV_LEASE_TTL: str(LEASE_TTL)}
    decode = _decode(sg, env)
    try:
        with _prefill(IDLE_PREFILL_CHILD, env) as prefill:
            decode.addr_to_rooms_tracker[ADDRESS].add(ROOM)  # what upstream's receiver does, in its order
            decode.update_status(ROOM, sg.KVPoll.Bootstrapping)
            reason = _failed_after_sigkill(sg, decode, prefill, sg.KVPoll.Bootstrapping)
        assert f"{DIED}; this room waits on it at {ADDRESS}" in reason, reason
    finally:
        decode.request_status.close()


def test_a_room_whose_prefill_died_after_its_success_fails_when_its_message_never_came(
    sg: Any, redis_server: Any
) -> None:
    """Upstream's prefill writes Success (conclude_transfer), then sends the decode its completion message; killed
    in between, its decode waited out SGLang's 300 s timeout. The decode's room waits on the prefill's address,
    and its own entry is still open when the prefill's lease expires: the watch fails it, naming the prefill."""
    env = {ENV_URL: redis_server.url, ENV_NAMESPACE: fresh_namespace("sgdone"), ENV_LEASE_TTL: str(LEASE_TTL)}
    decode = _decode(sg, env)
    try:
        decode.addr_to_rooms_tracker[ADDRESS].add(ROOM)
        decode.update_status(ROOM, sg.KVPoll.Bootstrapping)
        decode.update_status(ROOM, sg.KVPoll.WaitingForInput)
        with _prefill(DONE_PREFILL_CHILD, env) as prefill:
            reason = _failed_after_sigkill(sg, decode, prefill, sg.KVPoll.WaitingForInput)
        assert f"{DIED}; this room waits on it at {ADDRESS}" in reason, reason
        assert decode.request_status.store.room(ROOM).participants[PREFILL].status == sg.KVPoll.Success
    finally:
        decode.request_status.close()
