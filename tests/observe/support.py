"""Helpers of the observe tests: running a long-lived CLI server as a subprocess, scraping, waiting."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from typing import Any, Callable, Optional

from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, frozenset], float]


def wait_until(check: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    """Poll ``check`` every 0.1 s until it returns a truthy value (returned) or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except Exception as exc:  # noqa: BLE001 - a server still starting refuses connections
            last = exc
        else:
            if last:
                return last
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last: {last!r}")


def get(url: str, timeout: float = 10.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read().decode()


def scrape(url: str) -> Samples:
    """Every sample of a /metrics page: (name, labels) -> value."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(get(url))
        for s in family.samples
    }


def sample(samples: Samples, name: str, **labels: str) -> Optional[float]:
    return samples.get((name, frozenset(labels.items())))


class ServerProcess:
    """``python -m kvstatus.cli ARGS`` (a command that prints ``http://HOST:PORT`` on stderr when ready)."""

    def __init__(self, *args: str, env: Optional[dict[str, str]] = None) -> None:
        environment = {k: v for k, v in os.environ.items() if not k.startswith("KVSTATUS_")}
        environment.update(env or {})
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kvstatus.cli", *args],
            stderr=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=environment,
        )
        self.stderr: list[str] = []
        self._port: Optional[int] = None
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr.append(line)
            found = re.search(r"http://[^:/\s]+:(\d+)/", line)
            if found and self._port is None:
                self._port = int(found.group(1))

    @property
    def port(self) -> int:
        wait_until(lambda: self._port or self.proc.poll() is not None, 60, "the server to listen")
        if self._port is None:
            raise AssertionError(f"server exited with {self.proc.returncode}: {''.join(self.stderr)}")
        return self._port

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def terminate(self, timeout: float = 30.0) -> int:
        """SIGTERM, then the exit code (fails the test if it does not exit within ``timeout`` seconds)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"server did not exit within {timeout}s of SIGTERM") from None
        self._reader.join(5)
        return code

    @property
    def output(self) -> str:
        return "".join(self.stderr) + (
            self.proc.stdout.read() if self.proc.stdout and self.proc.poll() is not None else ""
        )

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
