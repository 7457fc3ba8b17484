"""The performance measurements, each against its baseline on the same server.

Every function takes the servers/clients it needs and returns
:class:`Measurement` rows (a table line) and :class:`Budget` checks.
Latencies are microseconds; throughputs are keys per second.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import redis

from benchmarks.measure import Block, Summary, interleave, ratio, time_calls
from kvstatus import KVPoll, StatusStore, scripts
from kvstatus.keys import DEFAULT_TTL_SECONDS, MAX_ROOM

NAMESPACE = "bench"
PARTICIPANT = "decode-0"
TTL_MS = int(DEFAULT_TTL_SECONDS * 1000)


@dataclass(frozen=True)
class Measurement:
    """One line of a results table; ``value`` and ``unit`` describe the variant."""

    section: str
    variant: str
    value: float
    unit: str
    p99: Optional[float] = None
    note: str = ""


@dataclass(frozen=True)
class Budget:
    """A budget: ``measured`` compared with ``limit`` by ``op`` ("<=" or ">=")."""

    name: str
    measured: float
    op: str
    limit: float
    unit: str
    detail: str

    @property
    def met(self) -> bool:
        return self.measured <= self.limit if self.op == "<=" else self.measured >= self.limit


@dataclass
class Results:
    rows: list[Measurement] = field(default_factory=list)
    budgets: list[Budget] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Plan:
    """Sizes of one run: samples per latency block, rounds, batch calls per block, live-room levels."""

    samples: int = 2000
    rounds: int = 9
    batches: int = 20
    levels: tuple[int, ...] = (1_000, 100_000, 1_000_000)
    memory_rooms: int = 100_000


class RoomSource:
    """Random 63-bit room ids, like the router's ``bootstrap_room``; never repeats within a run."""

    def __init__(self, seed: int = 5) -> None:
        self._rng = random.Random(seed)
        self._seen: set[int] = set()

    def take(self, n: int) -> list[int]:
        rooms = []
        while len(rooms) < n:
            room = self._rng.randint(0, MAX_ROOM)
            if room not in self._seen:
                self._seen.add(room)
                rooms.append(room)
        return rooms


def _store(client: Any, cls: type = StatusStore, **settings: Any) -> Any:
    return cls(client, namespace=NAMESPACE, participant=PARTICIPANT, **settings)


def _lat(section: str, variant: str, s: Summary, note: str = "") -> Measurement:
    return Measurement(section, variant, s.p50_us, "µs p50", s.p99_us, note)


def _tput(section: str, variant: str, s: Summary, keys: int) -> Measurement:
    return Measurement(
        section,
        variant,
        keys / s.p50_us * 1e6,
        "keys/s",
        s.p99_us,
        f"{keys} keys per call, p50 {s.p50_us:,.0f} µs per call",
    )


def _set_raw_keys(client: Any, tag: str, rooms: list[int]) -> list[str]:
    """String keys ``raw:<tag>:<room>`` holding "3" with the store's TTL: the raw baseline of a read."""
    keys = [f"raw:{tag}:{room}" for room in rooms]
    with client.pipeline(transaction=False) as pipe:
        for key in keys:
            pipe.set(key, "3", px=TTL_MS)
        pipe.execute()
    return keys


EPOCH = 1_796_206_714_867
"""An incarnation epoch of today's size (Unix ms): what a store with a lease stamps its entries with."""

MINIMAL_RULE = (Path(__file__).resolve().parent / "minimal_rule.lua").read_text()
CHECKED_RULE = (
    scripts.splice(
        "required_checks", (Path(__file__).resolve().parent / "required_checks.lua").read_text(), scripts.read_lib
    )
    + MINIMAL_RULE
)
"""The minimal rule behind the checks DESIGN requires of every update script (benchmarks/required_checks.lua)."""
_ACL_CHECK = re.compile(r"^  if redis\.acl_check_cmd and not redis\.acl_check_cmd\(command, key\) then$", re.M)


def update_without_acl_check() -> str:
    """lua/update.lua with its ACL pre-check removed: what the check costs inside Redis (benchmark only)."""
    source, found = _ACL_CHECK.subn("  if false then", scripts.UPDATE.source)
    assert found == 1, "lua/update.lua no longer has the ACL pre-check line this benchmark removes"
    return source


