"""Random operation sequences over SGLang-style KV managers, and what each manager showed after each one.

The same sequence is applied to two groups of managers (e.g. one on kvstatus
through install(), one on upstream's dict); their observation lists must be
equal, operation for operation. A group is a list of managers, one per PP
rank (one element without PP), all of one pipeline.
"""

from __future__ import annotations

import random
from typing import Any, Callable, Sequence

Op = tuple[Any, ...]
ENDPOINT_PORT = 7000
KINDS = (
    "update",
    "update",
    "update",
    "update",
    "check",
    "poll",
    "get",
    "clear",
    "clear",
    "stage",
    "register",
    "abort",
    "consensus",
)


def random_ops(seed: int, count: int, *, rooms: int = 4, pp_size: int = 1) -> list[Op]:
    """``count`` operations on a few reused rooms (so rooms are cleared and reused), seeded."""
    rng = random.Random(seed)
    pool = [rng.randrange(2**63) for _ in range(rooms)]
    ops: list[Op] = []
    for _ in range(count):
        kind = rng.choice(KINDS if pp_size > 1 else KINDS[:-1])
        rank = 0 if kind == "consensus" else rng.randrange(pp_size)
        room = rng.choice(pool)
        ops.append((kind, rank, room, rng.randrange(5)) if kind == "update" else (kind, rank, room))
    return ops


def _norm(value: Any) -> Any:
    return None if value is None else int(value)


def _call(fn: Callable[[], Any]) -> Any:
    try:
        return _norm(fn())
    except KeyError:
        return "KeyError"


def apply(group: Sequence[Any], op: Op, deferred: Any) -> tuple[Any, ...]:
    """Run ``op`` on the group; return what it answered and the state of its room on that rank afterwards."""
    kind, rank, room = op[:3]
    m = group[rank]
    rs = m.request_status
    result: Any = None
    if kind == "update":
        m.update_status(room, op[3])
    elif kind == "check":
        result = _call(lambda: m.check_status(room))
    elif kind == "poll":  # CommonKVSender._poll_with_status: `in`, then the check
        result = _call(lambda: m.check_status(room)) if room in rs else 0
    elif kind == "get":
        result = (_norm(rs.get(room)), rs.get(room, "default"))
    elif kind == "clear":  # the sender's clear(): read the final status, then pop
        result = _norm(rs.get(room))
        rs.pop(room, None)
    elif kind == "stage":  # transfer state that a new request on the room must drop
        m._deferred_ack_targets[room] = ["peer"]
        m._deferred_ack_poisoned_rooms.add(room)
        m._staging_outstanding[room] += 1
    elif kind == "register":
        deferred.register(room, ("10.0.0.9", ENDPOINT_PORT + room % 1000))
    elif kind == "abort":  # _handle_bootstrap_message, ABORT
        if room in rs and rs[room] != 4:
            m.update_status(room, 0)
    elif kind == "consensus":
        result = _call(lambda: m.check_status_pp_consensus(room))
    else:
        raise ValueError(kind)
    state = (
        room in rs,
        _norm(rs.get(room)),
        room in m._deferred_ack_targets,
        room in m._deferred_ack_poisoned_rooms,
        m._staging_outstanding.get(room),
        [(msg["bootstrap_room"], msg["targets"], int(msg["status"]), msg["failure_reason"]) for msg in m.sent_messages],
    )
    return (kind, result, state)


def run(group: Sequence[Any], ops: Sequence[Op], deferred: Any) -> list[tuple[Any, ...]]:
    return [apply(group, op, deferred) for op in ops]


def divergences(ops: Sequence[Op], left: list[tuple[Any, ...]], right: list[tuple[Any, ...]]) -> list[str]:
    """One line per operation whose observations differ (empty: the two groups agree outcome for outcome)."""
    return [f"op {i} {op}: {a} != {b}" for i, (op, a, b) in enumerate(zip(ops, left, right)) if a != b]
