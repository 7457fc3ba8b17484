"""StatusStore: the room-status store on a blocking redis-py client."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any, Optional, TypeVar

from redis import exceptions as rx

from kvstatus.connection import connect
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
        """Send ``calls``; a cluster or Sentinel client resends them after the backoff while the backend moves."""
        for delay in self._failover_delays:
            try:
                return self._send_once(calls)
            except BackendUnavailableError:
                time.sleep(delay)
                self._refresh_topology()
        return self._send_once(calls)

    def _refresh_topology(self) -> None:
        """Re-read a cluster's slot map before a resend; a stale map keeps pointing at a dead master."""
        if self._core.cluster:
            try:
                self.client.nodes_manager.initialize()
            except REDIS_ERRORS:
                pass  # the resend reports the failure if the cluster is still down

    def _send_once(self, calls: list[Call]) -> list[Any]:
        try:
            if len(calls) == 1:
                return [self._execute(calls[0])]
            return self._pipeline(calls)
        except REDIS_ERRORS as exc:
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
        route = self._core.cluster
        with self.client.pipeline(transaction=False) as pipe:
            for call in calls:
                if route and call.script is not None:
                    # redis-py's sync cluster pipeline would ask a node COMMAND GETKEYS for every EVALSHA.
                    pipe.execute_command(*call.args, target_nodes=self.client.get_node_from_key(call.args[3]))
                else:
                    pipe.execute_command(*call.args)
            return pipe.execute(raise_on_error=False)
