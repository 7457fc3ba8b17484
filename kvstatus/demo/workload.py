"""``kvstatus demo``: a PD cluster simulated on one machine, run against kvstatus and two baselines.

P prefill and D decode worker *processes* share one namespace. Each worker is
one participant (``prefill-0``, ``decode-1``, ...) and runs request lifecycles
as SGLang's KV managers do: poll the room, Bootstrapping -> WaitingForInput ->
Transferring -> Success, then clear. Room ids come from a small pool per
worker, so they are reused, and prefill-i and decode-i share a pool, so a room
holds both sides. A share of requests is aborted; an abort is delivered by
another worker process (as SGLang's abort() / heartbeat threads deliver them),
either while the request runs or after the owner already cleared the room:
the late-abort race.

Implementations (same workload, same seed):

- ``kvstatus``: the store's atomic Lua rule.
- ``client-side`` and ``pre-fix``: the baselines of :mod:`kvstatus.demo.baselines`,
  the fixed rule as a client-side read-then-write, and the rule before the
  upstream fix (an abort writes Failed unconditionally).
- ``sglang-map``: the store driven through :class:`kvstatus.sglang.RoomStatusMap`,
  the ``request_status`` mapping an SGLang KV manager gets from
  :func:`kvstatus.sglang.install` (``in``/``get`` reads, rule-applying writes,
  ``pop(room, None)`` on clear, as the managers do; sglang is not needed).

Measured per implementation: requests; resurrected rooms (abort writes that
re-created a participant's cleared entry, from the write's own reply);
stale-status requests (a request whose first poll found a status left by an
earlier request on the room); leaked keys and keys without TTL left in the
namespace after every worker finished; updates/s (status writes per second of
wall time, all workers together).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import queue
import random
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterator, NamedTuple, Optional

import redis

from kvstatus._sync.store import StatusStore
from kvstatus.admin.reads import iter_room_keys
from kvstatus.connection import connect
from kvstatus.demo.baselines import BASELINES, ClientSideStore, PreFixStore
from kvstatus.demo.server import EmbeddedServer, find_redis_server, free_port
from kvstatus.keys import TOMBSTONE_SUFFIX, KeySchema
from kvstatus.model import KVPoll, Outcome
from kvstatus.sglang.mapping import RoomStatusMap
from kvstatus.translate import translate_error
from kvstatus.url import CLUSTER_SCHEMES, parse_url

IMPLEMENTATIONS = ("kvstatus", "client-side", "sglang-map", "pre-fix")
assert set(IMPLEMENTATIONS) == {"kvstatus", "sglang-map", *BASELINES}
# fakeredis serves every worker from one Python thread, far slower than redis-server; the default
# size on it is cut so that a default run stays short.
FAKEREDIS_DEFAULT_REQUESTS = 300
LIFECYCLE = (KVPoll.Bootstrapping, KVPoll.WaitingForInput, KVPoll.Transferring, KVPoll.Success)
ABORT_WAIT_SECONDS = 1.0
DRAIN_TIMEOUT_SECONDS = 60.0
WORKER_JOIN_SECONDS = 120.0


@dataclass(frozen=True)
class DemoConfig:
    """Size and randomness of one run. ``requests`` is per worker; ``rooms`` per pool; rates in [0, 1]."""

    prefill: int = 2
    decode: int = 2
    requests: int = 1500
    rooms: int = 8
    abort_rate: float = 0.2
    late_abort_share: float = 0.5
    seed: int = 1
    ttl: float = 600.0

    def __post_init__(self) -> None:
        for name in ("prefill", "decode", "requests", "rooms"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, not {getattr(self, name)}")
        for name in ("abort_rate", "late_abort_share"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} must be in [0, 1], not {getattr(self, name)}")

    @property
    def workers(self) -> list[str]:
        return [f"prefill-{i}" for i in range(self.prefill)] + [f"decode-{i}" for i in range(self.decode)]


@dataclass
class DemoResult:
    """One implementation's row of the table."""

    implementation: str
    requests: int
    aborts: int
    resurrected: int
    stale: int
    leaked_keys: int
    keys_without_ttl: int
    updates: int
    seconds: float

    @property
    def updates_per_second(self) -> float:
        return self.updates / self.seconds if self.seconds > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "updates_per_second": round(self.updates_per_second)}