class ServerTime:
    """Redis' own µs of one command (INFO commandstats), summed over the blocks of one variant."""

    def __init__(self, client: Any, command: str) -> None:
        self.client, self.command = client, command
        self.usec, self.calls = 0.0, 0

    def around(self, block: Block) -> Block:
        def measured() -> list[int]:
            self.client.config_resetstat()
            samples = block()
            stat = self.client.info("commandstats").get(f"cmdstat_{self.command}", {"usec": 0, "calls": 0})
            self.usec += stat["usec"]
            self.calls += stat["calls"]
            return samples

        return measured

    def per_call(self) -> float:
        return self.usec / max(1, self.calls)


def _client_code_us(call: Callable[[], object], number: int = 20_000) -> float:
    """Best-of-repeats µs of ``call`` against a client that answers at once (no I/O)."""
    import timeit

    return min(timeit.repeat(call, number=number, repeat=7)) / number * 1e6


def single_key(client: Any, plan: Plan, rooms: RoomSource) -> Results:
    """update_status vs the minimal rule script and SET PX; get vs HGET: sequential round trips on one connection."""
    store = _store(client)
    n = plan.samples
    out = Results()
    run = client.execute_command
    minimal_sha = client.script_load(MINIMAL_RULE)
    bare_sha = client.script_load(update_without_acl_check())
    checked_sha = client.script_load(CHECKED_RULE)
    client.script_load(scripts.UPDATE.source)
    head = ("seed", str(TTL_MS), PARTICIPANT, f"reason:{PARTICIPANT}", f"inc:{PARTICIPANT}", "", "")
    fenced_head = (*head[:-2], str(EPOCH), "")  # a store with a lease
    default_head = (
        *head[:-2],
        str(EPOCH),
        f"t:{PARTICIPANT}",
    )  # with a lease and timelines: the SGLang plugin's default
    names = ("update", "minimal", "checked", "no acl", "fenced", "unfenced", "sglang")
    server = {name: ServerTime(client, "evalsha") for name in names}

    def update_block() -> list[int]:
        fresh = rooms.take(n)
        return time_calls(lambda i: store.update_status(fresh[i], KVPoll.Bootstrapping), n)

    def rule_block(sha: str) -> Block:
        def block() -> list[int]:
            keys = store.schema.room_keys(rooms.take(n))
            return time_calls(lambda i: run("EVALSHA", sha, 1, keys[i], str(TTL_MS), PARTICIPANT, "1"), n)

        return block

    def no_acl_block() -> list[int]:
        keys = store.schema.room_keys(rooms.take(n))
        return time_calls(lambda i: run("EVALSHA", bare_sha, 1, keys[i], *head, "1"), n)

    def raw_update_block(fence: tuple[str, ...]) -> Block:
        def block() -> list[int]:
            keys = store.schema.room_keys(rooms.take(n))
            return time_calls(lambda i: run("EVALSHA", scripts.UPDATE.sha, 1, keys[i], *fence, "1"), n)

        return block

    def set_block() -> list[int]:
        keys = [f"raw:{r}" for r in rooms.take(n)]
        return time_calls(lambda i: run("SET", keys[i], "1", "PX", TTL_MS), n)

    s = interleave(
        {
            "update": server["update"].around(update_block),
            "minimal": server["minimal"].around(rule_block(minimal_sha)),
            "checked": server["checked"].around(rule_block(checked_sha)),
            "no acl": server["no acl"].around(no_acl_block),
            "fenced": server["fenced"].around(raw_update_block(fenced_head)),
            "unfenced": server["unfenced"].around(raw_update_block(head)),
            "sglang": server["sglang"].around(raw_update_block(default_head)),
            "set": set_block,
        },
        plan.rounds,
    )
    up, floor, raw_set = s["update"].p50_us, s["minimal"].p50_us, s["set"].p50_us
    t_update, t_minimal, t_no_acl = (server[k].per_call() for k in ("update", "minimal", "no acl"))
    t_fenced, t_unfenced = server["fenced"].per_call(), server["unfenced"].per_call()
    t_sglang, t_checked = server["sglang"].per_call(), server["checked"].per_call()
    out.rows += [
        _lat("single key", "`store.update_status` (CREATED)", s["update"], f"server {t_update:.2f} µs/call"),
        _lat("single key", "minimal rule script, raw `EVALSHA`", s["minimal"], f"server {t_minimal:.2f} µs/call"),
        _lat(
            "single key",
            "minimal rule script behind the checks DESIGN requires (argument validation, ACL pre-check), raw `EVALSHA`",
            s["checked"],
            f"server {t_checked:.2f} µs/call, {t_checked / t_minimal:.2f}× the minimal rule: the floor of a script "
            f"that keeps DESIGN §3 and §6; `update_status` {t_update / t_checked:.2f}× it",
        ),
        _lat(
            "single key",
            "`update.lua` without its ACL check, raw `EVALSHA`",
            s["no acl"],
            f"server {t_no_acl:.2f} µs/call",
        ),
        _lat(
            "single key",
            "`update.lua` fenced (a store with a lease), raw `EVALSHA`",
            s["fenced"],
            f"server {t_fenced:.2f} µs/call, {t_fenced / t_unfenced:.2f}× the same script unfenced "
            f"({t_unfenced:.2f} µs/call)",
        ),
        _lat(
            "single key",
            "`update.lua` fenced, with the timeline (the SGLang plugin's default), raw `EVALSHA`",
            s["sglang"],
            f"server {t_sglang:.2f} µs/call, {t_sglang / t_fenced:.2f}× the same script without the timeline",
        ),
        _lat(
            "single key",
            "raw `SET key 1 PX ttl`",
            s["set"],
            f"`update_status` {up / raw_set:.2f}× it (budget withdrawn: the minimal rule alone is "
            f"{floor / raw_set:.2f}×)",
        ),
    ]
    out.budgets += [
        Budget(
            "update_status p50 vs minimal rule script",
            ratio(s["update"], s["minimal"]),
            "<=",
            1.05,
            "×",
            f"{up:.1f} µs vs {floor:.1f} µs",
        ),
        Budget(
            "Redis time per update vs minimal rule script",
            t_update / t_minimal,
            "<=",
            1.10,
            "×",
            f"{t_update:.2f} µs vs {t_minimal:.2f} µs per call (INFO commandstats)",
        ),
        Budget(
            "Redis time per fenced update (a store with a lease) vs minimal rule script",
            t_fenced / t_minimal,
            "<=",
            1.10,
            "×",
            f"{t_fenced:.2f} µs vs {t_minimal:.2f} µs per call (INFO commandstats)",
        ),
        Budget(
            "Redis time per update with the SGLang plugin's defaults (lease and timeline) vs minimal rule script",
            t_sglang / t_minimal,
            "<=",
            1.10,
            "×",
            f"{t_sglang:.2f} µs vs {t_minimal:.2f} µs per call (INFO commandstats)",
        ),
    ]
    canned = _store(_CannedClient())
    room = rooms.take(1)[0]
    client_us = _client_code_us(lambda: canned.update_status(room, KVPoll.Bootstrapping))
    bare_client_us = _client_code_us(
        lambda: _CannedClient().execute_command("EVALSHA", minimal_sha, 1, "k", str(TTL_MS), PARTICIPANT, "1")
    )
    out.notes.append(
        f"`update_status` vs the minimal rule script: {up - floor:+.1f} µs at p50. Inside Redis the update script "
        f"takes {t_update - t_minimal:+.2f} µs more per call (argument validation and the ACL pre-check; the check "
        f"alone {t_update - t_no_acl:+.2f} µs); kvstatus' own Python takes {client_us:.2f} µs per call against "
        f"{bare_client_us:.2f} µs for the bare `execute_command` (no I/O, best of repeats); the rest is the round "
        f"trip, the same for both."
    )

    existing = rooms.take(n)
    store.update_many(dict.fromkeys(existing, KVPoll.Transferring))
    keys = store.schema.room_keys(existing)
    alone = _store(client, shared_fate=False)
    s = interleave(
        {
            "get": lambda: time_calls(lambda i: store.get(existing[i]), n),
            "alone": lambda: time_calls(lambda i: alone.get(existing[i]), n),
            "HGET": lambda: time_calls(lambda i: run("HGET", keys[i], PARTICIPANT), n),
        },
        plan.rounds,
    )
    get, hget, own = s["get"].p50_us, s["HGET"].p50_us, s["alone"].p50_us
    out.rows += [
        _lat(
            "single key", "`store.get` (shared fate, the default: `HMGET` of the entry and the room's record)", s["get"]
        ),
        _lat("single key", "`store.get` with `shared_fate=False` (`HGET` of the entry)", s["alone"]),
        _lat("single key", "raw `HGET` of the same key", s["HGET"]),
    ]
    out.budgets += [
        Budget("get p50 vs raw HGET", ratio(s["get"], s["HGET"]), "<=", 1.05, "×", f"{get:.1f} µs vs {hget:.1f} µs"),
        Budget(
            "shared-fate get p50 vs the entry's own get",
            ratio(s["get"], s["alone"]),
            "<=",
            1.10,
            "×",
            f"{get:.1f} µs vs {own:.1f} µs",
        ),
    ]
    client_us = _client_code_us(lambda: canned.get(room))
    canned_alone = _store(_CannedClient(), shared_fate=False)
    alone_us = _client_code_us(lambda: canned_alone.get(room))
    out.notes.append(
        f"`get` vs raw `HGET`: {get - hget:+.1f} µs at p50; kvstatus' own Python (validation, key, decoding) takes "
        f"{client_us:.2f} µs per call with shared fate, {alone_us:.2f} µs without."
    )
    return out


