"""One room, one fate: the room's failure record, and what every operator view shows of it.

SGLang keeps one ``request_status`` dict per KV manager. When one side of a room fails, upstream tells
the other side by a ZMQ message, and loses that message when the peer is gone: the survivor waits out
a 300 s timeout, then fails with "unknown reason from another rank". kvstatus holds every participant's
entry in one room hash, so a reader can see its peers. With ``shared_fate`` on (the default), a
participant's read of a room answers Failed as soon as the room has failed for anyone, and the room's
first failure (:class:`FailureRecord`: when, at which stage, raised by whom, why) says why.

The rule is :func:`kvstatus.rule.shared_status`, with its table. The read derives the answer; it
rewrites no entry. The record is written once per room (first root cause wins) by the scripts that fail
an entry (``lua/lib/fate.lua``): an update to Failed, a sweep, a cancel. It lives in the room hash under :data:`FATE_FIELD`, so it shares the room's slot and TTL and
costs the read no extra round trip.
"""

from __future__ import annotations

from typing import Optional

from kvstatus import stored
from kvstatus.model import FailureRecord, KVPoll, RoomView
from kvstatus.rule import shared_status

FATE_FIELD = "room:fate"
"""The room hash field of the room's first failure: ``<ms>:<stage>:<origin>:<reason>``. The colon keeps it
apart from participant names, which cannot hold one."""


def parse_failure(value: object, key: str) -> Optional[FailureRecord]:
    """Decode the :data:`FATE_FIELD` value read from ``key`` (None stays None); raise
    :class:`~kvstatus.errors.CorruptedValueError` naming the key for anything kvstatus does not write
    (:func:`kvstatus.stored.parse_failure`: its time is one a reader can show, up to the year 9999)."""
    return None if value is None else stored.parse_failure(value, key, FATE_FIELD)


def reads(view: RoomView) -> dict[str, Optional[KVPoll]]:
    """What each participant's reads of ``view`` answer: its own entry's status judged with the room's first
    failure (:func:`shared_status`). Every operator view (``get``, ``ls``, ``stats``, ``health``, ``watch``, the
    board, the exporter) shows and counts these, so none shows an entry open in a room that has failed."""
    return {name: shared_status(entry.status, view.failure, name) for name, entry in view.participants.items()}


def read_names(view: RoomView) -> dict[str, Optional[str]]:
    """:func:`reads` as KVPoll names (None: no status), as the views' JSON shows them."""
    return {name: None if status is None else status.name for name, status in reads(view).items()}


def failed_by_fate(view: RoomView) -> list[str]:
    """The participants whose entry is still open but whose reads answer Failed, because the room failed."""
    return [name for name, status in reads(view).items() if status != view.participants[name].status]


def fate_text(view: RoomView) -> Optional[str]:
    """The room's fate in one line, or None when it has not failed: its first failure, and who reads Failed by
    it though their own entry is open, e.g. "failed at transfer by prefill-1: NIXL transfer timed out;
    decode-1 reads Failed (shared fate)". Not escaped: a view shows it through its own escaping."""
    if view.failure is None:
        return None
    line = view.failure.describe()
    shared = failed_by_fate(view)
    if shared:
        line += f"; {', '.join(shared)} {'reads' if len(shared) == 1 else 'read'} Failed (shared fate)"
    return line
