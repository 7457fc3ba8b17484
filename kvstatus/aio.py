"""AsyncStatusStore: the same store on ``redis.asyncio``; every method is awaitable."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import Any, Optional, TypeVar

from kvstatus.connection import connect_async
from kvstatus.consensus import RoomConsensus
from kvstatus.errors import BackendUnavailableError, InvalidArgumentError
from kvstatus.leases import AsyncLeaseKeeper
from kvstatus.operations import Call, Request
from kvstatus.rule import KVPoll, RoomView, UpdateResult
from kvstatus.storebase import StoreBase, checked, merge, noscript_resend, scripts_of
from kvstatus.translate import REDIS_ERRORS

T = TypeVar("T")


class AsyncStatusStore(StoreBase):
    """:class:`~kvstatus.StatusStore` for asyncio: same arguments, same semantics, awaitable methods."""

    _connect = staticmethod(connect_async)
    _keeper_class = AsyncLeaseKeeper

    async def update_status(self, room: int, status: KVPoll | int) -> UpdateResult:
        request = self._core.update_status(room, status)
        if self._keeper is not None:
            await self._keeper.ensure()
        return await self._send(request)

    async def update_many(self, updates: Mapping[int, KVPoll | int]) -> dict[int, UpdateResult]:
        request = self._core.update_many(updates)
        if self._keeper is not None:
            await self._keeper.ensure()
        return await self._send(request)

    async def check_status(self, room: int) -> KVPoll:
        return await self._send(self._core.check_status(room))

    async def get(self, room: int) -> Optional[KVPoll]:
        return await self._send(self._core.get(room))

    async def get_many(self, rooms: Iterable[int]) -> dict[int, Optional[KVPoll]]:
        return await self._send(self._core.get_many(rooms))

    async def clear(self, room: int) -> bool:
        request = self._core.clear(room)
        if self._keeper is not None:
            await self._keeper.ensure()
        return await self._send(request)

    async def record_failure(self, room: int, reason: str) -> bool:
        request = self._core.record_failure(room, reason)
        if self._keeper is not None:
            await self._keeper.ensure()
        return await self._send(request)

    async def room(self, room: int) -> RoomView:
        return await self._send(self._core.room(room))

    async def room_status(self, room: int, participants: Iterable[str]) -> RoomConsensus:
        return (await self._send(self._core.room_statuses([room], participants)))[room]

    async def room_statuses(self, rooms: Iterable[int], participants: Iterable[str]) -> dict[int, RoomConsensus]:
        return await self._send(self._core.room_statuses(rooms, participants))

    async def acquire_lease(self) -> None:
        if self._keeper is None:
            raise InvalidArgumentError("this store has no lease: build it with lease_ttl=SECONDS")
        await self._keeper.refresh()

    async def close(self) -> None:
        if self._keeper is not None:
            await self._keeper.close()
        await self.client.aclose()

    async def __aenter__(self) -> "AsyncStatusStore":
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # The send loop of store.py with awaits. Decisions live in storebase.py.

    async def _send(self, request: Request[T]) -> T:
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
                first = None
                await asyncio.sleep(delay)
                await self._refresh_slots()
        return await self._round_trip(calls, first)

    async def _round_trip(self, calls: list[Call], replies: Optional[list[Any]]) -> list[Any]:
        replies = await self._io(calls) if replies is None else replies
        for as_eval in (False, True):
            indices, resend = noscript_resend(calls, replies, as_eval)
            if indices:
                for script in () if as_eval else scripts_of(resend):
                    await self._load(script.source)
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
