"""AsyncStatusStore: the same store on ``redis.asyncio``; every method is awaitable."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import Any, Optional, TypeVar

from kvstatus.connection import connect_async
from kvstatus.operations import Call, Op
from kvstatus.rule import KVPoll, RoomView, UpdateResult
from kvstatus.storebase import (
    EXECUTE,
    LOAD,
    PIPELINE,
    SLEEP,
    Plan,
    StoreBase,
    send_plan,
)
from kvstatus.keys import validate_name, validate_room
from kvstatus.translate import REDIS_ERRORS
from kvstatus.waiting import async_wait_for

T = TypeVar("T")


class AsyncStatusStore(StoreBase):
    """:class:`~kvstatus.StatusStore` for asyncio: same arguments, same semantics, awaitable methods."""

    _connect = staticmethod(connect_async)

    async def update_status(self, room: int, status: KVPoll | int) -> UpdateResult:
        try:
            return await self._run(self._core.update_status(room, status))
        finally:
            self._wrote((room,))

    async def update_many(self, updates: Mapping[int, KVPoll | int]) -> dict[int, UpdateResult]:
        try:
            return await self._run(self._core.update_many(updates))
        finally:
            self._wrote(updates)

    async def check_status(self, room: int) -> KVPoll:
        if self._near is not None:
            return await self._near.check_status(room, self.participant)
        return await self._run(self._core.check_status(room))

    async def get(self, room: int) -> Optional[KVPoll]:
        if self._near is not None:
            return await self._near.get(room, self.participant)
        return await self._run(self._core.get(room))

    async def get_many(self, rooms: Iterable[int]) -> dict[int, Optional[KVPoll]]:
        if self._near is not None:
            return await self._near.get_many(rooms, self.participant)
        return await self._run(self._core.get_many(rooms))

    async def clear(self, room: int) -> bool:
        try:
            return await self._run(self._core.clear(room))
        finally:
            self._wrote((room,))

    async def record_failure(self, room: int, reason: str) -> bool:
        try:
            return await self._run(self._core.record_failure(room, reason))
        finally:
            self._wrote((room,))

    async def room(self, room: int) -> RoomView:
        if self._near is not None:
            return await self._near.room(room)
        return await self._run(self._core.room(room))

    async def wait_for(self, room: int, statuses: KVPoll | int | Iterable[KVPoll | int], timeout: Optional[float],
                       *, participant: Optional[str] = None) -> Optional[KVPoll]:
        """:meth:`StatusStore.wait_for <kvstatus.StatusStore.wait_for>`, awaitable."""
        who = self.participant if participant is None else validate_name(participant, "participant")
        key = self.keys.room_key(validate_room(room))
        return await async_wait_for(self.client, key, who, statuses, timeout,
                                    read=lambda: self._uncached(who).get(room))

    async def close(self) -> None:
        if self._near is not None:
            await self._near.close()
        await self.client.aclose()

    async def __aenter__(self) -> "AsyncStatusStore":
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def _run(self, op: Op[T]) -> T:
        try:
            calls = next(op)
            while True:
                calls = op.send(await self._drive(send_plan(calls, self._failover_delays, self._core.cluster)))
        except StopIteration as done:
            return done.value

    async def _drive(self, plan: Plan[T]) -> T:
        """Perform the plan's actions, sending back each reply or throwing in each redis-py error."""
        reply: Any = None
        error: Optional[BaseException] = None
        while True:
            try:
                kind, argument = plan.send(reply) if error is None else plan.throw(error)
            except StopIteration as done:
                return done.value
            reply, error = None, None
            try:
                if kind == EXECUTE:
                    reply = await self.client.execute_command(*argument.args)
                elif kind == PIPELINE:
                    reply = await self._pipe(argument)
                elif kind == LOAD:
                    await self.client.script_load(argument.source)
                elif kind == SLEEP:
                    await asyncio.sleep(argument)
                else:
                    await self.client.nodes_manager.initialize()
            except REDIS_ERRORS as exc:
                error = exc

    async def _pipe(self, calls: list[Call]) -> list[Any]:
        async with self.client.pipeline(transaction=False) as pipe:
            for call in calls:
                pipe.execute_command(*call.args)
            return await pipe.execute(raise_on_error=False)
