"""The e2e tier's process helpers without sglang (runs in ``./dev test`` too): its ports, a bind failure, and what
it keeps of kvstatus' rooms when requests had no answer."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kvstatus import KVPoll, StatusStore
from tests.e2e import cluster, deploy
from tests.servers import RedisServer


def test_the_tier_s_ports_lie_outside_every_range_another_process_picks_from() -> None:
    picked = {deploy.free_port() for _ in range(10)}
    assert len(picked) == 10
    for port in picked:
        assert deploy.PORTS.first <= port <= deploy.PORTS.last
        assert port < 32768  # the kernel's ephemeral range (bind(0), outgoing connections)
        assert not 15000 <= port <= 17000  # mooncake's transfer-engine RPC ports
        assert not 22000 <= port <= 29999  # sglang's nccl port


def test_a_server_that_cannot_bind_its_port_fails_at_once_instead_of_at_the_timeout(tmp_path: Path) -> None:
    """uvicorn logs the bind error and the server hangs on: waiting for /health says so (the message of a
    timeout differs) instead of waiting out its 600 s."""
    log = tmp_path / "prefill.log"
    log.write_text(f"an earlier run of this port: {deploy.BIND_FAILED} ('127.0.0.1', 1)\n")
    script = f"print(\"ERROR:    [Errno 98] {deploy.BIND_FAILED} ('127.0.0.1', 1): in use\", flush=True); "
    sleeper = deploy.start("prefill", [sys.executable, "-c", "import time; time.sleep(60)"], {}, log, 1)
    try:
        # Only this process's own output counts: the line an earlier process left in the log does not.
        with pytest.raises(deploy.DeployError, match="did not answer /health within 1 s"):
            deploy.wait_ready(sleeper, "/health", 1.0)
    finally:
        sleeper.stop()
    process = deploy.start("prefill", [sys.executable, "-c", script + "import time; time.sleep(60)"], {}, log, 1)
    try:
        with pytest.raises(deploy.DeployError, match="could not bind port 1") as raised:
            deploy.wait_ready(process, "/health", 300.0)
        assert "in use" in str(raised.value)
    finally:
        process.stop()


@pytest.mark.real
def test_requests_without_an_answer_leave_the_rooms_as_kvstatus_saw_them_beside_the_logs(tmp_path: Path) -> None:
    """What the next flake of a cluster fault needs: which participant wrote what in each stuck room."""
    with RedisServer() as server:
        settings = deploy.Settings(sys.executable, tmp_path, tmp_path, server.url, "e2e-keep")
        StatusStore(server.client(), namespace="e2e-keep", participant="prefill-a").update_status(
            7, KVPoll.Bootstrapping
        )
        cluster.keep_rooms(settings, "SIGKILL a prefill, requests in flight")
        cluster.keep_rooms(deploy.Settings(sys.executable, tmp_path, tmp_path / "upstream"), "no Redis: nothing kept")
        seen = cluster.rooms_seen(settings)
        cluster.keep_rooms(settings, "SIGKILL a decode", seen)
    kept = (tmp_path / "no-answer-sigkill-a-prefill--requests-in-flight.txt").read_text()
    assert '"room": 7' in kept and "prefill-a" in kept and "Bootstrapping" in kept, kept
    assert (tmp_path / "no-answer-sigkill-a-decode.txt").read_text() == f"SIGKILL a decode\n{seen}"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "no-answer-sigkill-a-decode.txt",
        "no-answer-sigkill-a-prefill--requests-in-flight.txt",
    ]