# -- the three implementations, as each worker process sees them


def make_store(implementation: str, client: Any, namespace: str, **settings: Any) -> Any:
    """A store of ``implementation`` ("kvstatus" or one of :data:`~kvstatus.demo.baselines.BASELINES`) with
    StatusStore's settings (``race_window``: the client-side baseline's only)."""
    if implementation == "client-side":
        return ClientSideStore(client, namespace, **settings)
    settings.pop("race_window", None)
    if implementation == "kvstatus":
        return StatusStore(client, namespace=namespace, **settings)
    if implementation == "pre-fix":
        return PreFixStore(StatusStore(client, namespace=namespace, **settings))
    raise ValueError(f"unknown implementation {implementation!r}: expected kvstatus or one of {BASELINES}")


class _Participants:
    """One implementation's stores (kvstatus or a baseline of :mod:`kvstatus.demo.baselines`), per participant."""

    def __init__(self, implementation: str, client: redis.Redis, namespace: str, ttl: float) -> None:
        base = "kvstatus" if implementation == "sglang-map" else implementation
        make = lambda participant: make_store(base, client, namespace, participant=participant, ttl=ttl)  # noqa: E731
        # sglang-map: the kvstatus store behind the request_status mapping kvstatus.sglang gives a KV manager
        self._make = (lambda participant: RoomStatusMap(make(participant))) if base != implementation else make
        self._stores: dict[str, Any] = {}

    def store(self, participant: str) -> Any:
        if participant not in self._stores:
            self._stores[participant] = self._make(participant)
        return self._stores[participant]

    def get(self, room: int, participant: str) -> Optional[KVPoll]:
        store = self.store(participant)
        if isinstance(store, RoomStatusMap):  # as a KV manager polls: `room in request_status`, then a read
            return store[room] if room in store else None
        return store.get(room)

    def update(self, room: int, status: KVPoll, participant: str) -> bool:
        """Apply ``status``; True if the write created the participant's entry."""
        return self.store(participant).update_status(room, status).outcome is Outcome.CREATED

    def clear(self, room: int, participant: str) -> None:
        store = self.store(participant)
        if isinstance(store, RoomStatusMap):
            store.pop(room, None)  # a KV sender's / receiver's clear()
        else:
            store.clear(room)


# -- one worker process


@dataclass
class _Counts:
    requests: int = 0
    aborts: int = 0
    resurrected: int = 0
    stale: int = 0
    updates: int = 0


