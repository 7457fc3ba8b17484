"""The e2e tier's requests and faults: what a client of the router sees, timed from the fault.

A :class:`Deployment` is one prefill and one decode (plugin on or off) plus a fresh router per scenario.
Every wait is bounded: a request that has no answer after its fault's bound (:data:`FAULT_WAIT`,
:data:`DECODE_FAULT_WAIT`) is recorded as timed out at that bound, so a fault that upstream only ends at
its 300 s timeout costs this tier the bound, not 300 s.
"""

from __future__ import annotations

import concurrent.futures
import json
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import redis

from kvstatus.keys import KeySchema, incarnation_field
from kvstatus.replies import stored_int
from tests.e2e import deploy

FAULT_WAIT = 30.0
"""Seconds a client waits for an answer during a prefill fault or a cancel. Issue 21 once saw the decode's
handshake fail at 63 s; since the plugin's leases, kvstatus' errors come within about 15 s of a kill (the 10 s
lease, a look, a poll), and upstream's either by its heartbeat (5–15 s) or not before its 300 s timeouts (a
restart: nothing within 45 s or 75 s in earlier runs), so a longer wait only costs the tier's 10 min budget."""
DECODE_FAULT_WAIT = 30.0
"""Seconds a client waits after the decode dies: upstream answers only at the prefill's 300 s bootstrap timeout
(measured: nothing within 75 s), kvstatus' within about 15 s of the kill (14.0 s at most in the runs of
2026-12-02) or never (a room the decode never wrote), so a longer wait would only cost the tier's budget."""
SERVE_WAIT = 120.0
"""Seconds a client waits for an answer without a fault (a busy 2-core box; about 1 s measured)."""
IN_FLIGHT_DELAY = 0.5
"""Seconds between sending a fault's requests and the SIGKILL: they have reached the servers, not finished
(on a quiet box 24 requests of 300 words were all answered 0.65 s after sending: 1 s missed them all)."""
PROMPT_WORDS = "prefill decode room status bootstrap transfer kv cache redis lease token request router".split()


def prompt(i: int, words: int = 12) -> str:
    """The i-th prompt: a deterministic sentence over the tiny model's corpus words."""
    return " ".join(PROMPT_WORDS[(i * 7 + k * 3) % len(PROMPT_WORDS)] for k in range(words)) + f" {i}."


def generate_body(text: str, max_new_tokens: int) -> dict[str, object]:
    """A ``/generate`` body at temperature 0 (deterministic), generating exactly ``max_new_tokens``."""
    return {"text": text, "sampling_params": {"temperature": 0, "max_new_tokens": max_new_tokens, "ignore_eos": True}}


@dataclass
class Answer:
    """One request's end: HTTP status (0: no HTTP answer), body, and when it ended (monotonic seconds)."""

    index: int
    status: int
    body: object
    sent: float
    ended: float
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.status == 200 and isinstance(self.body, dict) and "text" in self.body

    @property
    def output_ids(self) -> Optional[list[int]]:
        if not self.ok:
            return None
        assert isinstance(self.body, dict)
        ids = self.body.get("output_ids")
        return list(ids) if isinstance(ids, list) else None

    def message(self) -> str:
        """The error the client was shown, whole, on one line."""
        if self.timed_out:
            return "no answer (client timeout)"
        body = self.body
        if isinstance(body, dict):
            error = body.get("error", body)
            if isinstance(error, dict):
                error = error.get("message", error)
            text = str(error)
        else:
            text = str(body)
        return re.sub(r"\s+", " ", text)

    def cause(self) -> str:
        """:meth:`message` without what differs per run (request and room ids, addresses, times) or names no
        cause (which request of which rank), cut at 240 characters (a room's first failure, with its time, fits)."""
        text = re.sub(r" for request rank=\d+ \S*rid='[0-9a-f]+' \S*bootstrap_room=\d+", "", self.message())
        text = re.sub(r"\b\d{6,}\b", "<room>", text)
        text = re.sub(r"\b[0-9a-f]{16,}\b", "<rid>", text)
        text = re.sub(r"127\.0\.0\.1:\d+", "<addr>", text)
        text = re.sub(r"\d{4}-\d\d-\d\dT[\d:.]+Z", "<time>", text)
        return text[:240]


def send_all(url: str, bodies: list[dict[str, object]], timeout: float, workers: Optional[int] = None) -> list[Answer]:
    """POST every body to ``url`` + /generate concurrently; each ends by ``timeout`` seconds at most."""
    return collect(start_all(url, bodies, timeout, workers), timeout)


