"""The e2e tier at cluster shape: faults behind the sglang router at *its* defaults, and the plugin's cost.

A cluster is :data:`SHAPE` servers of one mode (two prefills, two decodes), each with its own participant name on
the plugin's defaults, behind a router started with no option beyond the workers: retries (5, with backoff),
the circuit breaker and cache-aware routing all on. What a client sees is what the router makes of the servers'
answers, so each fault's row counts the requests answered 200 (the router sent a failed one again), the time
each took, the errors, and the requests with no answer at :data:`BOUND`.

The plugin's serving cost runs on two 1+1 pairs started side by side, one with the plugin and one without, the
same requests sent to each in turn (:func:`measure_cost`), so both see the same box.
"""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import os
import signal
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Callable, Optional

from tests.e2e import deploy, scenarios
from tests.e2e.scenarios import Answer, Deployment

SHAPE = (2, 2)
"""Prefills and decodes of one cluster: the smallest shape in which a router has somewhere else to send a request."""
DECODE_TOKENS = 16384
"""A cluster decode's KV pool (tokens), four times a prefill's. After a prefill's death, upstream's decode holds the
pages of each transfer the dead prefill left unfinished for 30 s, waiting for a drain ack that never comes
(``SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT``). On a 4,096-token pool five such rooms filled
three quarters of it, and the requests the router sent there again waited past :data:`BOUND` (docs/e2e.md, "What
a dead prefill's held pages cost"). The 1+1 tier keeps :data:`~tests.e2e.deploy.POOL_TOKENS`: its cancel tests
need rooms that stay open a while."""
BOUND = 30.0
"""Seconds a client waits for its answer (upstream's own timeouts are 300 s: a longer wait only costs the tier)."""
PAUSE = 5.0
"""Seconds a prefill is SIGSTOPped: half the plugin's 10 s lease, a GC pause or a stuck native call."""
DISCONNECT_AFTER = 1.0
"""Seconds a disconnecting client waits before it closes its connection (its requests are on the servers)."""
ROUNDS = 30
"""Rounds of the cost measure: the box's load comes in bursts, and the paired rounds' median ratio needs many."""
IDLE_WAIT = 60.0
"""Seconds :func:`disconnect` waits for the servers to go idle after the clients left."""


def percentile(values: list[float], share: float) -> float:
    """The ``share`` (0–1) percentile of ``values`` by nearest rank; 0.0 for none."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(share * len(ordered) + 0.5) - 1))]


@dataclass
class ClusterResult:
    """One fault in one mode at cluster shape: every in-flight request's end, and the batch's time unfaulted."""

    fault: str
    mode: str
    answers: list[Answer]
    baseline_p99: float
    bound: float = BOUND
    note: str = ""

    def row(self) -> dict[str, object]:
        """The table row, JSON-friendly: seconds from sending to the answer (a timed-out request counts as the
        bound), the share answered 200, the errors by status with their first causes."""
        seconds = [min(a.ended - a.sent, self.bound) for a in self.answers]
        failed = [a for a in self.answers if not a.ok]
        statuses: dict[str, int] = {}
        causes: list[str] = []
        for answer in failed:
            key = "no answer" if answer.timed_out else str(answer.status)
            statuses[key] = statuses.get(key, 0) + 1
            if not answer.timed_out and answer.cause() not in causes:
                causes.append(answer.cause())
        p99 = percentile(seconds, 0.99)
        return {
            "fault": self.fault,
            "mode": self.mode,
            "sent": len(self.answers),
            "ok": len(self.answers) - len(failed),
            "p50_s": round(percentile(seconds, 0.5), 2),
            "p99_s": round(p99, 2),
            "added_p99_s": round(p99 - self.baseline_p99, 2),
            "errors": statuses,
            "no_answer": sum(1 for a in failed if a.timed_out),
            "bound_s": self.bound,
            "causes": causes[:2],
            "note": self.note,
        }


def unfaulted_p99(dep: Deployment) -> float:
    """Seconds the fault batch takes, p99, with no fault, through a router at its defaults: the base of
    :attr:`ClusterResult.baseline_p99`. Every request must be answered 200."""
    router = dep.router()
    try:
        answers = scenarios.send_all(router.url, scenarios.fault_bodies(), scenarios.SERVE_WAIT)
    finally:
        router.stop()
    failed = [(a.index, a.status, a.cause()) for a in answers if not a.ok]
    assert failed == [], f"{dep.mode}: the unfaulted batch failed: {failed}"
    return percentile([a.ended - a.sent for a in answers], 0.99)


LOOK_BEFORE = 3.0
"""Seconds before :data:`BOUND` at which :func:`in_flight` reads kvstatus' rooms while requests still wait: at the
bound the clients' disconnects have already aborted the rooms they were stuck in."""