class _Worker:
    def __init__(
        self,
        url: str,
        namespace: str,
        implementation: str,
        config: DemoConfig,
        index: int,
        inboxes: list[Any],
        progress: Any,
    ) -> None:
        self.name = config.workers[index]
        self.index = index
        self.config = config
        self.inboxes = inboxes
        self.progress = progress
        self.impl = _Participants(implementation, connect(url), namespace, config.ttl)
        self.rng = random.Random(config.seed * 1_000_003 + index)
        pool = index if index < config.prefill else index - config.prefill
        self.rooms = [1_000_000 * (pool + 1) + i for i in range(config.rooms)]
        self.counts = _Counts()
        self.done_from: set[int] = set()

    def run(self) -> _Counts:
        for n in range(self.config.requests):
            self.request(self.rooms[n % len(self.rooms)])
            with self.progress.get_lock():
                self.progress.value += 1
        for i, inbox in enumerate(self.inboxes):
            if i != self.index:
                inbox.put(("done", self.index, None))
        deadline = time.monotonic() + DRAIN_TIMEOUT_SECONDS
        while len(self.done_from) < len(self.inboxes) - 1 and time.monotonic() < deadline:
            self.deliver(block=True)
        return self.counts

    def request(self, room: int) -> None:
        """One request lifecycle on ``room``, maybe aborted by another process."""
        counts, rng = self.counts, self.rng
        self.deliver()
        counts.requests += 1
        if self.impl.get(room, self.name) is not None:
            counts.stale += 1
        abort_at = rng.randrange(1, len(LIFECYCLE)) if rng.random() < self.config.abort_rate else None
        late = rng.random() < self.config.late_abort_share
        for step, status in enumerate(LIFECYCLE):
            if step == abort_at and not late:
                self.send_abort(room)
                self.wait_for_failed(room)
                break
            self.impl.update(room, status, self.name)
            counts.updates += 1
            self.deliver()
        self.impl.clear(room, self.name)
        if abort_at is not None and late:
            self.send_abort(room)

    def send_abort(self, room: int) -> None:
        self.counts.aborts += 1
        peer = self.rng.choice([i for i in range(len(self.inboxes)) if i != self.index])
        self.inboxes[peer].put(("abort", room, self.name))

    def wait_for_failed(self, room: int) -> None:
        deadline = time.monotonic() + ABORT_WAIT_SECONDS
        while time.monotonic() < deadline and self.impl.get(room, self.name) != KVPoll.Failed:
            self.deliver()
            time.sleep(0.0002)

    def deliver(self, block: bool = False) -> None:
        """Apply the aborts other workers sent here, as the owner's abort thread would."""
        inbox = self.inboxes[self.index]
        while True:
            try:
                kind, value, participant = inbox.get(timeout=0.05) if block else inbox.get_nowait()
            except queue.Empty:
                return
            block = False
            if kind == "done":
                self.done_from.add(value)
                continue
            if self.impl.update(value, KVPoll.Failed, participant):
                self.counts.resurrected += 1
            self.counts.updates += 1


def _worker_main(
    url: str,
    namespace: str,
    implementation: str,
    config: DemoConfig,
    index: int,
    inboxes: list[Any],
    progress: Any,
    results: Any,
) -> None:
    try:
        counts = _Worker(url, namespace, implementation, config, index, inboxes, progress).run()
        results.put((index, asdict(counts), None))
    except Exception as exc:  # noqa: BLE001 - reported by the parent, which owns the terminal
        results.put((index, None, str(translate_error(exc))))


# -- the run


ProgressCallback = Callable[[str, int, int], None]
"""Called as ``progress(implementation, requests_done, requests_total)``."""


class DemoError(RuntimeError):
    """A worker failed or did not finish; the message says which and why."""


def namespace_keys(client: redis.Redis, schema: KeySchema) -> tuple[int, int]:
    """(keys, keys without TTL) of ``schema``'s namespace."""
    total = without_ttl = 0
    for keys in iter_room_keys(client, schema):
        with client.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.pttl(key)
            ttls = pipe.execute()
        total += len(keys)
        without_ttl += sum(1 for t in ttls if t == -1)
    return total, without_ttl


def delete_namespace(client: redis.Redis, schema: KeySchema) -> None:
    for keys in iter_room_keys(client, schema):
        client.unlink(*keys)
    # clear()'s tombstones (<room key>:t, their own short TTL): the demo leaves nothing behind.
    for key in client.scan_iter(match=schema.scan_pattern + TOMBSTONE_SUFFIX, count=500):
        client.unlink(key)


