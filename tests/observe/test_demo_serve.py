"""`kvstatus demo --serve PORT`: the board runs during the demo and stays up, with its Redis, until Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

import pytest

from tests.observe.support import get, wait_until

pytestmark = pytest.mark.real


def test_demo_serve_keeps_the_board_up_until_ctrl_c() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVSTATUS_")}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kvstatus.cli",
            "demo",
            "--prefill",
            "1",
            "--decode",
            "1",
            "--requests",
            "150",
            "--serve",
            "0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stderr.readline, "")), daemon=True)
    reader.start()
    try:
        wait_until(lambda: any("stay up until Ctrl-C" in line for line in lines), 120, "the demo to finish")
        board = next(line for line in lines if line.startswith("serve: board of"))
        assert "kvstatus-demo-kvstatus" in board
        base = board.split(" at ")[1].split()[0].rstrip("/")
        summary = json.loads(get(base + "/api/summary"))
        assert summary["namespace"] == "kvstatus-demo-kvstatus" and summary["up"] is True
        assert summary["history"], "the board ran passes during the demo"
        assert proc.poll() is None
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the whole foreground group
        out, rest = proc.communicate(timeout=60)  # reads what the reader thread had not read yet
        lines.append(rest)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    reader.join(5)
    assert proc.returncode == 0, "".join(lines)
    assert "IMPLEMENTATION" in out and "Traceback" not in "".join(lines)
    assert any("embedded server stopped" in line for line in lines)
    with pytest.raises(OSError):
        get(base + "/api/summary", timeout=2)
