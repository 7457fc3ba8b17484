"""The PP rank 0 read of many rooms at once (``RoomStatusMap.collect_many``), kept apart from the map's poll path."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Optional

from kvstatus.errors import InvalidArgumentError, InvalidRoomError
from kvstatus.model import KVPoll
from kvstatus.sglang.outage import Unanswered, storable


def collect_many(status_map: Any, rooms: Sequence[int]) -> dict[int, list[Optional[KVPoll]]]:
    """``status_map.collect`` for many rooms: one ``get_many`` per PP rank (round trips = ranks, not rooms); the
    rooms failed here, or whose entry Redis lost, read Failed in this participant's rank, as ``collect`` does."""
    if status_map.pp_participants is None:
        raise InvalidArgumentError("collect_many() needs pp_participants: this map was built without pipeline ranks")
    if status_map._rank_stores is None:
        status_map._rank_stores = [
            status_map.store if name == status_map.participant else status_map.store.for_participant(name)
            for name in status_map.pp_participants
        ]
    stores, ranks = status_map._rank_stores, len(status_map._rank_stores)
    started = time.monotonic()
    try:
        try:
            per_rank = status_map._call(lambda: [store.get_many(rooms) for store in stores])
        except InvalidRoomError:  # ids the store cannot hold read as Failed; the others are read as usual
            valid = [room for room in rooms if storable(room)]
            per_rank = status_map._call(lambda: [store.get_many(valid) for store in stores]) if valid else []
    except Unanswered as unanswered:
        for room in rooms:
            status_map._fail_here(room, unanswered.reason)
        return {room: [KVPoll.Failed] * ranks for room in dict.fromkeys(rooms)}
    collected: dict[int, list[Optional[KVPoll]]] = {
        room: [statuses[room] for statuses in per_rank] if storable(room) else [KVPoll.Failed] * ranks
        for room in dict.fromkeys(rooms)
    }
    if status_map.participant in status_map.pp_participants:
        own = status_map.pp_participants.index(status_map.participant)
        for room in [room for room, statuses in collected.items() if statuses[own] is None]:
            status_map._vanished(room, started)
        for room in filter(status_map._failed_here.reason, collected):
            collected[room][own] = KVPoll.Failed
    return collected