@dataclass
class InFlight:
    """Requests submitted to a thread pool: the futures, and the pool (shut down by :func:`collect`)."""

    pool: concurrent.futures.ThreadPoolExecutor
    futures: list[concurrent.futures.Future[Answer]] = field(default_factory=list)


def _one(url: str, index: int, body: dict[str, object], timeout: float) -> Answer:
    sent = time.monotonic()
    status, answer = deploy.post_json(url + "/generate", body, timeout)
    ended = time.monotonic()
    timed_out = status == 0 and "timed out" in str(answer).lower()
    return Answer(index, status, answer, sent, ended, timed_out)


def start_all(url: str, bodies: list[dict[str, object]], timeout: float, workers: Optional[int] = None) -> InFlight:
    """Submit every request without waiting for any answer; ``workers`` at a time (default: all of them, so
    that a fault finds every request in flight, none queued behind the ones that hang to the bound)."""
    flight = InFlight(concurrent.futures.ThreadPoolExecutor(max_workers=workers or len(bodies)))
    flight.futures = [flight.pool.submit(_one, url, i, body, timeout) for i, body in enumerate(bodies)]
    return flight


def collect(flight: InFlight, timeout: float) -> list[Answer]:
    """Every answer, in submission order (each request carries its own client timeout)."""
    try:
        return [future.result(timeout=timeout + 30) for future in flight.futures]
    finally:
        flight.pool.shutdown(wait=False, cancel_futures=True)


@dataclass
class FaultResult:
    """One fault in one mode: what each request's client saw, timed from the fault."""

    fault: str
    mode: str
    fault_at: float
    answers: list[Answer]
    bound: float
    note: str = ""

    @property
    def failed(self) -> list[Answer]:
        return [a for a in self.answers if not a.ok]

    def seconds_to_error(self) -> list[float]:
        """For each failed request, seconds from the fault (or from sending, if later) to its error."""
        return sorted(max(0.0, a.ended - max(self.fault_at, a.sent)) for a in self.failed)

    def row(self) -> dict[str, object]:
        """The table row: counts, time to error (first/last), statuses, causes; JSON-friendly."""
        times = self.seconds_to_error()
        timed_out = [a for a in self.failed if a.timed_out]
        statuses = sorted({a.status for a in self.failed if not a.timed_out})
        causes: list[str] = []
        for answer in self.failed:
            if answer.cause() not in causes:
                causes.append(answer.cause())
        return {
            "fault": self.fault,
            "mode": self.mode,
            "sent": len(self.answers),
            "failed": len(self.failed),
            "first_error_s": round(times[0], 1) if times else None,
            "last_error_s": round(times[-1], 1) if times else None,
            "timed_out": len(timed_out),
            "bound_s": self.bound,
            "statuses": statuses,
            "causes": causes[:3],
            "note": self.note,
        }


@dataclass
class Deployment:
    """``shape`` = (prefills, decodes) servers of one mode (kvstatus plugin on or off), each restartable under its
    ports (so its participant name)."""

    settings: deploy.Settings
    mode: str
    shape: tuple[int, int] = (1, 1)
    prefills: list[deploy.Process] = field(default_factory=list)
    decodes: list[deploy.Process] = field(default_factory=list)
    started: list[deploy.Process] = field(default_factory=list)
    startup_s: list[float] = field(default_factory=list)

    @property
    def prefill(self) -> deploy.Process:
        return self.prefills[0]

    @property
    def decode(self) -> deploy.Process:
        return self.decodes[0]

    def start(self, wait: bool = True) -> None:
        """Start every server at once (they take ~30 s each on 2 cores); ``wait``: until all are healthy."""
        self.prefills = [self._track(deploy.start_server(self.settings, "prefill")) for _ in range(self.shape[0])]
        self.decodes = [self._track(deploy.start_server(self.settings, "decode")) for _ in range(self.shape[1])]
        if wait:
            self.wait_all()

    def wait_all(self) -> None:
        """Wait until every server answers /health."""
        began = time.monotonic()
        for process in (*self.prefills, *self.decodes):
            deploy.wait_ready(process, "/health", deploy.SERVER_READY_TIMEOUT)
        self.startup_s.append(time.monotonic() - began)

    def restart(self, role: str, wait: bool = True, index: int = 0) -> deploy.Process:
        """Start ``role``'s ``index``-th server again on its previous ports: the same participant name, a new
        incarnation."""
        servers = self.prefills if role == "prefill" else self.decodes
        old = servers[index]
        old.stop()
        new = self._track(deploy.start_server(self.settings, role, old.port, old.extra.get("bootstrap_port")))
        servers[index] = new
        if wait:
            self.wait(new)
        return new

    def wait(self, process: deploy.Process) -> None:
        began = time.monotonic()
        deploy.wait_ready(process, "/health", deploy.SERVER_READY_TIMEOUT)
        self.startup_s.append(time.monotonic() - began)

    def router(self, *extra: str) -> deploy.Process:
        """A fresh router in front of every server (after a prefill dies, an old router's circuit for it stays
        open); ``extra``: its options."""
        router = self._track(deploy.start_router(self.settings, self.prefills, self.decodes, extra))
        deploy.wait_ready(router, "/readiness", deploy.ROUTER_READY_TIMEOUT)
        return router

    def _track(self, process: deploy.Process) -> deploy.Process:
        self.started.append(process)
        return process

    def stop(self) -> None:
        """Stop every process this deployment ever started (each by its own PIDs)."""
        for process in reversed(self.started):
            process.stop()


