"""StatusStore: the room-status store on a blocking redis-py client."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any, Optional, TypeVar

from kvstatus.connection import connect
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
from kvstatus.waiting import wait_for

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
        try:
            return self._run(self._core.update_status(room, status))
        finally:
            self._wrote((room,))

    def update_many(self, updates: Mapping[int, KVPoll | int]) -> dict[int, UpdateResult]:
        """Apply the rule to many rooms in one round trip (atomically on a single Redis)."""
        try:
            return self._run(self._core.update_many(updates))
        finally:
            self._wrote(updates)

    def check_status(self, room: int) -> KVPoll:
        """This participant's status; raises ``KeyError(room)`` when there is no entry, like upstream."""
        if self._near is not None:
            return self._near.check_status(room, self.participant)
        return self._run(self._core.check_status(room))

    def get(self, room: int) -> Optional[KVPoll]:
        """This participant's status, or None."""
        if self._near is not None:
            return self._near.get(room, self.participant)
        return self._run(self._core.get(room))

    def get_many(self, rooms: Iterable[int]) -> dict[int, Optional[KVPoll]]:
        """This participant's status in each room, in one round trip."""
        if self._near is not None:
            return self._near.get_many(rooms, self.participant)
        return self._run(self._core.get_many(rooms))

    def clear(self, room: int) -> bool:
        """Remove this participant's entry and failure reason; True if anything was removed."""
        try:
            return self._run(self._core.clear(room))
        finally:
            self._wrote((room,))

    def record_failure(self, room: int, reason: str) -> bool:
        """Record why this participant's entry failed; True if stored (first reason wins, needs an entry)."""
        try:
            return self._run(self._core.record_failure(room, reason))
        finally:
            self._wrote((room,))

    def room(self, room: int) -> RoomView:
        """Every participant's entry in ``room``, with reasons and the TTL left."""
        if self._near is not None:
            return self._near.room(room)
        return self._run(self._core.room(room))

    def wait_for(self, room: int, statuses: KVPoll | int | Iterable[KVPoll | int], timeout: Optional[float],
                 *, participant: Optional[str] = None) -> Optional[KVPoll]:
        """Block until the entry of ``participant`` (default: this store's) in ``room`` has one of ``statuses``;
        return that status, or None when ``timeout`` seconds (None: no limit) pass first. Woken by Redis Pub/Sub
        (see :mod:`kvstatus.waiting`), re-reading every second and polling if the subscription breaks."""
        who = self.participant if participant is None else validate_name(participant, "participant")
        key = self.keys.room_key(validate_room(room))
        return wait_for(self.client, key, who, statuses, timeout, read=lambda: self._uncached(who).get(room))

    def close(self) -> None:
        if self._near is not None:
            self._near.close()
        self.client.close()

    def __enter__(self) -> "StatusStore":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _run(self, op: Op[T]) -> T:
        try:
            calls = next(op)
            while True:
                calls = op.send(self._drive(send_plan(calls, self._failover_delays, self._core.cluster)))
        except StopIteration as done:
            return done.value

    def _drive(self, plan: Plan[T]) -> T:
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
                    reply = self.client.execute_command(*argument.args)
                elif kind == PIPELINE:
                    reply = self._pipe(argument)
                elif kind == LOAD:
                    self.client.script_load(argument.source)
                elif kind == SLEEP:
                    time.sleep(argument)
                else:
                    self.client.nodes_manager.initialize()
            except REDIS_ERRORS as exc:
                error = exc

    def _pipe(self, calls: list[Call]) -> list[Any]:
        route = self._core.cluster
        with self.client.pipeline(transaction=False) as pipe:
            for call in calls:
                if route and call.script is not None:
                    # redis-py's sync cluster pipeline would ask a node COMMAND GETKEYS for every EVALSHA.
                    pipe.execute_command(*call.args, target_nodes=self.client.get_node_from_key(call.args[3]))
                else:
                    pipe.execute_command(*call.args)
            return pipe.execute(raise_on_error=False)
