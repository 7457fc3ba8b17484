"""RoomStatusMap: SGLang's ``request_status`` dict as a view of one participant's entries in a kvstatus store (it
needs only a :class:`~kvstatus.StatusStore`, never sglang)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from contextlib import suppress
from typing import Any, Callable, Optional

from kvstatus.cachestate import MISS, NEVER_FRESH, Freshness
from kvstatus.errors import CorruptedValueError, InvalidArgumentError, InvalidRoomError, KVStatusError, LeaseLostError
from kvstatus.model import STRICT_CREATORS, KVPoll, Outcome, RoomConsensus, RoomView, UpdateResult
from kvstatus.rule import shared_status
from kvstatus.sglang.outage import (
    INVALID_ROOM_RESULT,
    LOST_RESULT,
    STORE_DOWN,
    UNANSWERED_RESULT,
    FailedHere,
    OpenRooms,
    Outage,
    Removals,
    invalid_room_reason,
    log,
    probe_of,
    storable,
)
from kvstatus.sglang.outage import Unanswered as _Unanswered

_MISSING = object()
_monotonic = time.monotonic  # bound once: the dict-speed path calls it on every poll
_LEN_ITER_MESSAGE = (
    "a RoomStatusMap is a view of rooms shared by every process of the namespace: it has no length and is not "
    "iterable (that would SCAN Redis). Use `kvstatus ls` or kvstatus.admin.reads to list rooms"
)

OnFailed = Callable[[int, Optional[str]], None]
"""``on_failed(room, reason)``: a read answered Failed; ``reason`` when the store failed the call, None when the room
itself reads Failed."""


class RoomStatusMap:
    """``kv_manager.request_status`` backed by ``store``: room -> this participant's status (a :class:`KVPoll`).

    Each operation is one store call, so one round trip (``pop`` included), and none for a read the near cache
    answers. ``m[room] = status`` **applies the update rule** (:meth:`update_status` returns the outcome);
    ``m[room]`` raises ``KeyError(room)`` without an entry; ``len(m)`` and ``iter(m)`` raise ``TypeError`` (counting
    a shared namespace would SCAN Redis). What it answers instead of raising into the engine is
    :mod:`kvstatus.sglang.outage`'s; reads judge shared fate as ``store.get`` does, and ``on_failed`` is told of
    each read that answers Failed. docs/sglang.md ("What changes, and what does not", "In code").
    """

    def __init__(
        self, store: Any, *, pp_participants: Optional[Sequence[str]] = None, on_failed: Optional[OnFailed] = None
    ) -> None:
        self.store = store
        self.participant: str = store.participant
        self.pp_participants: Optional[tuple[str, ...]] = None
        if pp_participants is not None:
            names = tuple(pp_participants)
            if not names or len(set(names)) != len(names) or not all(isinstance(n, str) for n in names):
                raise InvalidArgumentError(
                    f"invalid pp_participants {pp_participants!r}: expected distinct participant names, rank 0 first"
                )
            self.pp_participants = names
        self.on_failed = on_failed
        self._shared = bool(getattr(store, "shared_fate", False))  # reads judge shared fate (collect()'s views too)
        self._rank_stores: Optional[list[Any]] = None
        self.outage = Outage(self.participant)
        self.outage.probe, self.outage.on_answered = probe_of(store), self._fresh_again
        self._failed_here = FailedHere()  # rooms answered Failed because Redis failed a call: they stay Failed
        self._kept = self._failed_here.rooms
        self._open = OpenRooms(self.participant, float(store.ttl))  # a Redis that lost them: outage.OpenRooms
        self._open_rooms = self._open.rooms
        # The dict-speed path: the near cache's status maps, served while its state says they are fresh.
        self._near = store.near_cache
        self._door = NEVER_FRESH
        self._flat: dict[int, Optional[KVPoll]] = {}
        self._rank_flats: list[dict[int, Optional[KVPoll]]] = []
        reads = store.fresh_reads() if self._near is not None else None
        if reads is not None:
            self._door, self._flat = reads
            if self.pp_participants is not None:
                self._rank_flats = [store.fresh_reads(name)[1] for name in self.pp_participants]
        self._fresh: Freshness = self._door  # NEVER_FRESH during an outage
        self._removals = Removals()
        self._counting = getattr(self._near, "metrics", None) is not None  # hits are counted for the observer

    def _call(self, call: Callable[[], Any], reopen: bool = False) -> Any:
        """``call()``, a store call; :class:`_Unanswered` when Redis fails it or an outage is on. ``reopen``: a write
        of an opening status, sent once more when the lost lease's name is held again (the rule keeps Failed)."""
        if (reason := self.outage.reason()) is not None:
            raise _Unanswered(reason)
        try:
            result = call()
        except LeaseLostError as exc:
            self._fresh, reason = NEVER_FRESH, self.outage.failed(exc)
            if self.outage.hold_again(self.store):
                self._fresh_again()
                if reopen:
                    return self._call(call)
            raise _Unanswered(reason) from None
        except STORE_DOWN as exc:
            self._fresh = NEVER_FRESH
            raise _Unanswered(self.outage.failed(exc)) from None
        except CorruptedValueError as exc:  # this room's value, not the store: no outage
            raise _Unanswered(f"kvstatus: {exc}") from None
        except KVStatusError:
            raise  # a room id or an argument the store refuses: the caller's answer (see the methods)
        except Exception as exc:  # noqa: BLE001 - a defect below the map fails the room, never SGLang's thread
            raise _Unanswered(self.outage.defect(exc)) from None
        self.outage.answered()
        self._fresh_again()
        return result

    def _fresh_again(self) -> None:
        """Redis answers: the dict-speed path is on again (it skips the rooms failed here)."""
        self._fresh = self._door

    def _vanished(self, room: object, started: float) -> bool:
        """A read sent at ``started`` found no entry of this participant in ``room``: True when the room was open
        here, so Redis lost it (:class:`~kvstatus.sglang.outage.OpenRooms`), and the room now fails with that cause."""
        if type(room) is not int or (reason := self._open.vanished(room, started)) is None:
            return False
        self._failed(room, reason)
        return True

    def _failed(self, room: int, reason: Optional[str] = None) -> None:
        """``room`` reads Failed: ``reason`` when Redis failed the call (kept until removed), else None."""
        if reason is not None:
            self._failed_here.add(room, reason)
        if self.on_failed is not None:
            self.on_failed(room, reason)

    def _status_in(self, view: RoomView, participant: str) -> Optional[KVPoll]:
        """``participant``'s status in ``view`` as its own ``store.get`` answers it (shared fate judged)."""
        entry = view.participants.get(participant)
        if entry is None:
            return None
        if self._shared and view.failure is not None:
            return shared_status(entry.status, view.failure, participant)
        return entry.status

    def _read(self, room: int) -> Optional[KVPoll]:
        started = _monotonic()  # when the read is sent: what a lost entry is judged against (OpenRooms)
        try:
            status = self._call(lambda: self.store.get(room))
        except InvalidRoomError:
            return KVPoll.Failed  # its reason was recorded when its request opened (install())
        except _Unanswered as unanswered:
            self._failed(room, unanswered.reason)
            return KVPoll.Failed
        if status == KVPoll.Failed:
            self._failed(room)
        elif status is None and self._open_rooms and self._vanished(room, started):
            return KVPoll.Failed
        elif self._kept and (reason := self._failed_here.reason(room)) is not None:
            self._failed(room, reason)
            return KVPoll.Failed
        return status

    # The dict-speed path, atop the four poll methods: the near cache's status map, read with no lock, I/O or call
    # while fresh (never during an outage); anything else (not cached, Failed, not an int, stale) takes the full path.

    def __contains__(self, room: object) -> bool:
        if type(room) is int and _monotonic() < self._fresh.until:
            status = self._flat.get(room, MISS)
            if status is not MISS and (status is not None or (room not in self._kept and room not in self._open_rooms)):
                if self._counting:
                    self._fresh.hits.append(1)
                return status is not None
        return self._contains(room)

    def _contains(self, room: object) -> bool:
        """``room in m`` by the store (a method of its own: the fast path above must not pay for its closures)."""
        started = _monotonic()
        try:
            status: Optional[KVPoll] = self._call(lambda: self.store.get(room))
        except InvalidRoomError:
            return True  # an id the store cannot hold: a room that failed from the start
        except _Unanswered as unanswered:
            self._failed_here.add(room, unanswered.reason)
            return True  # the read that follows answers Failed, with the reason
        if status is None and self._open_rooms and self._vanished(room, started):
            return True
        return status is not None or self._failed_here.reason(room) is not None

    def __getitem__(self, room: int) -> KVPoll:
        if type(room) is int and _monotonic() < self._fresh.until:
            status = self._flat.get(room)
            if status and room not in self._kept:  # cached, with an entry, not Failed, not failed here
                if self._counting:
                    self._fresh.hits.append(1)
                return status
        status = self._read(room)
        if status is None:
            # Another thread's pop raced the `in` before this read (kvstatus.sglang.outage).
            status = self._removals.seen_by_another_thread(room, self.store.options.deadline)
            if status is None:
                raise KeyError(room)
        return status

    def get(self, room: int, default: Any = None) -> Any:
        """The participant's status in ``room``, or ``default`` when it has no entry."""
        if type(room) is int and _monotonic() < self._fresh.until:
            status = self._flat.get(room)
            if status and room not in self._kept:
                if self._counting:
                    self._fresh.hits.append(1)
                return status
        status = self._read(room)
        return default if status is None else status

    def collect(self, room: int) -> list[Optional[KVPoll]]:
        """Every PP rank's status in ``room`` (rank order, None where missing), in one round trip."""
        if self.pp_participants is None:
            raise InvalidArgumentError("collect() needs pp_participants: this map was built without pipeline ranks")
        if type(room) is int and _monotonic() < self._fresh.until:
            statuses = [flat.get(room, MISS) for flat in self._rank_flats]
            # A fill or invalidation under way leaves some rank's map without the room (MISS).
            if (
                MISS not in statuses
                and room not in self._kept
                and (None not in statuses or room not in self._open_rooms)
            ):
                if self._counting:
                    self._fresh.hits.append(1)
                return statuses
        return self._collect(room, self.pp_participants)

    def _collect(self, room: int, ranks: tuple[str, ...]) -> list[Optional[KVPoll]]:
        """:meth:`collect` from the store's room view (one read; with the near cache, maybe no round trip)."""
        started = _monotonic()
        try:
            view: RoomView = self._call(lambda: self.store.room(room))
        except InvalidRoomError:
            return [KVPoll.Failed] * len(ranks)
        except _Unanswered as unanswered:
            self._failed(room, unanswered.reason)
            return [KVPoll.Failed] * len(ranks)
        statuses = [self._status_in(view, name) for name in ranks]
        if self.participant in ranks and statuses[ranks.index(self.participant)] is None:
            self._vanished(room, started)
        if self._failed_here.reason(room) is not None and self.participant in ranks:
            statuses[ranks.index(self.participant)] = KVPoll.Failed
        return statuses

    def consensus(self, room: int) -> RoomConsensus:
        """The room's consensus over the PP ranks, leases included (one round trip)."""
        if self.pp_participants is None:
            raise InvalidArgumentError("consensus() needs pp_participants: this map was built without pipeline ranks")
        ranks = self.pp_participants
        try:
            consensus = self._call(lambda: self.store.room_status(room, ranks))
        except InvalidRoomError:
            return RoomConsensus(KVPoll.Failed, reason=invalid_room_reason(room))
        except _Unanswered as unanswered:
            self._failed_here.add(room, unanswered.reason)
            return RoomConsensus(KVPoll.Failed, reason=unanswered.reason)
        kept = self._failed_here.reason(room) if self.participant in ranks else None
        return consensus if kept is None else RoomConsensus(KVPoll.Failed, reason=kept)

    def collect_many(self, rooms: Sequence[int]) -> dict[int, list[Optional[KVPoll]]]:
        """:meth:`collect` for many rooms: one ``get_many`` per PP rank (round trips = ranks, not rooms); the rooms
        failed here, or whose entry Redis lost, read Failed in this participant's rank, as ``collect`` does."""
        if self.pp_participants is None:
            raise InvalidArgumentError(
                "collect_many() needs pp_participants: this map was built without pipeline ranks"
            )
        if self._rank_stores is None:
            self._rank_stores = [
                self.store if name == self.participant else self.store.for_participant(name)
                for name in self.pp_participants
            ]
        stores, ranks = self._rank_stores, len(self._rank_stores)
        started = time.monotonic()
        try:
            try:
                per_rank = self._call(lambda: [store.get_many(rooms) for store in stores])
            except InvalidRoomError:  # ids the store cannot hold read as Failed; the others are read as usual
                valid = [room for room in rooms if storable(room)]
                per_rank = self._call(lambda: [store.get_many(valid) for store in stores]) if valid else []
        except _Unanswered as unanswered:
            for room in rooms:
                self._failed_here.add(room, unanswered.reason)
            return {room: [KVPoll.Failed] * ranks for room in dict.fromkeys(rooms)}
        collected: dict[int, list[Optional[KVPoll]]] = {
            room: [statuses[room] for statuses in per_rank] if storable(room) else [KVPoll.Failed] * ranks
            for room in dict.fromkeys(rooms)
        }
        if self.participant in self.pp_participants:
            own = self.pp_participants.index(self.participant)
            for room in [room for room, statuses in collected.items() if statuses[own] is None]:
                self._vanished(room, started)
            for room in filter(self._failed_here.reason, collected):
                collected[room][own] = KVPoll.Failed
        return collected

    def update_status(self, room: int, status: KVPoll | int) -> UpdateResult:
        """Apply the update rule (one atomic script call) and return its outcome and the resulting status."""
        if storable(room):
            self._removals.reopened(room)
            if room in self._open.lost:  # Redis lost the room: nothing is written into it again
                return LOST_RESULT
        opening = isinstance(status, int) and status in STRICT_CREATORS  # a list would raise TypeError here
        started = _monotonic()
        try:
            result = self._call(lambda: self.store.update_status(room, status), reopen=opening)
        except InvalidRoomError:
            if opening:
                log.warning("participant %s: %s", self.participant, invalid_room_reason(room))
            return INVALID_ROOM_RESULT
        except _Unanswered as unanswered:
            self._failed(room, unanswered.reason)
            return UNANSWERED_RESULT
        if (lost := self._open.wrote(room, result, started)) is None:
            return result
        if result.outcome is Outcome.CREATED:  # the write found no entry and made one: it is not kept
            with suppress(_Unanswered, KVStatusError):  # else the entry expires with the room's TTL
                self._call(lambda: self.store.pop(room))
        self._failed(room, lost)
        return LOST_RESULT

    def record_failure(self, room: int, reason: str) -> bool:
        """``store.record_failure``: keep ``reason`` with the Failed entry (first reason wins); False when nothing was
        stored, or for a room id the store cannot hold."""
        try:
            return bool(self._call(lambda: self.store.record_failure(room, reason)))
        except (InvalidRoomError, _Unanswered):
            return False

    def __setitem__(self, room: int, status: KVPoll | int) -> None:
        self.update_status(room, status)

    def _remove(self, room: int) -> Optional[KVPoll]:
        """``store.pop`` (one round trip), remembered for another thread's racing ``m[room]`` (``Removals``); raises
        what :meth:`_call` raises."""
        lost = type(room) is int and room in self._open.lost
        self._failed_here.discard(room)
        self._open.removed(room)
        if not storable(room):
            return self._call(lambda: self.store.pop(room))  # raises InvalidRoomError: nothing to remember
        started, status = self._removals.begin(room), None
        try:
            status = self._call(lambda: self.store.pop(room))
        finally:
            self._removals.end(room, started, status)
        return KVPoll.Failed if status is None and lost else status  # what its reads answered

    def __delitem__(self, room: int) -> None:
        if self.pop(room, None) is None:  # Failed when nothing could be removed (a bad id, or Redis failed)
            raise KeyError(room)

    def pop(self, room: int, default: Any = _MISSING) -> Any:
        """Remove the entry; return the status it held, or ``default`` (``KeyError`` without one)."""
        try:
            status = self._remove(room)
        except (InvalidRoomError, _Unanswered):
            return KVPoll.Failed
        if status is not None:
            return status
        if default is _MISSING:
            raise KeyError(room)
        return default

    def clear_room(self, room: int) -> bool:
        """Remove the entry in one round trip; True if there was one."""
        try:
            return self._remove(room) is not None
        except (InvalidRoomError, _Unanswered):
            return False

    def __len__(self) -> int:
        raise TypeError(_LEN_ITER_MESSAGE)

    def __iter__(self) -> Any:
        raise TypeError(_LEN_ITER_MESSAGE)

    def __bool__(self) -> bool:
        return True

    def close(self) -> None:
        """Close the store's client and stop probing an outage (``PPConsensusStore.close`` stops its thread)."""
        self.outage.close()
        self.store.close()

    def __repr__(self) -> str:
        pp = f", pp_participants={list(self.pp_participants)!r}" if self.pp_participants else ""
        return f"RoomStatusMap({self.store!r}{pp})"
