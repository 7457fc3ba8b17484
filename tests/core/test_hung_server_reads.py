"""A hung (SIGSTOPped) Redis against the newer read paths: each gives up at its deadline, with a clear error.

With ``?deadline=1`` in the URL, against a server stopped after rooms were written (stuck ones, timelines):

1. the CLI's ``ls --stuck`` (with ``--older-than``), ``stats``, ``health``, ``get ROOM``, ``sweep``,
   ``participants``, ``cancel``, ``doctor`` and ``functions list|load`` exit 1 (what
   docs/cli.md documents for an unreachable server) with the one-line "Redis unavailable" error and its hint,
   no traceback, within the deadline plus :data:`SLACK`, in-process and as the subprocess an operator runs;
2. the board's ``/api/stuck`` and ``/api/pairs`` answer 503 within as long, and the exporter's health pass
   gives up as promptly: ``kvstatus_up`` 0 and ``/ready`` 503 "Redis did not answer the last read";
3. ``update_status`` of a store with ``timeline=True``, sync and async, raises
   ``BackendUnavailableError`` within the deadline.

Before the fix (kvstatus.admin.reads.round_trip): every SCAN, ``TIME`` and pipelined read of the admin reads waited 6 sends
x the 5 s socket timeout + 3.1 s backoff (33 s) whatever ``?deadline=`` said: ``ls --stuck``, ``stats`` and
``health`` still hung after 40 s, the board's requests had no answer within 30 s, the exporter said up and
ready for 33 s; ``get`` took 5 s, as the CLI's store ignored the URL's deadline (the 5 s default). The bounds asserted are behaviour bounds,
several times wider than measured (in each test's docstring), never speed benchmarks.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import pytest

from kvstatus import AsyncStatusStore, BackendUnavailableError, KVPoll, StatusStore
from kvstatus.admin.reads import server_ms
from kvstatus.connection import connect
from kvstatus.keys import KeySchema
from tests.helpers.backends import fresh_namespace
from tests.helpers.cli import assert_clean_failure, invoke, run_cli
from tests.helpers.tiers import require_redis_server
from tests.helpers.timing import slack
from tests.observe.support import ServerProcess, sample, scrape, wait_until
from tests.servers import RedisServer

pytestmark = pytest.mark.real

DEADLINE = 1.0  # seconds: the URL's ?deadline=
SLACK = 2.0  # seconds a call may outlast its deadline in-process (measured: < 0.02 s)
STARTUP = 8.0  # seconds more for a fresh interpreter (measured: 0.8 s to start and import kvstatus)
UNAVAILABLE = "Redis unavailable"
HINT = "Check --url / KVSTATUS_URL and that Redis is running"


@dataclass
class Hung:
    """The module's server, and a populated namespace on it."""

    server: RedisServer
    namespace: str

    @property
    def url(self) -> str:
        return f"{self.server.url}?deadline={DEADLINE:g}"

    @contextmanager
    def stopped(self) -> Iterator[None]:
        os.kill(self.server.pid, signal.SIGSTOP)
        try:
            yield
        finally:
            os.kill(self.server.pid, signal.SIGCONT)


def _populate(raw: Any, namespace: str) -> None:
    """Room 1 stuck 61 s (decode-0 waits, prefill-0 transfers; timelines written by hand with old times), room 2
    moving (timeline stores), room 3 done, room 4 failed: a prefill-decode pair with every kind of room."""
    schema, now = KeySchema(namespace), server_ms(raw)
    key = schema.room_key(1)
    raw.hset(key, mapping={"decode-0": 2, "t:decode-0": f"2@{now - 61_000}", "prefill-0": 3})
    raw.hset(key, "t:prefill-0", f"1@{now - 65_000} 3+4000")
    raw.pexpire(key, 600_000)
    prefill, decode = (
        StatusStore(raw, namespace=namespace, participant=p, timeline=True) for p in ("prefill-0", "decode-0")
    )
    for room, steps in {2: (1, 3), 3: (1, 3, 4), 4: (1, 3)}.items():
        for status in steps:
            prefill.update_status(room, KVPoll(status))
        decode.update_status(room, KVPoll.WaitingForInput)
    decode.update_status(3, KVPoll.Success)
    prefill.record_failure(4, "NIXL transfer timed out")
    prefill.update_status(4, KVPoll.Failed)


@pytest.fixture(scope="module")
def own_server() -> Iterator[RedisServer]:
    """This module's own server: the tests stop it, so never the session's."""
    require_redis_server()
    with RedisServer() as server:
        yield server


@pytest.fixture
def hung(own_server: RedisServer) -> Iterator[Hung]:
    """A namespace populated for each test: the rooms' ages, which decide what is stuck, start afresh."""
    namespace = fresh_namespace("hungread")
    raw = own_server.client()
    _populate(raw, namespace)
    yield Hung(own_server, namespace)
    raw.close()


