"""Reading the participants' leases of a namespace (``kvstatus participants``, ``ls --lost``, ``stats``), without the CLI.

Lease records are found with SCAN ``<prefix>:<namespace>:lease:*`` on every
primary (SCAN walks the whole keyspace to find them, so a listing costs about
as much as one SCAN pass, not one read per room) and read with one pipelined
``HGETALL`` per record plus that node's ``TIME``, so alive and expired are
judged by the clock of the Redis that holds the record, as the scripts do.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Optional

from kvstatus.admin.send import DEFAULT_BATCH, nodes_of, replies, scan_step, send
from kvstatus.keys import KeySchema
from kvstatus.model import OPEN, LeaseState, RoomView
from kvstatus.replies import stored_int, text
from kvstatus.requests import Call
from kvstatus.translate import translate_error


@dataclass(frozen=True)
class LeaseInfo:
    """One participant's lease record. Times are Unix seconds by the Redis clock; ``ttl`` in seconds.

    ``state``: "alive", "expired" (its deadline passed: the holder stopped
    renewing) or "released" (closed by its store). ``generation`` counts the
    name's incarnations; ``incarnation`` is the current holder's token.
    """

    participant: str
    state: str
    incarnation: str
    generation: int
    since: float
    last_seen: float
    deadline: float
    ttl: float
    now: float
    epoch: int = 0
    """The incarnation's fence (``lua/lease.lua``): the epoch its writes stamp on its entries (0: none read)."""

    @property
    def lost(self) -> bool:
        return self.state != "alive"

    @property
    def lease_state(self) -> LeaseState:
        return LeaseState.LOST if self.lost else LeaseState.ALIVE

    def to_json(self) -> dict[str, Any]:
        return {
            "participant": self.participant,
            "state": self.state,
            "incarnation": self.incarnation,
            "generation": self.generation,
            "since": self.since,
            "last_seen": self.last_seen,
            "last_seen_ago_s": round(self.now - self.last_seen, 3),
            "deadline": self.deadline,
            "ttl_s": self.ttl,
        }


def redis_ms(seconds: Any, micros: Any) -> int:
    """A ``TIME`` reply as whole Unix ms, truncated exactly as the Lua scripts compute ``now``."""
    return int(seconds) * 1000 + int(micros) // 1000


def _decode(participant: str, fields: dict[Any, Any], now_ms: int) -> Optional[LeaseInfo]:
    """``now_ms``: the Redis clock in whole ms (:func:`redis_ms`). The lease is judged as lua/room_statuses.lua
    judges it (the consensus view, the sweeper): a fractional ms here called a lease lost up to 1 ms before it did."""
    record = {text(k): text(v) for k, v in fields.items()}
    now = now_ms / 1000
    try:
        deadline_ms = stored_int(record["deadline"]) or 0  # as lua/room_statuses.lua: a junk deadline is past
        deadline = deadline_ms / 1000
        held = record.get("state") == "held"
        # "expired" as stored: a peer watch expired a lease that stopped renewing (lua/lease.lua's "expire")
        state = (
            "alive"
            if held and now_ms <= deadline_ms
            else "expired"
            if held or record.get("state") == "expired"
            else "released"
        )
        return LeaseInfo(
            participant,
            state,
            record.get("inc", ""),
            int(record.get("gen", 0)),
            int(record.get("since", 0)) / 1000,
            int(record.get("seen", 0)) / 1000,
            deadline,
            int(record.get("ttl", 0)) / 1000,
            now,
            stored_int(record.get("epoch")) or 0,
        )
    except (KeyError, ValueError):
        return None  # not a record kvstatus writes (or half-expired): not a lease


def iter_leases(
    client: Any, schema: KeySchema, batch: int = DEFAULT_BATCH, on_corrupt: Optional[Callable[[str], None]] = None
) -> Iterator[LeaseInfo]:
    """Yield every lease record of the namespace (alive, expired or released), one SCAN pass per primary.

    A key at a lease record's name that is not a hash, or a record kvstatus does not write, is skipped, and
    ``on_corrupt`` (if given) is called with a message naming it."""
    for node in nodes_of(client):
        cursor = 0
        while True:
            cursor, keys = scan_step(client, node, cursor, schema.lease_pattern, batch)
            names = [(key, name) for key in keys if (name := schema.participant_of_lease(key)) is not None]
            if names:
                calls = [Call(("TIME",)), *(Call(("HGETALL", key)) for key, _ in names)]
                found = send(client, replies(calls, strict=1), node)  # the clock must answer; a bad key is skipped
                now_ms = redis_ms(*found[0])
                for (key, name), fields in zip(names, found[1:]):
                    bad = isinstance(fields, Exception)
                    info = None if bad or not fields else _decode(name, fields, now_ms)
                    if info is not None:
                        yield info
                    elif (bad or fields) and on_corrupt is not None:
                        on_corrupt(f"key {text(key)} is not a lease record kvstatus writes; skipped")
            if cursor == 0:
                break


