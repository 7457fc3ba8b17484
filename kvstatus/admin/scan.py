"""Walking every room of a namespace with SCAN, in bounded batches and constant memory.

Used by ``kvstatus ls``, ``stats`` and ``watch``, and usable without the CLI.
On a ``RedisCluster`` client every primary is scanned in turn (SCAN is per
node). Rooms are read in batches of ``batch`` keys, one pipelined round trip
of HGETALL + PTTL per batch, so memory stays bounded at any number of rooms.

The entries of :data:`~kvstatus.keys.PROBE_PARTICIPANT` (written by ``kvstatus doctor``) are
left out of every view, and a room holding nothing else is skipped.

Each round trip here (a SCAN step, a pipelined read, a ``TIME``) goes through the stores' send path
(:mod:`kvstatus.admin.send`), on the backend of the :data:`~kvstatus.admin.send.Link` it is given: it gives up
at that backend's deadline, as a store call does (a bare client: the default 5 s). Against a hung server
(SIGSTOP, a frozen VM) a SCAN used to wait for 6 sends x the 5 s socket timeout plus the backoff, 33 s,
whatever the URL's ``?deadline=`` said, and ``ls``, ``stats`` and ``health`` send several. The deadline bounds
each round trip, not a whole walk of a namespace. Clients :mod:`kvstatus.connection` did not build (fakeredis,
a plain redis-py client) ignore it, as in store calls.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Optional

from kvstatus.admin.send import DEFAULT_BATCH, Link, nodes_of, replies, scan_step, send
from kvstatus.errors import CorruptedValueError
from kvstatus.keys import PROBE_PARTICIPANT, KeySchema
from kvstatus.model import ParticipantEntry, RoomView
from kvstatus.replies import decode_room
from kvstatus.requests import Call
from kvstatus.rule import reads
from kvstatus.translate import translate_error

Progress = Callable[[int], None]
"""Called after each batch with the number of keys scanned so far."""
OnCorrupt = Callable[[int, str], None]
"""Called with (room, message) for a room holding a value kvstatus does not write."""


def server_ms(client: Link) -> int:
    """Redis' clock in whole Unix ms (``TIME`` of the server, or of the first primary of a cluster), truncated as
    the Lua scripts compute ``now``: what timelines and failure records are written in, never the local clock."""
    ((seconds, micros),) = send(client, replies([Call(("TIME",))]), nodes_of(client)[0])
    return int(seconds) * 1000 + int(micros) // 1000


def iter_room_keys(client: Any, schema: KeySchema, batch: int = DEFAULT_BATCH) -> Iterator[list[str]]:
    """Yield the room keys of ``schema``'s namespace in lists of at most ``batch`` keys.

    SCAN may return a key twice while the keyspace is rehashed; callers that
    count should expect that rare duplicate, as every SCAN user must.
    """
    return iter_matching(client, schema.scan_pattern, lambda key: schema.room_of(key) is not None, batch)


def iter_matching(
    client: Any, pattern: str, accept: Callable[[str], bool], batch: int = DEFAULT_BATCH
) -> Iterator[list[str]]:
    """Yield the keys SCAN ``MATCH pattern`` finds (every primary of a cluster in turn) that ``accept`` takes, in
    lists of at most ``batch`` keys; Redis errors raise as kvstatus errors."""
    if batch < 1:
        raise ValueError("batch must be at least 1")
    for node in nodes_of(client):
        cursor, pending = 0, []
        while True:
            cursor, keys = scan_step(client, node, cursor, pattern, batch)
            pending += [key for key in keys if accept(key)]
            while len(pending) >= batch:
                yield pending[:batch]
                pending = pending[batch:]
            if cursor == 0:
                break
        if pending:
            yield pending


def read_rooms(
    client: Any, schema: KeySchema, keys: list[str], on_corrupt: Optional[OnCorrupt] = None, with_ttl: bool = True
) -> list[RoomView]:
    """The views of ``keys`` in one pipelined round trip; rooms gone meanwhile are left out.

    ``with_ttl=False`` skips the PTTL reads (half the commands); ``ttl_ms`` is then None.

    A room holding a value kvstatus does not write raises
    :class:`~kvstatus.errors.CorruptedValueError`, or, with ``on_corrupt``, is
    passed to it (room, message) and skipped.
    """
    calls = [Call((command, key)) for key in keys for command in (("HGETALL", "PTTL") if with_ttl else ("HGETALL",))]
    found = send(client, replies(calls, strict=0))
    step = 2 if with_ttl else 1
    views = []
    for i, key in enumerate(keys):
        fields, pttl = found[step * i], found[step * i + 1] if with_ttl else -1
        room = schema.room_of(key)
        if room is None or not fields:
            continue
        try:
            for reply in (fields, pttl):
                if isinstance(reply, Exception):
                    raise translate_error(reply, Call(("HGETALL", key))) from reply
            view = without_probe(decode_room(room, key, fields, pttl))
        except CorruptedValueError as exc:
            if on_corrupt is None:
                raise
            on_corrupt(room, str(exc))
            continue
        if view.exists:
            views.append(view)
    return views


def without_probe(view: RoomView) -> RoomView:
    """``view`` without the doctor's probe entry."""
    if PROBE_PARTICIPANT not in view.participants:
        return view
    kept = {name: entry for name, entry in view.participants.items() if name != PROBE_PARTICIPANT}
    steps = {name: found for name, found in view.timelines.items() if name != PROBE_PARTICIPANT}
    return view._replace(participants=kept, timelines=steps)  # its tombstone and first failure stay


def iter_rooms(
    client: Any,
    schema: KeySchema,
    batch: int = DEFAULT_BATCH,
    progress: Optional[Progress] = None,
    on_corrupt: Optional[OnCorrupt] = None,
    with_ttl: bool = True,
) -> Iterator[RoomView]:
    """Yield every room of the namespace (see the module docstring for memory, cluster and ``read_rooms``)."""
    scanned = 0
    for keys in iter_room_keys(client, schema, batch):
        yield from read_rooms(client, schema, keys, on_corrupt, with_ttl)
        scanned += len(keys)
        if progress is not None:
            progress(scanned)


def room_matches(view: RoomView, status: Any = None, participant: Optional[str] = None) -> bool:
    """True if some entry of ``view`` has ``participant`` (if given) and reads ``status`` (if given: the status
    :func:`kvstatus.rule.reads` answers, Failed in a room that failed); with neither, every room, a room
    cancelled before anyone wrote it (its first failure alone) included."""
    if status is None and participant is None:
        return True
    return any(
        (participant is None or name == participant) and (status is None or read == status)
        for name, read in reads(view).items()
    )


def entries(view: RoomView, participant: Optional[str] = None) -> list[tuple[str, ParticipantEntry]]:
    return [(n, e) for n, e in view.participants.items() if participant is None or n == participant]