def run_one(
    url: str, namespace: str, implementation: str, config: DemoConfig, progress: Optional[ProgressCallback] = None
) -> DemoResult:
    """Run the workload with ``implementation`` in ``namespace`` (emptied before and after)."""
    ctx = multiprocessing.get_context("fork")
    client = connect(url)
    schema = KeySchema(namespace)
    delete_namespace(client, schema)
    inboxes = [ctx.Queue() for _ in config.workers]
    done = ctx.Value("i", 0)
    results = ctx.Queue()
    total = config.requests * len(config.workers)
    started = time.perf_counter()
    procs = [
        ctx.Process(
            target=_worker_main, args=(url, namespace, implementation, config, i, inboxes, done, results), daemon=True
        )
        for i in range(len(config.workers))
    ]
    try:
        for proc in procs:
            proc.start()
        reports: dict[int, Any] = {}
        deadline = time.monotonic() + WORKER_JOIN_SECONDS
        while len(reports) < len(procs) and time.monotonic() < deadline:
            if progress is not None:
                progress(implementation, done.value, total)
            try:
                index, counts, error = results.get(timeout=0.1)
            except queue.Empty:
                if any(p.exitcode not in (None, 0) for p in procs):
                    raise DemoError(f"a worker of the {implementation} run died") from None
                continue
            if error is not None:
                raise DemoError(f"worker {config.workers[index]} of the {implementation} run failed: {error}")
            reports[index] = counts
        seconds = time.perf_counter() - started
        if len(reports) < len(procs):
            raise DemoError(f"the {implementation} run did not finish within {WORKER_JOIN_SECONDS:g} s")
        if progress is not None:
            progress(implementation, total, total)
        leaked, without_ttl = namespace_keys(client, schema)
        summed = _Counts()
        for counts in reports.values():
            for name, value in counts.items():
                setattr(summed, name, getattr(summed, name) + value)
        return DemoResult(
            implementation,
            summed.requests,
            summed.aborts,
            summed.resurrected,
            summed.stale,
            leaked,
            without_ttl,
            summed.updates,
            seconds,
        )
    finally:
        for proc in procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
                proc.join()
        delete_namespace(client, schema)
        client.close()


def run_demo(
    url: str,
    namespace: str,
    config: DemoConfig,
    progress: Optional[ProgressCallback] = None,
    implementations: tuple[str, ...] = IMPLEMENTATIONS,
) -> list[DemoResult]:
    """Run the same workload against each implementation, one after the other, in ``namespace``-<impl>."""
    if parse_url(url).scheme in CLUSTER_SCHEMES:
        raise DemoError(
            "the demo runs on one Redis (redis://, rediss://, unix:// or a Sentinel URL), not a cluster: "
            "its cleanup unlinks keys of many slots at once"
        )
    return [run_one(url, f"{namespace}-{impl}", impl, config, progress) for impl in implementations]


class EmbeddedRedis(NamedTuple):
    """A throwaway server for the demo: its URL, a sentence saying what it is, and whether it is fakeredis."""

    url: str
    description: str
    fake: bool


@contextlib.contextmanager
def embedded_redis() -> Iterator[EmbeddedRedis]:
    """A throwaway server: redis-server if on PATH, else fakeredis' TCP server (a thread of this process).

    Both listen on a free loopback port and are stopped on exit.
    """
    binary = find_redis_server()
    if binary is not None:
        with EmbeddedServer() as server:
            yield EmbeddedRedis(server.url, f"embedded redis-server ({binary}) on {server.host}:{server.port}", False)
        return
    try:
        from fakeredis import TcpFakeServer

        from kvstatus.demo.fakelua import accept_script_shebang
    except ImportError:
        raise DemoError(
            "no Redis to run on: redis-server is not on PATH and fakeredis is not installed; "
            "install redis-server (Debian: apt-get install redis-server), or in a kvstatus checkout "
            "pip install '.[fake]', "
            "or pass --url"
        ) from None
    accept_script_shebang()
    port = free_port()
    fake = TcpFakeServer(("127.0.0.1", port))
    thread = threading.Thread(target=fake.serve_forever, name="fakeredis-tcp", daemon=True)
    thread.start()
    try:
        yield EmbeddedRedis(
            f"redis://127.0.0.1:{port}/0",
            f"embedded fakeredis TCP server on 127.0.0.1:{port} (redis-server not on PATH)",
            True,
        )
    finally:
        fake.shutdown()
        fake.server_close()
        thread.join(timeout=5)
