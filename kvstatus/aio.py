"""AsyncStatusStore: the same store on ``redis.asyncio``; every method is awaitable."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import Any, Optional, TypeVar

from redis import exceptions as rx

from kvstatus.connection import connect_async
from kvstatus.driver import (
    REDIS_ERRORS,
    StoreBase,
    raise_first_error,
    scripts_to_reload,
    translate_error,
    unique_scripts,
)
from kvstatus.errors import BackendUnavailableError
from kvstatus.operations import Call, Op
from kvstatus.status import KVPoll, RoomView, UpdateResult

T = TypeVar("T")


class AsyncStatusStore(StoreBase):
    """:class:`~kvstatus.StatusStore` for asyncio: same arguments, same semantics, awaitable methods."""

    _connect = staticmethod(connect_async)

    async def update_status(self, room: int, status: KVPoll | int) -> UpdateResult:
        return await self._run(self._core.update_status(room, status))

    async def update_many(self, updates: Mapping[int, KVPoll | int]) -> dict[int, UpdateResult]:
        return await self._run(self._core.update_many(updates))

    async def check_status(self, room: int) -> KVPoll:
        return await self._run(self._core.check_status(room))

    async def get(self, room: int) -> Optional[KVPoll]:
        return await self._run(self._core.get(room))

    async def get_many(self, rooms: Iterable[int]) -> dict[int, Optional[KVPoll]]:
        return await self._run(self._core.get_many(rooms))

    async def clear(self, room: int) -> bool:
        return await self._run(self._core.clear(room))

    async def record_failure(self, room: int, reason: str) -> bool:
        return await self._run(self._core.record_failure(room, reason))

    async def room(self, room: int) -> RoomView:
        return await self._run(self._core.room(room))

    async def close(self) -> None:
        await self.client.aclose()

    async def __aenter__(self) -> "AsyncStatusStore":
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def _run(self, op: Op[T]) -> T:
        try:
            calls = next(op)
            while True:
                calls = op.send(await self._send(calls))
        except StopIteration as done:
            return done.value

    async def _send(self, calls: list[Call]) -> list[Any]:
        """Send ``calls``; a cluster or Sentinel client resends them after the backoff while the backend moves."""
        for delay in self._failover_delays:
            try:
                return await self._send_once(calls)
            except BackendUnavailableError:
                await asyncio.sleep(delay)
                await self._refresh_topology()
        return await self._send_once(calls)

    async def _refresh_topology(self) -> None:
        """Re-read a cluster's slot map before a resend; a stale map keeps pointing at a dead master."""
        if self._core.cluster:
            try:
                await self.client.nodes_manager.initialize()
            except REDIS_ERRORS:
                pass  # the resend reports the failure if the cluster is still down

    async def _send_once(self, calls: list[Call]) -> list[Any]:
        try:
            if len(calls) == 1:
                return [await self._execute(calls[0])]
            return await self._pipeline(calls)
        except REDIS_ERRORS as exc:
            raise translate_error(exc, calls[0] if len(calls) == 1 else None) from exc

    async def _execute(self, call: Call) -> Any:
        try:
            return await self.client.execute_command(*call.args)
        except rx.NoScriptError:
            if call.script is None:
                raise
            await self.client.script_load(call.script.source)
            return await self.client.execute_command(*call.args)

    async def _pipeline(self, calls: list[Call]) -> list[Any]:
        replies = await self._pipe(calls)
        again = scripts_to_reload(calls, replies)
        if again:
            for script in unique_scripts(calls, again):
                await self.client.script_load(script.source)
            for i, reply in zip(again, await self._pipe([calls[i] for i in again])):
                replies[i] = reply
        raise_first_error(calls, replies)
        return replies

    async def _pipe(self, calls: list[Call]) -> list[Any]:
        async with self.client.pipeline(transaction=False) as pipe:
            for call in calls:
                pipe.execute_command(*call.args)
            return await pipe.execute(raise_on_error=False)
