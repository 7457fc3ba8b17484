"""AsyncStatusStore: the same store on ``redis.asyncio``; every method is awaitable."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping
from typing import Any, Optional, TypeVar

from kvstatus.connection import connect_async
from kvstatus.consensus import RoomConsensus, consensus_calls
from kvstatus.deadline import DEADLINE, time_left
from kvstatus.errors import BackendUnavailableError, InvalidArgumentError
from kvstatus.keys import validate_name, validate_room
from kvstatus.leases import AsyncLeaseKeeper
from kvstatus.operations import as_functions
from kvstatus.requests import Call, Request
from kvstatus.rule import KVPoll, RoomView, UpdateResult
from kvstatus.storebase import (
    StoreBase,
    checked,
    may_resend,
    merge,
    noscript_resend,
    observe_error,
    observe_result,
    pool_exhausted,
    scripts_of,
)
from kvstatus.translate import REDIS_ERRORS
from kvstatus.waiting import async_wait_for

T = TypeVar("T")


class AsyncStatusStore(StoreBase):
    """:class:`~kvstatus.StatusStore` for asyncio: same arguments, same semantics, awaitable methods."""

    _connect = staticmethod(connect_async)
    _asynchronous = True
    _keeper_class = AsyncLeaseKeeper

    async def update_status(self, room: int, status: KVPoll | int) -> UpdateResult:
        return await self._write(self._core.update_status(room, status), "update_status", (room,))

    async def update_many(self, updates: Mapping[int, KVPoll | int]) -> dict[int, UpdateResult]:
        """Atomic per chunk of ``CHUNK_ROOMS`` rooms, not as a whole (see :meth:`StatusStore.update_many`)."""
        return await self._write(self._core.update_many(updates), "update_many", updates)

    async def check_status(self, room: int) -> KVPoll:
        if self._near is not None:
            return await self._near.check_status(room, self.participant)
        return await self._send(self._core.check_status(room), "check_status")

    async def get(self, room: int) -> Optional[KVPoll]:
        if self._near is not None:
            return await self._near.get(room, self.participant)
        return await self._send(self._core.get(room), "get")

    async def get_many(self, rooms: Iterable[int]) -> dict[int, Optional[KVPoll]]:
        if self._near is not None:
            return await self._near.get_many(rooms, self.participant)
        return await self._send(self._core.get_many(rooms), "get_many")

    async def clear(self, room: int) -> bool:
        return await self._write(self._core.clear(room), "clear", (room,))

    async def record_failure(self, room: int, reason: str) -> bool:
        return await self._write(self._core.record_failure(room, reason), "record_failure", (room,))

    async def room(self, room: int) -> RoomView:
        if self._near is not None:
            return await self._near.room(room)
        return await self._send(self._core.room(room), "room")

    async def wait_for(self, room: int, statuses: KVPoll | int | Iterable[KVPoll | int], timeout: Optional[float],
                       *, participant: Optional[str] = None) -> Optional[KVPoll]:
        """:meth:`StatusStore.wait_for <kvstatus.StatusStore.wait_for>`, awaitable."""
        who = self.participant if participant is None else validate_name(participant, "participant")
        key = self._core.schema.room_key(validate_room(room))
        reader = self._uncached(who)
        return await async_wait_for(self.client, key, who, statuses, timeout, read=lambda: reader.get(room))

    async def room_status(self, room: int, participants: Iterable[str]) -> RoomConsensus:
        return (await self._send(consensus_calls(self._core, [room], participants)))[room]

    async def room_statuses(self, rooms: Iterable[int], participants: Iterable[str]) -> dict[int, RoomConsensus]:
        return await self._send(consensus_calls(self._core, rooms, participants))

    async def acquire_lease(self) -> None:
        if self._keeper is None:
            raise InvalidArgumentError("this store has no lease: build it with lease_ttl=SECONDS")
        await self._keeper.refresh()

    async def close(self) -> None:
        if self._keeper is not None:
            await self._keeper.close()
        if self._near is not None:
            await self._near.close()
        await self.client.aclose()

    async def __aenter__(self) -> "AsyncStatusStore":
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # The send loop of store.py with awaits. Decisions live in storebase.py.

    async def _write(self, request: Request[T], operation: str, rooms: Any) -> T:
        """:meth:`StatusStore._write` with awaits."""
        if self._keeper is not None:
            await self._keeper.ensure()
        try:
            return await self._send(request, operation)
        finally:
            self._wrote(rooms)

    async def _send(self, request: Request[T], operation: str = "other") -> T:
        if self._metrics is not None:
            return await self._observed(request, operation)
        return await self._deliver(request)

    async def _observed(self, request: Request[T], operation: str) -> T:
        metrics = self._metrics
        assert metrics is not None
        started = time.perf_counter()
        try:
            result = await self._deliver(request)
        except Exception as exc:
            observe_error(metrics, exc)
            raise
        finally:
            metrics.on_call(operation, time.perf_counter() - started)
        observe_result(metrics, operation, result)
        return result

    async def _deliver(self, request: Request[T]) -> T:
        if self._functions:  # scripts="functions": every script call goes out as FCALL / FCALL_RO
            request = as_functions(request)
        token = DEADLINE.set(time.monotonic() + self._deadline + request.extra_seconds)
        try:
            if self._gate is None:
                return await self._send_now(request)
            gate, limit = self._gate
            if gate.locked():
                try:
                    await asyncio.wait_for(gate.acquire(), max(0.0, time_left() or 0.0))
                except asyncio.TimeoutError:
                    raise pool_exhausted(limit, self._deadline + request.extra_seconds) from None
            else:
                await gate.acquire()
            try:
                return await self._send_now(request)
            finally:
                gate.release()
        finally:
            DEADLINE.reset(token)

    async def _send_now(self, request: Request[T]) -> T:
        calls = request.calls
        if len(calls) == 1:
            try:
                reply = await self.client.execute_command(*calls[0].args)
            except Exception as exc:
                return request.decode(await self._replies(calls, [exc]))
            return request.decode([reply])
        return request.decode(await self._replies(calls, None) if calls else [])

    async def _replies(self, calls: list[Call], first: Optional[list[Any]]) -> list[Any]:
        for delay in self._failover_delays:
            try:
                return await self._round_trip(calls, first)
            except BackendUnavailableError:
                if not may_resend(delay):
                    raise
                first = None
                await asyncio.sleep(delay)
                await self._refresh_slots()
                self._resent()
        return await self._round_trip(calls, first)

    async def _round_trip(self, calls: list[Call], replies: Optional[list[Any]]) -> list[Any]:
        replies = await self._io(calls) if replies is None else replies
        for as_eval in (False, True):
            indices, resend = noscript_resend(calls, replies, as_eval)
            if indices:
                for script in () if as_eval else scripts_of(resend):
                    await self._load(script.source)
                self._resent()
                merge(replies, indices, await self._io(resend))
        return checked(calls, replies)

    async def _io(self, calls: list[Call]) -> list[Any]:
        try:
            if len(calls) == 1:
                return [await self.client.execute_command(*calls[0].args)]
            async with self.client.pipeline(transaction=False) as pipe:
                for call in calls:
                    pipe.execute_command(*call.args)
                return await pipe.execute(raise_on_error=False)
        except REDIS_ERRORS as exc:
            return [exc] * len(calls)

    async def _load(self, source: str) -> None:
        try:
            await self.client.script_load(source)
        except REDIS_ERRORS:
            pass

    async def _refresh_slots(self) -> None:
        if self._core.cluster:
            try:
                await self.client.nodes_manager.initialize()
            except REDIS_ERRORS:
                pass
