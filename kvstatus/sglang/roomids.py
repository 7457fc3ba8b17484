"""Room ids kvstatus cannot store, under SGLang: the request fails, the engine goes on.

SGLang takes ``bootstrap_room`` from the request, and its dict accepts any hashable (-1, 2**63, "42", None).
kvstatus stores ints in [0, 2**63 - 1] only, and the store raises ``InvalidRoomError`` for anything else.
Inside the scheduler loop, a transfer thread or the bootstrap thread, that exception would stop the whole
engine for one client's bad id. So :class:`~kvstatus.sglang.RoomStatusMap` answers for such an id as for a
room that **failed from the start**, without touching Redis: ``in`` is True, ``m[room]``, ``get``, ``pop``,
``collect`` and ``consensus`` answer Failed, and a write is refused with :data:`INVALID_ROOM_RESULT`
(REFUSED_CREATE, Failed: nothing was written). Every upstream poll then concludes Failed at its next call
(the sender's ``in`` then ``check_status``, the receiver's ``check_status``, nixl's
``get(room, WaitingForInput)``), so that one request fails with its reason and the engine goes on. Answering
"no entry" instead would make ``m[room]`` raise KeyError in the receiver's poll, and nixl's decode wait out its
300 s timeout. The id is not coerced: "42" made 42 would share room 42's entry with another request, and -1
made 2**63 - 1 likewise. An opening write (Bootstrapping, WaitingForInput) logs one warning; reads log
nothing, as polls repeat.
"""

from __future__ import annotations

from kvstatus.keys import MAX_ROOM
from kvstatus.rule import KVPoll, Outcome, UpdateResult

INVALID_ROOM_RESULT = UpdateResult(Outcome.REFUSED_CREATE, KVPoll.Failed)
"""What a write of a room id kvstatus cannot store returns: nothing was written, and reads answer Failed."""


def storable(room: object) -> bool:
    """True for a room id the store accepts: an int (not bool) in [0, 2**63 - 1]."""
    return isinstance(room, int) and not isinstance(room, bool) and 0 <= room <= MAX_ROOM


def invalid_room_reason(room: object) -> str:
    """The failure reason of a request whose ``bootstrap_room`` kvstatus cannot store (its repr cut to 40 chars)."""
    shown = repr(room)
    if len(shown) > 40:
        shown = shown[:37] + "..."
    return (
        f"bootstrap_room {shown} ({type(room).__name__}) is not a room id kvstatus can store (an int in "
        "[0, 2**63 - 1]): the request fails"
    )
