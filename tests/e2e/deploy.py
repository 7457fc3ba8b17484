"""Start and stop the e2e tier's processes: an sglang prefill, an sglang decode and the sglang PD router.

Every process is started here, in its own session (so it and the schedulers it spawns form one process
group that nothing else is in), on free loopback ports, with its output in a log file. Stopping walks
that process tree by PID and signals exactly those PIDs: never a process this module did not start.

The flags and the environment that make sglang 0.5.23 run on a CPU-only machine are in :func:`server_argv`
and :func:`server_env`; each names the upstream code path it avoids. They live only here, under tests/.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

from tests.servers.ports import PortRange

HERE = Path(__file__).resolve().parent
CPU_PATH = HERE / "cpu_path"
"""On the servers' PYTHONPATH: the sgl_kernel stub and the test plugin's dist-info (see their docstrings)."""
SERVER_READY_TIMEOUT = 600.0
"""Seconds a server may take to answer /health: ~30 s on 2 quiet cores, up to 5 min measured with the box
shared by several test suites (the spawned scheduler spends most of it importing sglang)."""
ROUTER_READY_TIMEOUT = 90.0
"""Seconds the router may take to answer /health (under 10 s measured)."""
STOP_GRACE = 10.0
"""Seconds between SIGTERM and SIGKILL when stopping a process tree."""


PORTS = PortRange(first=20000, last=21999, bus=False)
"""The tier's own ports (servers, bootstrap servers, routers), each handed out once. A server binds its HTTP
port last, half a minute after it got it, so nothing else on the box may pick from this range meanwhile: it
lies below the kernel's ephemeral range (32768+), where every bind(0) and outgoing connection takes its port
(CI once lost a prefill's port there: 'address already in use'), above the test Redis servers (10000-19999)
and mooncake's transfer-engine RPC ports (MC_MIN_RPC_PORT..MC_MAX_RPC_PORT, 15000-17000), and below
sglang's own nccl port pick (get_free_port_below_ephemeral, 22000-29999)."""

BIND_FAILED = "error while attempting to bind on address"
"""What uvicorn logs when a server's HTTP port is taken; the server then hangs instead of exiting."""


def free_port() -> int:
    """A port of :data:`PORTS` that is free now."""
    return PORTS.take()


class DeployError(RuntimeError):
    """A process of the tier did not start or stopped on its own; the message ends with its log's tail."""


def log_tail(path: Path, lines: int = 30) -> str:
    """The last ``lines`` lines of a log file ('' when there is none)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (children first found through /proc/<pid>/task/*/children)."""
    found: list[int] = []
    todo = [pid]
    while todo:
        parent = todo.pop()
        task_dir = Path(f"/proc/{parent}/task")
        try:
            tasks = list(task_dir.iterdir())
        except OSError:
            continue
        for task in tasks:
            try:
                children = [int(c) for c in (task / "children").read_text().split()]
            except (OSError, ValueError):
                continue
            for child in children:
                if child not in found:
                    found.append(child)
                    todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


@dataclass
class Process:
    """One started process tree: its name (for messages), the leader, its log and the port it serves."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    port: int
    log_start: int = 0
    """Where this process's output begins in ``log`` (a restart on the same port appends to the same file)."""
    extra: dict[str, int] = field(default_factory=dict)

    def output(self) -> str:
        """What this process has written to its log so far."""
        try:
            with open(self.log, "rb") as log:
                log.seek(self.log_start)
                return log.read().decode(errors="replace")
        except OSError:
            return ""

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def tree(self) -> list[int]:
        """The leader's PID and its live descendants' (the scheduler and detokenizer processes of a server)."""
        return [self.pid, *_descendants(self.pid)]

    def signal_tree(self, sig: int) -> list[int]:
        """Send ``sig`` to every process of the tree, by PID; returns the PIDs signalled."""
        pids = self.tree()
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        return pids

    def kill(self) -> None:
        """SIGKILL the whole tree at once (the fault), and reap the leader."""
        pids = self.signal_tree(signal.SIGKILL)
        self.popen.wait(timeout=30)
        _wait_gone(pids, 30.0)

    def stop(self) -> None:
        """SIGTERM the tree, SIGKILL what is left after :data:`STOP_GRACE`; idempotent."""
        if self.popen.poll() is None:
            pids = self.signal_tree(signal.SIGTERM)
            if not _wait_gone(pids, STOP_GRACE):
                self.signal_tree(signal.SIGKILL)
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
        else:
            for pid in _descendants(self.pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        try:
            self.popen.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass


def _wait_gone(pids: list[int], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(_alive(pid) for pid in pids):
            return True
        time.sleep(0.05)
    return False


def start(name: str, argv: list[str], env: dict[str, str], log: Path, port: int) -> Process:
    """Start ``argv`` in a new session with stdout and stderr to ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        log_start = out.tell()
        popen = subprocess.Popen(
            argv,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=log.parent,
        )
    return Process(name, popen, log, port, log_start)


def wait_ready(process: Process, path: str, timeout: float) -> float:
    """Poll ``GET path`` until it answers 200; returns the seconds it took. Raises if it exits or times out."""
    started = time.monotonic()
    deadline = started + timeout
    while time.monotonic() < deadline:
        if process.popen.poll() is not None:
            raise DeployError(
                f"{process.name} exited with {process.popen.returncode} before it was ready; "
                f"log {process.log}:\n{log_tail(process.log)}"
            )
        if BIND_FAILED in process.output():
            raise DeployError(
                f"{process.name} could not bind port {process.port}; log {process.log}:\n{log_tail(process.log)}"
            )
        try:
            with urllib.request.urlopen(process.url + path, timeout=5) as response:
                if response.status == 200:
                    return time.monotonic() - started
        except (urllib.error.URLError, OSError, ValueError):
            pass
        time.sleep(0.5)
    raise DeployError(
        f"{process.name} did not answer {path} within {timeout:.0f} s; log {process.log}:\n{log_tail(process.log)}"
    )


POOL_TOKENS = 4096
"""A server's KV pool (tokens): small, so that :func:`tests.e2e.scenarios.fault_bodies` keeps a prefill busy; a
deployment may give its decodes more (:attr:`Settings.decode_tokens`)."""


@dataclass
class Settings:
    """What every server of one deployment shares."""

    python: str
    model: Path
    logs: Path
    redis_url: Optional[str] = None
    """None: the kvstatus plugin is off (upstream sglang); else its KVSTATUS_SGLANG_URL."""
    namespace: str = "sglang"
    decode_tokens: int = POOL_TOKENS
    """A decode's KV pool (tokens); every prefill's is :data:`POOL_TOKENS`."""


NEAR_CACHE_VARIABLE = "KVSTATUS_E2E_NEAR_CACHE"
"""``0``: the plugin-on deployment also sets ``KVSTATUS_SGLANG_NEAR_CACHE=0`` (not the plugin's default): a run
of the tier with the near cache off, whose table says so. CI runs the defaults (the near cache on)."""


def plugin_label() -> str:
    """How the plugin-on deployment is configured, as the fault table names it."""
    return "near cache off" if os.environ.get(NEAR_CACHE_VARIABLE) == "0" else "defaults"


def server_env(settings: Settings) -> dict[str, str]:
    """The environment of an sglang server on this CPU-only machine."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KVSTATUS_SGLANG_", "SGLANG_", "MC_"))}
    env.update(
        # sglang's CPU engine (sglang.srt.utils is_cpu()); without it the server looks for CUDA
        SGLANG_USE_CPU_ENGINE="1",
        PYTHONPATH=os.pathsep.join(p for p in (str(CPU_PATH), env.get("PYTHONPATH", "")) if p),
        PYTHONUNBUFFERED="1",
        OMP_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
        # mooncake's transfer engine and the bootstrap info advertise this address; by default sglang picks
        # the machine's NIC address, and this tier's traffic stays on loopback
        SGLANG_HOST_IP="127.0.0.1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
    )
    if settings.redis_url is not None:
        env["KVSTATUS_SGLANG_URL"] = settings.redis_url
        env["KVSTATUS_SGLANG_NAMESPACE"] = settings.namespace
        if plugin_label() == "near cache off":
            env["KVSTATUS_SGLANG_NEAR_CACHE"] = "0"
    return env


def server_argv(settings: Settings, role: str, port: int, bootstrap_port: int) -> list[str]:
    """``python -m sglang.launch_server`` for ``role`` (prefill or decode) with the CPU workarounds."""
    argv = [
        settings.python,
        "-m",
        "sglang.launch_server",
        "--model-path",
        str(settings.model),
        "--tokenizer-path",
        str(settings.model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        # CPU: the x86 default attention backend (intel_amx) needs AMX and sgl_kernel's CPU build
        "--device",
        "cpu",
        "--attention-backend",
        "torch_native",
        "--dtype",
        "float32",
        "--disaggregation-mode",
        role,
        # mooncake's TCP transport (the mooncake-transfer-engine-non-cuda wheel): no RDMA device needed
        "--disaggregation-transfer-backend",
        "mooncake_tcp",
        # both roles: the overlap scheduler records CUDA events and streams
        "--disable-overlap-schedule",
        "--disable-cuda-graph",
        "--mem-fraction-static",
        "0.05",
        "--max-total-tokens",
        str(settings.decode_tokens if role == "decode" else POOL_TOKENS),
        "--random-seed",
        "0",
    ]
    if role == "prefill":
        argv += ["--disaggregation-bootstrap-port", str(bootstrap_port)]
    else:
        # decode: the inferred retraction backup (host_pool) allocates a pinned HiCache pool (CUDA)
        argv += ["--disaggregation-decode-retraction-backup", "cpu_tensor"]
    return argv


def start_server(
    settings: Settings, role: str, port: Optional[int] = None, bootstrap_port: Optional[int] = None
) -> Process:
    """Start a prefill or decode server (not waiting for it); same ports again restart it under its name."""
    port = port or free_port()
    bootstrap_port = bootstrap_port or (free_port() if role == "prefill" else 0)
    log = settings.logs / f"{role}-{port}.log"
    process = start(role, server_argv(settings, role, port, bootstrap_port), server_env(settings), log, port)
    process.extra["bootstrap_port"] = bootstrap_port
    return process


def start_router(
    settings: Settings, prefills: Sequence[Process], decodes: Sequence[Process], extra: Sequence[str] = ()
) -> Process:
    """A fresh ``sglang_router`` in ``--pd-disaggregation`` mode in front of ``prefills`` and ``decodes``.

    Wait for it with ``/readiness``: its ``/health`` answers 200 before it has registered any worker.
    ``extra``: more of its options, e.g. ``--disable-retries``.
    """
    port = free_port()
    workers: list[str] = []
    for prefill in prefills:
        workers += ["--prefill", prefill.url, str(prefill.extra["bootstrap_port"])]
    for decode in decodes:
        workers += ["--decode", decode.url]
    argv = [
        settings.python,
        "-m",
        "sglang_router.launch_router",
        "--pd-disaggregation",
        *workers,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        # its metrics endpoint defaults to a fixed port (29000): one per router here, on loopback
        "--prometheus-host",
        "127.0.0.1",
        "--prometheus-port",
        str(free_port()),
        *extra,
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVSTATUS_SGLANG_")}
    return start("router", argv, env, settings.logs / f"router-{port}.log", port)


def post_json(url: str, body: dict[str, object], timeout: float) -> tuple[int, dict[str, object] | str]:
    """POST ``body``; returns (HTTP status, parsed JSON or the raw text). Status 0: no HTTP answer at all."""
    data = json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    except (urllib.error.URLError, OSError) as exc:
        return 0, f"{type(exc).__name__}: {exc}"
    text = raw.decode(errors="replace")
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


if __name__ == "__main__":  # pragma: no cover - a manual check: python -m tests.e2e.deploy MODEL_DIR LOG_DIR
    s = Settings(sys.executable, Path(sys.argv[1]), Path(sys.argv[2]))
    p = start_server(s, "prefill")
    print(p.pid, p.url, wait_ready(p, "/health", SERVER_READY_TIMEOUT))
    p.stop()