def batches(client: Any, plan: Plan, rooms: RoomSource, *, label: str = "", cluster: bool = False) -> Results:
    """update_many(1000) vs the minimal rule script over 1000 keys; get_many(256) vs the bare get_many.lua."""
    store = _store(client)
    out = Results()
    size, calls = 1000, plan.batches
    head = ("seed", str(TTL_MS), PARTICIPANT, f"reason:{PARTICIPANT}", f"inc:{PARTICIPANT}", "", "")
    section = f"batch{label}"
    run = client.execute_command
    server = {name: ServerTime(client, "evalsha") for name in ("update_many", "minimal", "checked", "no acl")}

    def update_many_block() -> list[int]:
        work = [dict.fromkeys(rooms.take(size), KVPoll.Bootstrapping) for _ in range(calls)]
        return time_calls(lambda i: store.update_many(work[i]), calls)

    def floor_block(source: str) -> Block:
        def block() -> list[int]:
            work = [store.schema.room_keys(rooms.take(size)) for _ in range(calls)]
            sha = client.script_load(source)
            args = ("1",) * size
            return time_calls(lambda i: run("EVALSHA", sha, size, *work[i], str(TTL_MS), PARTICIPANT, *args), calls)

        return block

    def no_acl_block() -> list[int]:
        work = [store.schema.room_keys(rooms.take(size)) for _ in range(calls)]
        sha = client.script_load(update_without_acl_check())
        args = ("1",) * size
        return time_calls(lambda i: run("EVALSHA", sha, size, *work[i], *head, *args), calls)

    def pipelined_set_block() -> list[int]:
        work = [[f"raw:{r}" for r in rooms.take(size)] for _ in range(calls)]

        def pipelined(i: int) -> None:
            with client.pipeline(transaction=False) as pipe:
                for key in work[i]:
                    pipe.execute_command("SET", key, "1", "PX", TTL_MS)
                pipe.execute()

        return time_calls(pipelined, calls)

    blocks = {"update_many": update_many_block, "set": pipelined_set_block}
    if not cluster:  # one EVALSHA over 1000 keys cannot cross cluster slots
        blocks = {
            "update_many": server["update_many"].around(update_many_block),
            "minimal": server["minimal"].around(floor_block(MINIMAL_RULE)),
            "checked": server["checked"].around(floor_block(CHECKED_RULE)),
            "no acl": server["no acl"].around(no_acl_block),
            "set": pipelined_set_block,
        }
    s = interleave(blocks, plan.rounds)
    out.rows.append(_tput(section, "`store.update_many(1000)`", s["update_many"], size))
    if not cluster:
        per_key = {k: v.per_call() / size for k, v in server.items()}
        out.rows += [
            _tput(section, "minimal rule script over 1000 keys, raw `EVALSHA`", s["minimal"], size),
            _tput(section, "minimal rule script behind DESIGN's required checks over 1000 keys", s["checked"], size),
            _tput(section, "`update.lua` without its ACL check over 1000 keys, raw `EVALSHA`", s["no acl"], size),
            Measurement(section, "Redis time per key: `update_many(1000)`", per_key["update_many"], "µs"),
            Measurement(section, "Redis time per key: minimal rule script", per_key["minimal"], "µs"),
            Measurement(section, "Redis time per key: minimal rule script behind the checks", per_key["checked"], "µs"),
            Measurement(section, "Redis time per key: `update.lua` without ACL check", per_key["no acl"], "µs"),
        ]
        out.budgets.append(
            Budget(
                "update_many(1000) throughput vs minimal rule script",
                ratio(s["minimal"], s["update_many"]),
                ">=",
                0.90,
                "×",
                f"{size / s['update_many'].p50_us * 1e6:,.0f} vs {size / s['minimal'].p50_us * 1e6:,.0f} keys/s",
            )
        )
        canned = _store(_CannedClient())
        work = dict.fromkeys(rooms.take(size), KVPoll.Bootstrapping)
        client_us = _client_code_us(lambda: canned.update_many(work), 100)
        out.notes.append(
            f"`update_many(1000)` vs the minimal rule script: {s['update_many'].p50_us - s['minimal'].p50_us:+,.0f} "
            f"µs per call at p50. Inside Redis {per_key['update_many'] - per_key['minimal']:+.2f} µs per key "
            f"(validation and the ACL pre-check; the check alone "
            f"{per_key['update_many'] - per_key['no acl']:+.2f} µs per key); kvstatus' own Python (validation, "
            f"keys, decoding, no I/O) {client_us:,.0f} µs per call."
        )
        out.notes.append(
            f"The minimal rule behind the checks DESIGN requires (benchmarks/required_checks.lua) runs at "
            f"{ratio(s['minimal'], s['checked']):.2f}× the minimal rule's throughput over 1000 keys, "
            f"{per_key['checked'] / per_key['minimal']:.2f}× its Redis time per key; `update_many(1000)` at "
            f"{ratio(s['checked'], s['update_many']):.2f}× the checked floor's throughput."
        )
    out.rows.append(_tput(section, "raw pipelined `SET PX` × 1000", s["set"], size))

    size = 256
    present = rooms.take(size)
    store.update_many(dict.fromkeys(present, KVPoll.Transferring))
    raw_keys = _set_raw_keys(client, "mget", present)
    present_keys = store.schema.room_keys(present)
    alone = _store(client, shared_fate=False)
    blocks = {
        "get_many": lambda: time_calls(lambda i: store.get_many(present), calls * 4),
        "alone": lambda: time_calls(lambda i: alone.get_many(present), calls * 4),
        "mget": lambda: time_calls(
            lambda i: client.mget_nonatomic(raw_keys) if cluster else run("MGET", *raw_keys), calls * 4
        ),
    }
    if not cluster:
        client.script_load(scripts.GET_MANY.source)
        blocks["bare"] = lambda: time_calls(
            lambda i: run("EVALSHA", scripts.GET_MANY.sha, size, *present_keys, PARTICIPANT), calls * 4
        )
    s = interleave(blocks, plan.rounds)
    if not cluster:
        counts = commands_per_node([client], lambda: store.get_many(present))[0]
        sent = counts.get("evalsha_ro", 0) + counts.get("evalsha", 0)
        out.notes.append(
            f"`get_many(256)` on one Redis sends {sent} command(s), one round "
            f"trip (calls seen by the server, script-internal ones included: {counts})"
        )
        out.rows.append(_tput(section, "bare `get_many.lua` over 256 keys, raw `EVALSHA`", s["bare"], size))
        out.budgets.append(
            Budget(
                "get_many(256) vs bare get_many.lua",
                ratio(s["bare"], s["get_many"]),
                ">=",
                0.9,
                "×",
                f"{s['get_many'].p50_us:.0f} µs vs {s['bare'].p50_us:.0f} µs per call",
            )
        )
    out.budgets.append(
        Budget(
            f"shared-fate get_many(256) vs the entries' own{label}",
            ratio(s["get_many"], s["alone"]),
            "<=",
            1.10,
            "×",
            f"{s['get_many'].p50_us:.0f} µs vs {s['alone'].p50_us:.0f} µs per call",
        )
    )
    out.rows += [
        _tput(section, "`store.get_many(256)` (shared fate, the default)", s["get_many"], size),
        _tput(section, "`store.get_many(256)` with `shared_fate=False`", s["alone"], size),
        _tput(section, "raw `MGET` of 256 string keys" + (" (`mget_nonatomic`)" if cluster else ""), s["mget"], size),
    ]
    return out


def commands_per_node(nodes: list[redis.Redis], call: Callable[[], object]) -> list[dict[str, int]]:
    """Calls per command name on each node during ``call()`` (INFO commandstats; script-internal calls included)."""
    for node in nodes:
        node.config_resetstat()
    call()
    counts = []
    for node in nodes:
        stats = node.info("commandstats")
        counts.append(
            {
                name.removeprefix("cmdstat_"): int(v["calls"])
                for name, v in stats.items()
                if name != "cmdstat_config|resetstat"
            }
        )
    return counts


class _CannedClient:
    """Answers every command at once with a canned reply of the right shape: the store's own cost, without I/O."""

    def execute_command(self, *args: Any) -> Any:
        if args[0] == "HGET":
            return b"3"
        if args[0] == "HMGET":
            return [b"3", None]
        numkeys = int(args[2])
        if args[1] == scripts.GET_MANY.sha:
            return [b"3"] * numkeys
        return [4, 3] * numkeys
