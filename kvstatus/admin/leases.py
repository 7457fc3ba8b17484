"""Reading the participants' leases of a namespace (``kvstatus participants``, ``ls --lost``, ``stats``), without the CLI.

Lease records are found with SCAN ``<prefix>:<namespace>:lease:*`` on every
primary (SCAN walks the whole keyspace to find them, so a listing costs about
as much as one SCAN pass, not one read per room) and read with one pipelined
``HGETALL`` per record plus that node's ``TIME``, so alive and expired are
judged by the clock of the Redis that holds the record, as the scripts do.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Optional

from kvstatus.admin.scan import DEFAULT_BATCH, round_trip, scan_clients
from kvstatus.consensus import LeaseState
from kvstatus.keys import KeySchema
from kvstatus.stored import stored_int
from kvstatus.translate import REDIS_ERRORS, translate_error


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


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def redis_ms(seconds: Any, micros: Any) -> int:
    """A ``TIME`` reply as whole Unix ms, truncated exactly as the Lua scripts compute ``now``."""
    return int(seconds) * 1000 + int(micros) // 1000


def _decode(participant: str, fields: dict[Any, Any], now_ms: int) -> Optional[LeaseInfo]:
    """``now_ms``: the Redis clock in whole ms (:func:`redis_ms`). The lease is judged as lua/room_statuses.lua
    judges it (the consensus view, the sweeper): a fractional ms here called a lease lost up to 1 ms before it did."""
    record = {_text(k): _text(v) for k, v in fields.items()}
    now = now_ms / 1000
    try:
        deadline_ms = stored_int(record["deadline"]) or 0  # as lua/room_statuses.lua: a junk deadline is past
        deadline = deadline_ms / 1000
        held = record.get("state") == "held"
        state = "alive" if held and now_ms <= deadline_ms else "expired" if held else "released"
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
        )
    except (KeyError, ValueError):
        return None  # not a record kvstatus writes (or half-expired): not a lease


def iter_leases(
    client: Any, schema: KeySchema, batch: int = DEFAULT_BATCH, on_corrupt: Optional[Callable[[str], None]] = None
) -> Iterator[LeaseInfo]:
    """Yield every lease record of the namespace (alive, expired or released), one SCAN pass per primary.

    A key at a lease record's name that is not a hash, or a record kvstatus does not write, is skipped, and
    ``on_corrupt`` (if given) is called with a message naming it."""
    try:
        for node in scan_clients(client):
            cursor: Any = 0
            while True:
                with round_trip(client):
                    cursor, keys = node.scan(cursor=cursor, match=schema.lease_pattern, count=batch)
                names = [(key, schema.participant_of_lease(key)) for key in keys]
                names = [(key, name) for key, name in names if name is not None]
                if names:
                    with round_trip(client), node.pipeline(transaction=False) as pipe:
                        pipe.time()
                        for key, _ in names:
                            pipe.hgetall(key)
                        replies = pipe.execute(raise_on_error=False)
                    if isinstance(replies[0], Exception):
                        raise replies[0]
                    now_ms = redis_ms(*replies[0])
                    for (key, name), fields in zip(names, replies[1:]):
                        bad = isinstance(fields, Exception)
                        info = None if bad or not fields else _decode(name, fields, now_ms)  # type: ignore[arg-type]
                        if info is not None:
                            yield info
                        elif (bad or fields) and on_corrupt is not None:
                            on_corrupt(f"key {_text(key)} is not a lease record kvstatus writes; skipped")
                if int(cursor) == 0:
                    break
    except REDIS_ERRORS as exc:
        raise translate_error(exc) from exc


def list_leases(client: Any, schema: KeySchema, on_corrupt: Optional[Callable[[str], None]] = None) -> list[LeaseInfo]:
    """Every lease record of the namespace, sorted by participant (``on_corrupt``: see :func:`iter_leases`)."""
    return sorted(iter_leases(client, schema, on_corrupt=on_corrupt), key=lambda info: info.participant)


def lost_participants(client: Any, schema: KeySchema) -> frozenset[str]:
    """The participants whose lease is lost (expired or released); the exporter's hook has this signature."""
    return frozenset(info.participant for info in iter_leases(client, schema) if info.lost)