def index_problem(client: Any, schema: KeySchema) -> Optional[str]:
    """A message naming the namespace's lease index (:mod:`kvstatus.peerwatch`) when its key holds something other
    than a hash (a tenant's string): the peer watches then judge peers by presence and leases alone. None: fine."""
    key = schema.lease_index_key
    # an HGET, which every recipe grants (TYPE is not): WRONGTYPE for a non-hash
    (reply,) = send(client, replies([Call(("HGET", key, ""))], strict=0))
    if isinstance(reply, Exception):
        if "WRONGTYPE" not in str(reply):
            raise translate_error(reply, Call(("HGET", key, "")))
        return (
            f"key {key} holds a value that is not the lease index kvstatus writes (a hash); skipped: the peer "
            "watches judge peers by their presence and leases alone until it is removed"
        )
    return None


def list_leases(client: Any, schema: KeySchema, on_corrupt: Optional[Callable[[str], None]] = None) -> list[LeaseInfo]:
    """Every lease record of the namespace, sorted by participant (``on_corrupt``: see :func:`iter_leases`)."""
    return sorted(iter_leases(client, schema, on_corrupt=on_corrupt), key=lambda info: info.participant)


def lost_participants(client: Any, schema: KeySchema) -> frozenset[str]:
    """The participants whose lease is lost (expired or released); the exporter's hook has this signature."""
    return frozenset(info.participant for info in iter_leases(client, schema) if info.lost)


@dataclass(frozen=True)
class Deaths:
    """The namespace's lease records by participant: which open entries a dead or restarted participant left.

    An open entry is *left* (its writer is gone, and nothing will move it) when its participant's lease is lost
    (expired: the process died; or released), or when the entry carries the epoch of an older incarnation than
    the lease now held under its name (``lua/update.lua`` stamps each entry with its writer's epoch): the
    process restarted under the same name, and the new one does not serve the old one's rooms. A participant
    without a lease record (a store built without ``lease_ttl``) is never judged dead.

    As a collection it holds the names of the participants whose lease is lost, as :func:`lost_participants`
    answers: :func:`read_deaths` serves as the exporter's and the board's hook, one SCAN of the leases a pass."""

    leases: Mapping[str, LeaseInfo] = field(default_factory=dict)

    @property
    def lost(self) -> list[str]:
        """The participants whose lease is lost, sorted."""
        return sorted(name for name, info in self.leases.items() if info.lost)

    def __iter__(self) -> Iterator[str]:
        return iter(self.lost)

    def __len__(self) -> int:
        return len(self.lost)

    def __contains__(self, name: object) -> bool:
        info = self.leases.get(name) if isinstance(name, str) else None
        return info is not None and info.lost

    def left(self, view: RoomView) -> dict[str, int]:
        """Participant -> when its writer died (Unix ms, Redis' clock) for each open entry of ``view`` that a dead
        or restarted participant left: its last renewal when its lease is lost, else when the incarnation now
        holding its name took the lease (the previous one died before it)."""
        found: dict[str, int] = {}
        for name, entry in view.participants.items():
            info = self.leases.get(name)
            if info is None or entry.status not in OPEN:
                continue
            stamp = view.stamps.get(name)
            if info.lost:
                found[name] = round(info.last_seen * 1000)
            elif stamp is not None and stamp < info.epoch:
                found[name] = round(info.since * 1000)
        return found

    def until_served(self, participant: str, died_ms: float) -> float:
        """When ``participant``, which died at ``died_ms``, can have served again: never while its lease is lost
        (infinity: nothing its pairs serve meanwhile is its own), else from ``died_ms`` (it restarted)."""
        info = self.leases.get(participant)
        return math.inf if info is not None and info.lost else died_ms


def read_deaths(client: Any, schema: KeySchema, on_corrupt: Optional[Callable[[str], None]] = None) -> Deaths:
    """The :class:`Deaths` of ``schema``'s namespace: its lease records, one SCAN pass (:func:`iter_leases`)."""
    return Deaths({info.participant: info for info in iter_leases(client, schema, on_corrupt=on_corrupt)})
