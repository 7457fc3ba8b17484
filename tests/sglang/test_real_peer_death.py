"""Two real sglang 0.5.23 KV managers in two processes, on kvstatus through the plugin's environment: SIGKILL
the prefill's process, and the decode's check_status answers Failed, its failure record naming the dead prefill
(``./dev test-sglang``). The time it takes is reported by benchmarks/peerfaults.py, not asserted here beyond a
bound that says "not SGLang's 300 s timeout"."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any

import pytest

from kvstatus.sglang.plugin import ENV_LEASE_TTL, ENV_NAMESPACE, ENV_URL, install_from_env
from tests.helpers.backends import fresh_namespace
from tests.sglang.test_real_sglang import plugin_child, real_manager
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


def test_a_sigkilled_prefill_fails_the_decodes_room_naming_it(sg: Any, redis_server: Any) -> None:
    namespace = fresh_namespace("sgdeath")
    env = {ENV_URL: redis_server.url, ENV_NAMESPACE: namespace, ENV_LEASE_TTL: str(LEASE_TTL)}
    decode = _with_failure_records(real_manager(sg, mode=sg.Mode.DECODE))
    install_from_env(decode, env)
    decode.update_status(ROOM, sg.KVPoll.Bootstrapping)
    decode.update_status(ROOM, sg.KVPoll.WaitingForInput)
    child_env = {**os.environ, **env}
    child_env.pop("SGLANG_PLUGINS", None)
    prefill = subprocess.Popen(
        [sys.executable, "-W", "ignore", "-c", PREFILL_CHILD, str(ROOM)],
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
        time.sleep(1.5)  # the decode's watch has seen the prefill's lease
        assert decode.check_status(ROOM) == sg.KVPoll.WaitingForInput  # a live prefill fails nothing
        prefill.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        while decode.check_status(ROOM) != sg.KVPoll.Failed and time.monotonic() - killed < BOUND_SECONDS:
            time.sleep(0.01)  # the receiver's poll of a WaitingForInput room: check_status
        took = time.monotonic() - killed
        assert decode.check_status(ROOM) == sg.KVPoll.Failed, f"the room did not fail within {BOUND_SECONDS} s"
        print(f"failed {took:.2f} s after the SIGKILL (lease TTL {LEASE_TTL} s)")
        # What the receiver's failure_exception() pops and raises as its KVTransferError's reason.
        reason = decode.failure_records[ROOM]
        assert "participant prefill-tp0-pp0 lost its lease" in reason and "unknown reason" not in reason
    finally:
        prefill.kill()
        prefill.wait()
        decode.request_status.close()