NAMESPACE = "sglang"
"""The namespace every deployment of the tier writes to (the plugin's default)."""


def settings(
    mode: str, model: Path, logs: Path, redis_url: str, decode_tokens: int = deploy.POOL_TOKENS
) -> deploy.Settings:
    """The servers' settings in ``mode`` (kvstatus: the plugin on, at ``redis_url``; upstream: off), logging to
    ``logs``/``mode``; ``decode_tokens``: each decode's KV pool."""
    url = redis_url if mode == "kvstatus" else None
    return deploy.Settings(sys.executable, model, logs / mode, url, NAMESPACE, decode_tokens)


def running(
    mode: str,
    model: Path,
    logs: Path,
    redis_url: str,
    shape: tuple[int, int] = (1, 1),
    decode_tokens: int = deploy.POOL_TOKENS,
) -> Iterator[Deployment]:
    """A started deployment of ``shape`` in ``mode``, stopped when the generator closes (a fixture's body)."""
    dep = Deployment(settings(mode, model, logs, redis_url, decode_tokens), mode, shape)
    try:
        dep.start()
        yield dep
    finally:
        dep.stop()


def fault_bodies(count: int = 32, prompt_words: int = 600, max_new_tokens: int = 64) -> list[dict[str, object]]:
    """Requests that keep the prefill busy: long prompts, about 5 times the tokens its 4096-token pool holds at
    once (about 2 s of prefill on 2 quiet cores, so the fault lands while most are in flight)."""
    return [generate_body(prompt(i, prompt_words), max_new_tokens) for i in range(count)]


PLAIN_ROUTER = ("--disable-retries", "--disable-circuit-breaker")
"""The router options of the kill and cancel scenarios: at its defaults the sglang router sends a failed request
again under a new room (5 retries) and, after 10 failures in 120 s, opens the worker's circuit for 60 s and
answers its own 503 "No available prefill workers"; either way the client sees the router, not what the
servers reported. Without them each client gets the servers' own answer."""


def kill_in_flight(
    dep: Deployment,
    role: str,
    fault: str,
    delay: float,
    after_kill: Optional[Callable[[], None]] = None,
    then_send: Optional[str] = None,
    bound: float = FAULT_WAIT,
) -> list[FaultResult]:
    """Fresh router (:data:`PLAIN_ROUTER`); send :func:`fault_bodies`; SIGKILL ``role``'s process tree ``delay`` s
    later; collect.

    ``after_kill`` runs right after the SIGKILL (a restart). With ``then_send`` (a fault name), a few new
    requests go through the same router right after the SIGKILL too, before its health checks can mark the
    dead server down (a fresh router could not register a dead prefill at all): their result is a second
    :class:`FaultResult`, timed from sending. ``bound``: each client's timeout, in seconds.
    """
    router = dep.router(*PLAIN_ROUTER)
    try:
        flight = start_all(router.url, fault_bodies(), bound)
        time.sleep(delay)
        victim = dep.prefill if role == "prefill" else dep.decode
        fault_at = time.monotonic()
        victim.kill()
        if after_kill is not None:
            after_kill()
        late: Optional[InFlight] = None
        late_at = time.monotonic()
        if then_send is not None:
            late = start_all(router.url, [generate_body(prompt(i), 16) for i in range(4)], bound)
        results = [FaultResult(fault, dep.mode, fault_at, collect(flight, bound), bound)]
        if late is not None and then_send is not None:
            results.append(FaultResult(then_send, dep.mode, late_at, collect(late, bound), bound))
        return results
    finally:
        router.stop()


CANCEL_REASON = "the client went away"
CANCEL_ORIGIN = "router-e2e"


