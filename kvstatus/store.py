"""StatusStore: the room-status store on a blocking redis-py client."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Optional, TypeVar

from redis import exceptions as rx

from kvstatus.connection import connect
from kvstatus.driver import StoreBase, raise_first_error, scripts_to_reload, translate_error, unique_scripts
from kvstatus.operations import Call, Op
from kvstatus.status import KVPoll, RoomView, UpdateResult

T = TypeVar("T")


class StatusStore(StoreBase):
    """Room statuses of one namespace, shared by every process that uses the same Redis.

    ``StatusStore(client, namespace=...)`` wraps an existing redis-py client
    (``Redis`` or ``RedisCluster``); :meth:`from_url` builds one. ``ttl`` is in
    seconds. Every method is one round trip.
    """

    _connect = staticmethod(connect)

    def update_status(self, room: int, status: KVPoll | int) -> UpdateResult:
        """Apply the update rule to this participant's entry; returns the outcome and resulting status."""
        return self._run(self._core.update_status(room, status))

    def update_many(self, updates: Mapping[int, KVPoll | int]) -> dict[int, UpdateResult]:
        """Apply the rule to many rooms in one round trip (atomically on a single Redis)."""
        return self._run(self._core.update_many(updates))

    def check_status(self, room: int) -> KVPoll:
        """This participant's status; raises ``KeyError(room)`` when there is no entry, like upstream."""
        return self._run(self._core.check_status(room))

    def get(self, room: int) -> Optional[KVPoll]:
        """This participant's status, or None."""
        return self._run(self._core.get(room))

    def get_many(self, rooms: Iterable[int]) -> dict[int, Optional[KVPoll]]:
        """This participant's status in each room, in one round trip."""
        return self._run(self._core.get_many(rooms))

    def clear(self, room: int) -> bool:
        """Remove this participant's entry and failure reason; True if anything was removed."""
        return self._run(self._core.clear(room))

    def record_failure(self, room: int, reason: str) -> bool:
        """Record why this participant's entry failed; True if stored (first reason wins, needs an entry)."""
        return self._run(self._core.record_failure(room, reason))

    def room(self, room: int) -> RoomView:
        """Every participant's entry in ``room``, with reasons and the TTL left."""
        return self._run(self._core.room(room))

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> "StatusStore":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _run(self, op: Op[T]) -> T:
        try:
            calls = next(op)
            while True:
                calls = op.send(self._send(calls))
        except StopIteration as done:
            return done.value

    def _send(self, calls: list[Call]) -> list[Any]:
        try:
            if len(calls) == 1:
                return [self._execute(calls[0])]
            return self._pipeline(calls)
        except rx.RedisError as exc:
            raise translate_error(exc, calls[0] if len(calls) == 1 else None) from exc

    def _execute(self, call: Call) -> Any:
        try:
            return self.client.execute_command(*call.args)
        except rx.NoScriptError:
            if call.script is None:
                raise
            self.client.script_load(call.script.source)
            return self.client.execute_command(*call.args)

    def _pipeline(self, calls: list[Call]) -> list[Any]:
        replies = self._pipe(calls)
        again = scripts_to_reload(calls, replies)
        if again:
            for script in unique_scripts(calls, again):
                self.client.script_load(script.source)
            for i, reply in zip(again, self._pipe([calls[i] for i in again])):
                replies[i] = reply
        raise_first_error(calls, replies)
        return replies

    def _pipe(self, calls: list[Call]) -> list[Any]:
        with self.client.pipeline(transaction=False) as pipe:
            for call in calls:
                pipe.execute_command(*call.args)
            return pipe.execute(raise_on_error=False)
