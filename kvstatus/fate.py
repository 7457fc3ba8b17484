"""One room, one fate: the shared-fate rule, pure Python, and the room's failure record.

SGLang keeps one ``request_status`` dict per KV manager. When one side of a room fails, upstream tells
the other side by a ZMQ message, and loses that message when the peer is gone: the survivor waits out
a 300 s timeout, then fails with "unknown reason from another rank". kvstatus holds every participant's
entry in one room hash, so a reader can see its peers. With ``shared_fate`` on (the default), a
participant's read of a room answers Failed as soon as the room has failed for anyone, and the room's
first failure (:class:`FailureRecord`: when, at which stage, raised by whom, why) says why.

The rule, :func:`shared_status`, for this participant's own entry and the room's failure record:

=====================  ==================================  ==================================
own entry              a peer's entry became Failed        the room was cancelled
=====================  ==================================  ==================================
missing                missing (nothing to fail)           missing (nothing to fail)
Bootstrapping          Failed                              Failed (and stored by the cancel)
WaitingForInput        Failed                              Failed (and stored by the cancel)
Transferring           Failed                              Failed (and stored by the cancel)
Success                Success (its part is done)          Success (its part is done)
Failed                 Failed                              Failed
=====================  ==================================  ==================================

A failure this participant raised itself is its own entry's business: under the ``seed`` policy an
entry may leave Failed, and its reads then follow the entry, exactly as upstream's dict would. So one
participant alone never reads anything the per-entry rule would not give it: the differential tests
against SGLang's ``update_status`` hold with shared fate on.

The read derives the answer; it rewrites no entry. The record is written once per room (first root
cause wins) by the scripts that fail an entry (``lua/lib/fate.lua``): an update to Failed, a sweep, a
cancel. It lives in the room hash under :data:`FATE_FIELD`, so it shares the room's slot and TTL and
costs the read no extra round trip.
"""

from __future__ import annotations

from typing import Any, Optional

from kvstatus import stored
from kvstatus.rule import FailureRecord, KVPoll, Stage

FATE_FIELD = "room:fate"
"""The room hash field of the room's first failure: ``<ms>:<stage>:<origin>:<reason>``. The colon keeps it
apart from participant names, which cannot hold one."""


STAGE_OF_STATUS = {
    KVPoll.Bootstrapping: Stage.BOOTSTRAP,
    KVPoll.WaitingForInput: Stage.WAITING,
    KVPoll.Transferring: Stage.TRANSFER,
    KVPoll.Success: Stage.TRANSFER,
}
"""The stage of a room that fails when an entry in the given status becomes Failed (lua/lib/fate.lua's table)."""


def parse_failure(value: Any, key: str) -> Optional[FailureRecord]:
    """Decode the :data:`FATE_FIELD` value read from ``key`` (None stays None); raise
    :class:`~kvstatus.errors.CorruptedValueError` naming the key for anything kvstatus does not write
    (:func:`kvstatus.stored.parse_failure`: its time is one a reader can show, up to the year 9999)."""
    return None if value is None else stored.parse_failure(value, key, FATE_FIELD)


def shared_status(own: Optional[KVPoll], failure: Optional[FailureRecord], participant: str) -> Optional[KVPoll]:
    """This participant's status under shared fate: ``own`` (its entry's status, or None) judged with the
    room's ``failure`` (see the table in the module docstring)."""
    if failure is None or own is None or own is KVPoll.Success or own is KVPoll.Failed:
        return own
    if failure.origin == participant and failure.stage is not Stage.CANCELLED:
        return own  # its own failure, which its entry has since left (seed policy): the entry decides
    return KVPoll.Failed


def shared_failed(own: KVPoll, failure: FailureRecord, participant: str) -> KVPoll:
    """:func:`shared_status` of an entry that exists, in a room that has failed (typed for the near cache)."""
    status = shared_status(own, failure, participant)
    return own if status is None else status