def kvstatus(settings: deploy.Settings, *args: str) -> subprocess.CompletedProcess[str]:
    """The ``kvstatus`` command of the servers' environment, as an operator runs it against their Redis."""
    assert settings.redis_url is not None
    command = [str(Path(settings.python).parent / "kvstatus"), "--url", settings.redis_url]
    return subprocess.run(
        [*command, "--namespace", settings.namespace, *args], capture_output=True, text=True, timeout=60
    )


def open_rooms(settings: deploy.Settings) -> list[int]:
    """The rooms with an entry still open (Bootstrapping, WaitingForInput, Transferring), by ``kvstatus ls --json``."""
    return [room["room"] for room in open_room_rows(settings)]


def open_room_rows(settings: deploy.Settings, by: str = "status") -> list[dict[str, Any]]:
    """:func:`open_rooms` as their ``ls --json`` lines. ``by="reads"`` keeps only the rooms whose reads still
    answer open for some participant: an open entry in a room that failed reads Failed (shared fate), so no
    engine waits on it, and it ends with its TTL."""
    listed = kvstatus(settings, "ls", "--json")
    assert listed.returncode == 0, listed.stderr
    rooms = [json.loads(line) for line in listed.stdout.splitlines() if line.strip()]
    return [room for room in rooms if any(entry[by] in OPEN_NAMES for entry in room["participants"].values())]


OPEN_NAMES = ("Bootstrapping", "WaitingForInput", "Transferring")


def waited_room_rows(settings: deploy.Settings) -> list[dict[str, Any]]:
    """:func:`open_room_rows` by reads, less the rooms whose every open entry was written by an incarnation older
    than the one that holds its participant's lease now: a server killed and restarted under its name starts with
    an empty dict, so no engine waits on such a room. The peer watch fails a dead peer's entries in the rooms a
    live store opened (:mod:`kvstatus.peerwatch`); a room that only the dead one opened ends with its TTL. An
    entry without a stamp, or a participant without a newer lease, keeps its room here."""
    assert settings.redis_url is not None
    client = redis.Redis.from_url(settings.redis_url)
    schema = KeySchema(settings.namespace)
    try:

        def waited(room: int, name: str) -> bool:
            written = stored_int(client.hget(schema.room_key(room), incarnation_field(name)))
            holder = stored_int(client.hget(schema.lease_key(name), "epoch"))
            return written is None or holder is None or written >= holder

        return [
            row
            for row in open_room_rows(settings, by="reads")
            if any(
                entry["reads"] in OPEN_NAMES and waited(row["room"], name)
                for name, entry in row["participants"].items()
            )
        ]
    finally:
        client.close()


def cancel_in_flight(
    dep: Deployment, fault: str, delay: float, retries: bool, bound: float = FAULT_WAIT
) -> FaultResult:
    """Fresh router; send :func:`fault_bodies`; ``delay`` s later ``kvstatus cancel`` every room still open, as
    a router or an operator would when its clients go away; collect. Needs the plugin on (the rooms in Redis).

    ``retries`` False starts the router as one that cancels would run (:data:`PLAIN_ROUTER`): at its defaults it
    sends a request whose room failed again, under a new room, so the client never sees the cancel, and the
    cancel's failures count against the prefill's circuit breaker."""
    router = dep.router() if retries else dep.router(*PLAIN_ROUTER)
    try:
        flight = start_all(router.url, fault_bodies(), bound)
        time.sleep(delay)
        deadline = time.monotonic() + bound / 2
        rooms = open_rooms(dep.settings)
        while not rooms and time.monotonic() < deadline:  # a busy box: the first rooms may open later
            time.sleep(0.2)
            rooms = open_rooms(dep.settings)
        assert rooms, f"no room opened within {bound / 2:.0f} s of sending {len(flight.futures)} requests"
        fault_at = time.monotonic()
        done = kvstatus(
            dep.settings, "cancel", *map(str, rooms), "--reason", CANCEL_REASON, "--origin", CANCEL_ORIGIN, "--json"
        )
        # Exit 7: a room listed open was served in full before the cancel reached it (ALREADY_SERVED, left as it is).
        assert done.returncode in (0, 7), done.stdout + done.stderr
        outcomes = [r["outcome"] for r in json.loads(done.stdout)["rooms"]]
        assert (done.returncode == 7) == ("ALREADY_SERVED" in outcomes), done.stdout + done.stderr
        note = (
            f"{outcomes.count('CANCELLED')} of {len(rooms)} open rooms cancelled (the others had failed, or were "
            "served before the cancel reached them)"
        )
        return FaultResult(fault, dep.mode, fault_at, collect(flight, bound), bound, note)
    finally:
        router.stop()