def in_flight(dep: Deployment, fault: str, act: Callable[[], None], baseline_p99: float) -> ClusterResult:
    """Fresh router at its defaults; send :func:`scenarios.fault_bodies`; ``act`` (the fault)
    :data:`scenarios.IN_FLIGHT_DELAY` s later; collect every answer within :data:`BOUND`."""
    router = dep.router()
    seen: list[str] = []
    flight = scenarios.start_all(router.url, scenarios.fault_bodies(), BOUND)

    def look() -> None:
        if not all(future.done() for future in flight.futures):
            seen.append(rooms_seen(dep.settings))

    looker = threading.Timer(BOUND - LOOK_BEFORE, look)
    looker.start()
    try:
        time.sleep(scenarios.IN_FLIGHT_DELAY)
        act()
        result = ClusterResult(fault, dep.mode, scenarios.collect(flight, BOUND), baseline_p99)
    finally:
        looker.cancel()
        looker.join()
        router.stop()
    if result.row()["no_answer"]:
        keep_rooms(dep.settings, fault, *seen)
    return result


def rooms_seen(settings: deploy.Settings) -> str:
    """kvstatus' participants and rooms now (``--json``), stamped with the time; empty with the plugin off."""
    if settings.redis_url is None:
        return ""
    listed = [scenarios.kvstatus(settings, *args) for args in (("participants", "--json"), ("ls", "--json"))]
    return f"{time.strftime('%H:%M:%S')}\n" + "\n".join(done.stdout + done.stderr for done in listed)


def keep_rooms(settings: deploy.Settings, fault: str, seen: str = "") -> None:
    """With the plugin on, the rooms and participants as kvstatus saw them (``seen``, read :data:`LOOK_BEFORE` s
    before the bound; else now) when requests had no answer at the bound, next to the servers' logs
    (``no-answer-<fault>.txt``): which side of each stuck room wrote what."""
    seen = seen or rooms_seen(settings)
    if not seen:
        return
    slug = "".join(c if c.isalnum() else "-" for c in fault.lower())[:40]
    (settings.logs / f"no-answer-{slug}.txt").write_text(f"{fault}\n{seen}")


def pause(process: deploy.Process, seconds: float) -> Callable[[], None]:
    """The fault that SIGSTOPs ``process``'s tree and SIGCONTs it ``seconds`` later (from a timer thread)."""

    def act() -> None:
        pids = process.signal_tree(signal.SIGSTOP)

        def resume() -> None:
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass

        threading.Timer(seconds, resume).start()

    return act


def running_requests(process: deploy.Process) -> Optional[int]:
    """The requests a server holds, running or queued, by its ``/v1/loads``; None when it does not answer."""
    try:
        with urllib.request.urlopen(process.url + "/v1/loads", timeout=5) as response:
            loads = json.loads(response.read())
    except (OSError, ValueError):
        return None
    ranks = loads.get("loads", loads) if isinstance(loads, dict) else loads
    total = 0
    for rank in ranks if isinstance(ranks, list) else [ranks]:
        if isinstance(rank, dict):
            total += int(rank.get("num_running_reqs", 0)) + int(rank.get("num_waiting_reqs", 0))
    return total


@dataclass
class DisconnectResult:
    """How long each server went on working after the clients closed their connections, in seconds."""

    mode: str
    busy_s: dict[str, float] = field(default_factory=dict)

    def row(self) -> dict[str, object]:
        return {"mode": self.mode, "busy_s": self.busy_s}


