"""``kvstatus demo``: the PD cluster simulation of :mod:`kvstatus.demo`, with a progress bar and the table."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from typing import Iterator, Optional

import click

from kvstatus.cli.app import (
    CliEnv,
    emit_json,
    json_option,
    main,
    pass_env,
    require_extra,
    stderr_is_tty,
    table,
)
from kvstatus.demo.faults import FAULTS, UPSTREAM, Trial, run_trial
from kvstatus.demo.stuck import LEASE_TTL, run_stuck_scenario
from kvstatus.demo.workload import (
    FAKEREDIS_DEFAULT_REQUESTS,
    DemoConfig,
    DemoError,
    DemoResult,
    embedded_redis,
    run_demo,
)
from kvstatus.errors import KVStatusError, mask_url

DEFAULTS = DemoConfig()
DEFAULT_NAMESPACE = "kvstatus-demo"
BAR_WIDTH = 30


@contextlib.contextmanager
def _redis_for(env: CliEnv) -> Iterator[tuple[str, bool]]:
    """(URL, is fakeredis) to run on: --url / KVSTATUS_URL if given, else an embedded server (said on stderr)."""
    if env.url:
        click.echo(f"demo: using {mask_url(env.url)}", err=True)
        yield env.url, False
        return
    with embedded_redis() as server:
        click.echo(f"demo: no --url or KVSTATUS_URL given, running on an {server.description}", err=True)
        yield server.url, server.fake
    click.echo("demo: embedded server stopped", err=True)


class _Bar:
    """A progress bar on stderr, redrawn in place on a terminal, one line per implementation otherwise."""

    def __init__(self) -> None:
        self.tty = stderr_is_tty()
        self.current: Optional[str] = None

    def __call__(self, implementation: str, done: int, total: int) -> None:
        if implementation != self.current:
            if self.current is not None and self.tty:
                click.echo("", err=True)
            self.current = implementation
            if not self.tty:
                click.echo(f"demo: running {implementation} ({total} requests)", err=True)
        if self.tty:
            filled = BAR_WIDTH * done // max(total, 1)
            click.echo(
                f"\r{implementation:<12} [{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {done}/{total}",
                nl=False,
                err=True,
            )

    def close(self) -> None:
        if self.tty and self.current is not None:
            click.echo("", err=True)


def result_table(results: list[DemoResult]) -> str:
    rows = [
        [
            r.implementation,
            r.requests,
            r.aborts,
            r.resurrected,
            r.stale,
            r.leaked_keys,
            r.keys_without_ttl,
            f"{r.updates_per_second:,.0f}",
        ]
        for r in results
    ]
    return table(
        [
            "IMPLEMENTATION",
            "REQUESTS",
            "ABORTS",
            "RESURRECTED ROOMS",
            "STALE-STATUS REQUESTS",
            "LEAKED KEYS",
            "KEYS WITHOUT TTL",
            "UPDATES/S",
        ],
        rows,
    )


class _Board:
    """``kvstatus serve`` of the demo's namespace in a child process (the URL goes by environment, not argv)."""

    def __init__(self, url: str, namespace: str, port: int) -> None:
        env = {**os.environ, "KVSTATUS_URL": url, "KVSTATUS_NAMESPACE": namespace}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kvstatus.cli", "serve", "--port", str(port), "--interval", "0.5"], env=env
        )

    def wait_for_ctrl_c(self) -> None:
        click.echo(
            "demo: the board and the Redis stay up until Ctrl-C (the run emptied its namespace at the end; "
            "the board's chart and recent changes keep what happened)",
            err=True,
        )
        try:
            code = self.proc.wait()
        except KeyboardInterrupt:
            return
        if code != 0:
            raise click.ClickException(f"the board exited with code {code}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@main.command()
@click.option(
    "--prefill",
    type=click.IntRange(min=1, max=64),
    default=DEFAULTS.prefill,
    show_default=True,
    help="Prefill worker processes.",
)
@click.option(
    "--decode",
    type=click.IntRange(min=1, max=64),
    default=DEFAULTS.decode,
    show_default=True,
    help="Decode worker processes.",
)
@click.option(
    "--requests",
    type=click.IntRange(min=1),
    help=f"Requests per worker process [default: {DEFAULTS.requests}; {FAKEREDIS_DEFAULT_REQUESTS} on the "
    "embedded fakeredis, which is slower].",
)
@click.option(
    "--rooms",
    type=click.IntRange(min=1),
    default=DEFAULTS.rooms,
    show_default=True,
    help="Room ids per pool (small pools mean much room-id reuse).",
)
@click.option(
    "--abort-rate",
    type=click.FloatRange(0, 1),
    default=DEFAULTS.abort_rate,
    show_default=True,
    help="Share of requests that are aborted.",
)
@click.option(
    "--late-share",
    type=click.FloatRange(0, 1),
    default=DEFAULTS.late_abort_share,
    show_default=True,
    help="Share of aborts delivered after the room was cleared (the late-abort race).",
)
@click.option(
    "--seed",
    type=int,
    default=DEFAULTS.seed,
    show_default=True,
    help="Seed of the workload: every run draws the same requests, rooms and aborts. The counts still vary "
    "a little from run to run: they depend on how the OS interleaves the worker processes.",
)
@click.option(
    "--serve",
    "serve_port",
    type=click.IntRange(0, 65535),
    metavar="PORT",
    help="Also run the web board (kvstatus serve) of the kvstatus run on 127.0.0.1:PORT, live during the "
    "demo, and keep it and the Redis up afterwards until Ctrl-C (needs kvstatus[web]).",
)
@click.option(
    "--faults",
    is_flag=True,
    help="Instead of the workload: kill, restart, pause a peer in another process and cancel a room from a "
    "third, once each, and show how long the survivor took to read Failed, the cause it saw, and what SGLang "
    "alone does (leases of 3 s; about 30 s).",
)
@click.option(
    "--stuck",
    is_flag=True,
    help="Instead of the workload: a pair that serves beside a slow decode and a dead prefill, then what "
    "`kvstatus ls --stuck` and `kvstatus health` say about them (rooms count as stuck after 2 s here; about "
    "10 s). With --serve, the board shows them until Ctrl-C.",
)
@json_option
@pass_env
def demo(
    env: CliEnv,
    faults: bool,
    stuck: bool,
    prefill: int,
    decode: int,
    requests: Optional[int],
    rooms: int,
    abort_rate: float,
    late_share: float,
    seed: int,
    serve_port: Optional[int],
    as_json: bool,
) -> None:
    """Simulate a PD cluster: the same workload against kvstatus, a client-side read-then-write rule, kvstatus through the SGLang mapping (kvstatus.sglang), and the pre-fix rule.

    Prefill and decode worker processes run SGLang-like request lifecycles on
    reused room ids, with random aborts, some delivered after the room was
    cleared. Without --url / KVSTATUS_URL it starts an embedded server
    (redis-server if on PATH, else fakeredis) and stops it afterwards.
    """
    namespace = env.namespace or DEFAULT_NAMESPACE
    if serve_port is not None:
        require_extra("web", "--serve")
    if faults and stuck:
        raise click.UsageError("--faults and --stuck are two demos: choose one")
    if faults:
        with _redis_for(env) as (url, _):
            _fault_demo(url, namespace, as_json)
        return
    if stuck:
        with _redis_for(env) as (url, _):
            _stuck_demo(url, namespace, as_json, serve_port)
        return
    bar = _Bar()
    board: Optional[_Board] = None
    try:
        with _redis_for(env) as (url, fake):
            if requests is None:
                requests = FAKEREDIS_DEFAULT_REQUESTS if fake else DEFAULTS.requests
            config = DemoConfig(
                prefill=prefill,
                decode=decode,
                requests=requests,
                rooms=rooms,
                abort_rate=abort_rate,
                late_abort_share=late_share,
                seed=seed,
            )
            if serve_port is not None:
                board = _Board(url, f"{namespace}-kvstatus", serve_port)
            try:
                results = run_demo(url, namespace, config, bar)
            finally:
                bar.close()
            if board is not None:
                _report(results, config, as_json)
                board.wait_for_ctrl_c()
                return
    except DemoError as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        if board is not None:
            board.stop()
    _report(results, config, as_json)


def _report(results: list[DemoResult], config: DemoConfig, as_json: bool) -> None:
    prefill, decode, requests, rooms = config.prefill, config.decode, config.requests, config.rooms
    abort_rate, late_share, seed = config.abort_rate, config.late_abort_share, config.seed
    if as_json:
        emit_json({"config": config.__dict__, "results": [r.to_json() for r in results]})
        return
    click.echo(
        f"{prefill} prefill + {decode} decode processes, {requests} requests each, "
        f"{rooms} room ids per pool, abort rate {abort_rate:g} ({late_share:g} of them late), seed {seed}"
    )
    click.echo("")
    click.echo(result_table(results))
    click.echo("")
    click.echo(
        "resurrected rooms: abort writes that re-created an entry its owner had cleared\n"
        "stale-status requests: requests whose first poll saw a status left by an earlier request on the room\n"
        "leaked keys, keys without TTL: left in the namespace after every worker finished\n"
        "a peer's death, restart or a cancel: kvstatus demo --faults; on real SGLang servers: docs/e2e.md"
    )


FAULT_LEASE_TTL = 3.0


def _fault_demo(url: str, namespace: str, as_json: bool) -> None:
    """One trial of every fault of :mod:`kvstatus.demo.faults`, as a table (or JSON)."""
    trials = []
    for i, fault in enumerate(FAULTS):
        click.echo(f"demo: {fault} ...", err=True)
        try:
            trials.append(run_trial(url, f"{namespace}-faults-{os.getpid()}-{i}", 7_000 + i, fault, FAULT_LEASE_TTL))
        except (RuntimeError, KVStatusError) as exc:
            raise click.ClickException(f"the {fault} trial could not run: {exc}") from None
    if as_json:
        emit_json(
            {
                "lease_ttl_s": FAULT_LEASE_TTL,
                "trials": [
                    {
                        "fault": t.fault,
                        "seconds_to_failed": t.seconds,
                        "cause": t.cause,
                        "sglang_alone": UPSTREAM[t.fault],
                    }
                    for t in trials
                ],
            }
        )
        return

    def took(trial: Trial) -> str:
        if trial.fault == "pause":
            return "nothing failed" if trial.seconds is None else "FAILED (a false failure)"
        return "never (60 s)" if trial.seconds is None else f"{trial.seconds:.2f} s"

    click.echo(
        f"A survivor in this process polls its room every 5 ms while a peer in another process holds a "
        f"{FAULT_LEASE_TTL:g} s lease (the SGLang plugin's default is 10 s). A killed peer's presence goes with its "
        "process, so the kill rows do not wait for the lease. The same faults on real SGLang servers behind the "
        "router, as a client sees them: docs/e2e.md."
    )
    click.echo("")
    rows = [[t.fault, took(t), t.cause, UPSTREAM[t.fault]] for t in trials]
    click.echo(table(["FAULT", "KVSTATUS: FAILED AFTER", "CAUSE THE SURVIVOR SEES", "SGLANG ALONE"], rows))


STUCK_OLDER_THAN = "2s"


def _stuck_demo(url: str, namespace: str, as_json: bool, serve_port: Optional[int]) -> None:
    """:mod:`kvstatus.demo.stuck`, then ``ls --stuck`` and ``health`` on it, run as an operator runs them."""
    click.echo("demo: a serving pair, a slow decode and a dead prefill ...", err=True)
    try:
        scenario = run_stuck_scenario(url, f"{namespace}-stuck-{os.getpid()}")
    except (RuntimeError, KVStatusError) as exc:
        raise click.ClickException(f"the stuck scenario could not run: {exc}") from None
    board: Optional[_Board] = None
    try:
        runs = []
        for args in (["ls", "--stuck", "--older-than", STUCK_OLDER_THAN], ["health", "--older-than", STUCK_OLDER_THAN]):
            command = ["--namespace", scenario.namespace, *args, *(["--json"] if as_json else [])]
            done = subprocess.run(
                [sys.executable, "-m", "kvstatus.cli", *command],
                env={**os.environ, "KVSTATUS_URL": url},  # the URL, password and all, stays out of argv
                capture_output=True,
                text=True,
                timeout=120,
            )
            runs.append((command, done))
        if as_json:
            emit_json(
                {
                    "namespace": scenario.namespace,
                    "older_than": STUCK_OLDER_THAN,
                    "stuck": _json_or_text(runs[0][1].stdout),
                    "health": _json_or_text(runs[1][1].stdout),
                    "health_exit_code": runs[1][1].returncode,
                }
            )
        else:
            click.echo(
                f"prefill-a serves decode-a; decode-b is slow (its rooms sit in Bootstrapping); prefill-b was SIGKILLed "
                f"(a {LEASE_TTL:g} s lease: decode-a's watch failed its rooms), and one more request was sent to it. "
                f"Rooms count as stuck after {STUCK_OLDER_THAN} here (the default is 30s)."
            )
            for command, done in runs:
                click.echo("")
                click.echo("$ kvstatus " + " ".join(command))
                click.echo((done.stdout + done.stderr).rstrip())
                if done.returncode:
                    click.echo(f"(exit code {done.returncode})")
        if serve_port is not None:
            board = _Board(url, scenario.namespace, serve_port)
            board.wait_for_ctrl_c()
    finally:
        if board is not None:
            board.stop()
        scenario.close()


def _json_or_text(text: str) -> object:
    """A command's ``--json`` output: one document, or a list of its JSON lines (``ls``); as text if neither."""
    try:
        return json.loads(text)
    except ValueError:
        pass
    try:
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    except ValueError:
        return text