def _timed(call: Callable[[], Any]) -> tuple[float, Any]:
    started = time.monotonic()
    try:
        result = call()
    except Exception as exc:  # noqa: BLE001 - returned to the test
        result = exc
    return time.monotonic() - started, result


# -- 1. the CLI ------------------------------------------------------------------------------------------

CLI_READS = {  # name: (arguments, what it prints while Redis answers)
    "ls --stuck": (("ls", "--stuck"), "HOLDER"),
    "ls --stuck --older-than": (("ls", "--stuck", "--older-than", "45s", "--json"), '"room": 1, "holder": "decode-0"'),
    "stats": (("stats",), "rooms stuck for 30 s or more (by their timelines): 1"),
    "health": (("health", "--json"), '"stuck": 1'),
    "get with timelines": (("get", "1", "2"), "room 2: timeline, since the room's first step"),
    "sweep": (("sweep",), "nothing to sweep"),
    "participants": (("participants",), "no participant holds or held a lease"),
    "cancel": (("cancel", "2", "--reason", "the client went away"), "room 2: cancelled"),
}


@pytest.mark.parametrize(("args", "answer"), list(CLI_READS.values()), ids=list(CLI_READS))
def test_a_cli_read_against_a_hung_server_exits_1_at_its_deadline(
    hung: Hung, args: tuple[str, ...], answer: str
) -> None:
    """In-process (CliRunner, the real client). Measured: 1.006-1.014 s each (before: ls, stats and health still
    hung when pytest-timeout stopped them at 50 s; get 5.01 s, the CLI's store ignoring the URL's deadline)."""
    run = lambda: invoke(connect, "--namespace", hung.namespace, *args, env={"KVSTATUS_URL": hung.url})  # noqa: E731
    served = run()
    assert served.exit_code == 0 and answer in served.output, served.output
    with hung.stopped():
        took, done = _timed(run)
    assert not isinstance(done, Exception), done  # an exception out of the CLI would be a traceback
    assert_clean_failure(done.output, done.exit_code, 1, f"Error: {UNAVAILABLE}", HINT)
    assert len(done.output.strip().splitlines()) == 2, done.output  # the error line and its hint
    assert took < DEADLINE + slack(SLACK), took


@pytest.mark.parametrize("name", ["ls --stuck --older-than", "health"])
def test_the_cli_as_an_operator_runs_it_against_a_hung_server(hung: Hung, name: str) -> None:
    """``python -m kvstatus.cli`` in a subprocess, as a script runs it. Measured: 1.66-1.88 s (0.8 s of it the
    interpreter's start; before: still running when killed at 39 s)."""
    env = {"KVSTATUS_URL": hung.url, "KVSTATUS_NAMESPACE": hung.namespace}
    with hung.stopped():
        took, done = _timed(lambda: run_cli(*CLI_READS[name][0], env=env, timeout=DEADLINE + STARTUP + 30))
    assert isinstance(done, subprocess.CompletedProcess), done  # TimeoutExpired: it hung
    assert_clean_failure(done.stdout + done.stderr, done.returncode, 1, f"Error: {UNAVAILABLE}", HINT)
    assert done.stdout == "" and len(done.stderr.strip().splitlines()) == 2, done.stderr
    assert took < DEADLINE + slack(STARTUP), took


@pytest.mark.parametrize(
    ("args", "shown"),
    [
        (("doctor",), "fail  connectivity         Redis unavailable"),
        (("doctor", "--json"), '"check": "connectivity", "ok": false, "verdict": "fail", "detail": "Redis unavailable'),
        (("functions", "list"), f"Error: {UNAVAILABLE}"),
        (("functions", "load"), f"Error: {UNAVAILABLE}"),
    ],
    ids=["doctor", "doctor --json", "functions list", "functions load"],
)
def test_the_doctor_and_the_function_tools_against_a_hung_server_exit_1_at_the_deadline(
    hung: Hung, args: tuple[str, ...], shown: str
) -> None:
    """Measured 1.34-1.44 s as subprocesses (before: still running when killed at 60 s; the doctor's ping and
    the FUNCTION calls ran outside the admin deadline)."""
    env = {"KVSTATUS_URL": hung.url, "KVSTATUS_NAMESPACE": hung.namespace}
    with hung.stopped():
        took, done = _timed(lambda: run_cli(*args, env=env, timeout=DEADLINE + STARTUP + 30))
    assert isinstance(done, subprocess.CompletedProcess), done  # TimeoutExpired: it hung
    assert done.returncode == 1, (done.returncode, done.stdout, done.stderr)
    assert shown in done.stdout + done.stderr, done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    assert took < DEADLINE + slack(STARTUP), took