def disconnect(dep: Deployment, requests: int = 8, max_new_tokens: int = 512) -> DisconnectResult:
    """Clients send long requests through a router at its defaults and close their connections
    :data:`DISCONNECT_AFTER` s later; returns, per server, the seconds from the close until it held no request."""
    router = dep.router()
    try:
        parsed = urllib.parse.urlsplit(router.url)
        connections = []
        for i in range(requests):
            body = json.dumps(scenarios.generate_body(scenarios.prompt(i, 300), max_new_tokens))
            connection = http.client.HTTPConnection(parsed.hostname or "127.0.0.1", parsed.port, timeout=BOUND)
            connection.request("POST", "/generate", body, {"Content-Type": "application/json"})
            connections.append(connection)
        time.sleep(DISCONNECT_AFTER)
        for connection in connections:
            connection.close()
        left = time.monotonic()
        servers = {f"{p.name}-{p.port}": p for p in (*dep.prefills, *dep.decodes)}
        result = DisconnectResult(dep.mode)
        while servers and time.monotonic() - left < IDLE_WAIT:
            for name, process in list(servers.items()):
                if running_requests(process) == 0:
                    result.busy_s[name] = round(time.monotonic() - left, 1)
                    del servers[name]
            time.sleep(0.1)
        for name in servers:
            result.busy_s[name] = IDLE_WAIT
        return result
    finally:
        router.stop()


@dataclass
class CostSample:
    """One request of the cost measure: seconds to its first streamed chunk, to its end, and tokens generated."""

    ttft_s: float
    total_s: float
    tokens: int


def stream_one(url: str, body: dict[str, object]) -> CostSample:
    """POST ``body`` with ``stream`` on; time the first ``data:`` chunk (TTFT) and the end."""
    parsed = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parsed.hostname or "127.0.0.1", parsed.port, timeout=scenarios.SERVE_WAIT)
    sent = time.monotonic()
    try:
        connection.request(
            "POST", "/generate", json.dumps({**body, "stream": True}), {"Content-Type": "application/json"}
        )
        response = connection.getresponse()
        assert response.status == 200, f"{response.status}: {response.read()[:300]!r}"
        first: Optional[float] = None
        tokens = 0
        for line in response:
            if not line.startswith(b"data:") or line.strip() == b"data: [DONE]":
                continue
            first = first or time.monotonic()
            chunk = json.loads(line[5:])
            tokens = int(chunk.get("meta_info", {}).get("completion_tokens", tokens))
        assert first is not None, "the stream carried no chunk"
        return CostSample(first - sent, time.monotonic() - sent, tokens)
    finally:
        connection.close()


@dataclass
class CostResult:
    """One mode's side of the cost measure: each round's samples and batch wall time (seconds), in round order
    (the other mode's round of the same index saw the same requests, just before or after)."""

    mode: str
    rounds: list[list[CostSample]] = field(default_factory=list)
    batch_s: list[float] = field(default_factory=list)

    @property
    def samples(self) -> list[CostSample]:
        return [sample for samples in self.rounds for sample in samples]

    def round_throughputs(self) -> list[float]:
        """Tokens generated per second of each round's batch wall time."""
        return [sum(s.tokens for s in samples) / took for samples, took in zip(self.rounds, self.batch_s)]

    def round_ttft_p50s(self) -> list[float]:
        return [percentile([s.ttft_s for s in samples], 0.5) for samples in self.rounds]

    def row(self) -> dict[str, object]:
        ttft = [s.ttft_s for s in self.samples]
        return {
            "mode": self.mode,
            "requests": len(ttft),
            "tokens_per_s": round(sum(s.tokens for s in self.samples) / sum(self.batch_s), 1),
            "ttft_p50_s": round(percentile(ttft, 0.5), 3),
            "ttft_p99_s": round(percentile(ttft, 0.99), 3),
            "round_tokens_per_s": [round(value, 2) for value in self.round_throughputs()],
            "round_ttft_p50_s": [round(value, 4) for value in self.round_ttft_p50s()],
        }


def measure_cost(
    urls: dict[str, str], rounds: int = ROUNDS, batch: int = 8, prompt_words: int = 200, max_new_tokens: int = 32
) -> dict[str, CostResult]:
    """Send the same batch of streamed requests to each mode's router (``urls``: mode → router URL) in turn,
    ``rounds`` times, the order flipped every round; one warm-up round first, not counted. Returns each mode's
    samples."""
    results = {mode: CostResult(mode) for mode in urls}
    modes = list(urls)
    with concurrent.futures.ThreadPoolExecutor(max_workers=batch) as pool:
        for number in range(rounds + 1):
            bodies = [
                scenarios.generate_body(scenarios.prompt(number * batch + i, prompt_words), max_new_tokens)
                for i in range(batch)
            ]
            for mode in modes if number % 2 == 0 else reversed(modes):
                began = time.monotonic()
                samples = list(pool.map(stream_one, [urls[mode]] * len(bodies), bodies))
                if number > 0:
                    results[mode].batch_s.append(time.monotonic() - began)
                    results[mode].rounds.append(samples)
    return results