# -- 2. the board and the exporter ----------------------------------------------------------------------


def _http(url: str, timeout: float = 30) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_the_boards_stuck_and_pairs_answer_503_at_the_deadline(hung: Hung) -> None:
    """``kvstatus serve``: a request whose read meets the hung server answers 503 naming the error. Measured:
    1.006 s each (before: no answer in 30 s); the board answers again once Redis does."""
    with ServerProcess("--url", hung.url, "--namespace", hung.namespace, "serve", "--port", "0") as board:
        stuck, pairs = board.base + "/api/stuck", board.base + "/api/pairs"
        code, text = _http(stuck)
        assert code == 200 and [r["room"] for r in json.loads(text)["stuck"]] == [1], text
        code, text = _http(pairs)
        assert code == 200 and {(p["prefill"], p["decode"]) for p in json.loads(text)["pairs"]} == {
            ("prefill-0", "decode-0")
        }, text
        with hung.stopped():
            answers = {url: _timed(lambda: _http(url)) for url in (stuck, pairs)}  # noqa: B023 - used at once
        for url, (took, (code, text)) in answers.items():
            assert code == 503 and "BackendUnavailableError" in text and UNAVAILABLE in text, (url, code, text)
            assert took < DEADLINE + slack(SLACK), (url, took)
        assert _http(stuck)[0] == 200
        assert board.terminate() == 0
        assert "Traceback" not in board.output


def test_the_exporters_health_pass_gives_up_at_the_deadline(hung: Hung) -> None:
    """``kvstatus exporter`` (every pass judges the pairs): stopped mid-loop, its pass fails within the deadline
    and the next scrape says so. Measured: 1.26-1.29 s to ``kvstatus_up`` 0 and /ready 503 (before: 33.4 s,
    up and ready meanwhile, until the first round trip failed); scrapes answer at once throughout."""
    interval = 0.3
    args = ("--url", hung.url, "--namespace", hung.namespace, "exporter", "--port", "0", "--interval", f"{interval}")
    with ServerProcess(*args) as exporter:
        metrics, ready = exporter.base + "/metrics", exporter.base + "/ready"
        pair = {"namespace": hung.namespace, "prefill": "prefill-0", "decode": "decode-0"}
        wait_until(lambda: sample(scrape(metrics), "kvstatus_pair_stuck_rooms", **pair) == 1, 30, "a health pass")
        assert sample(scrape(metrics), "kvstatus_up", namespace=hung.namespace) == 1

        def down() -> bool:
            code, text = _http(ready, timeout=DEADLINE)  # a scrape never waits for Redis
            return sample(scrape(metrics), "kvstatus_up", namespace=hung.namespace) == 0 and (
                code == 503 and "Redis did not answer the last read" in text
            )

        with hung.stopped():
            started = time.monotonic()
            wait_until(down, 60, "the exporter to report Redis down")
            took = time.monotonic() - started
        assert took < interval + DEADLINE + slack(SLACK), took
        wait_until(lambda: sample(scrape(metrics), "kvstatus_up", namespace=hung.namespace) == 1, 30, "up again")
        assert exporter.terminate() == 0
        assert "Traceback" not in exporter.output and "pass failed" in exporter.output


# -- 3. the update path with timelines ------------------------------------------------------------------


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_a_timeline_update_against_a_hung_server_raises_at_its_deadline(hung: Hung, asynchronous: bool) -> None:
    """``timeline=True``: the update script also writes the entry's timeline. Measured: 1.002-1.003 s, sync and async (no defect here);
    the write, unknown to the caller, is applied (timeline step included) when the server wakes up."""
    room = 10 + asynchronous
    loop = asyncio.new_event_loop()
    store: Any = (AsyncStatusStore if asynchronous else StatusStore).from_url(
        hung.url, namespace=hung.namespace, participant="prefill-1", timeline=True
    )
    assert store.timeline

    def call(status: KVPoll) -> Any:
        result = store.update_status(room, status)
        return loop.run_until_complete(result) if asynchronous else result

    try:
        call(KVPoll.Bootstrapping)  # connected, the script loaded, before the server hangs
        with hung.stopped():
            took, error = _timed(lambda: call(KVPoll.Transferring))
        assert isinstance(error, BackendUnavailableError), error
        assert "may or may not have been applied" in str(error)
        assert took < DEADLINE + slack(SLACK), took
        reader = StatusStore.from_url(hung.server.url, namespace=hung.namespace)
        steps = wait_until(lambda: [s.status for s in reader.room(room).timelines.get("prefill-1", ())][1:], 10)
        assert steps == [KVPoll.Transferring]
        reader.close()
    finally:
        closed = store.close()
        if asynchronous:
            loop.run_until_complete(closed)
        loop.close()
