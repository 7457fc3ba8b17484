"""The one send path (docs/design.md, "Layout"): :class:`AsyncSender` keeps each call's deadline (docs/guide.md,
"Deadline"), tells the observer, resends after NOSCRIPT and failovers and raises kvstatus errors. Read-only scripts
go out as ``EVALSHA_RO``, except from cluster clients (docs/operations.md, "Polls during a manual failover"). A call
goes out on a *transport*: the client's own (one non-transactional pipeline) unless the caller passes another."""

from __future__ import annotations

import time
from typing import Any, Optional, Protocol, TypeVar

from kvstatus.concurrency import AsyncGate, async_checkpoint, async_pipeline_route, async_sleep
from kvstatus.connection import failover_delays
from kvstatus.deadline import DEADLINE, enter_deadline, may_wait, time_left
from kvstatus.errors import BackendUnavailableError, ClientPoolExhausted
from kvstatus.model import StoreObserver
from kvstatus.replies import ReplyOrError, merge_shard_counts
from kvstatus.requests import (
    Call,
    Request,
    as_evalsha,
    as_functions,
    evalsha_fallback,
    merge,
    noscript_resend,
    scripts_of,
)
from kvstatus.translate import REDIS_ERRORS, checked, translate_error
from kvstatus.url import ConnectionOptions

T = TypeVar("T")


class AsyncTransport(Protocol):
    """Where a call's commands go. ``resend_delays``: seconds before each resend of a whole call that met an
    unavailable backend; :meth:`reset` runs before each such resend."""

    resend_delays: tuple[float, ...]

    async def io(self, calls: list[Call]) -> list[ReplyOrError]:
        """The replies of ``calls`` in one round trip, redis-py errors in place (never raised)."""

    async def reset(self) -> None: ...

    async def load(self, source: str) -> None: ...


class AsyncSender:
    """Sends :class:`~kvstatus.requests.Request` objects on a redis-py client (see the module docstring)."""

    def __init__(
        self,
        client: Any,
        options: ConnectionOptions,
        *,
        cluster: bool,
        functions: bool,
        metrics: Optional[StoreObserver],
        gate: Optional[AsyncGate] = None,
    ) -> None:
        """``gate``: the cluster client's gate its backend shares (:meth:`kvstatus.backend.Backend.gate`), or None."""
        self.client = client
        self.options = options
        self.cluster = cluster
        self.functions = functions  # every script call goes out as FCALL / FCALL_RO
        self.evalsha_only = cluster  # read-only scripts as EVALSHA, not EVALSHA_RO (see the module docstring)
        self.metrics = metrics
        self.deadline = options.deadline
        self.resend_delays = failover_delays(client, options)
        self.gate = gate
        if cluster:
            merge_shard_counts(client)

    async def send(self, request: Request[T], operation: str = "other", via: Optional[AsyncTransport] = None) -> T:
        """Send ``request`` (from the method ``operation``) on ``via`` (default: the client) and decode it."""
        metrics = self.metrics
        if metrics is None:
            return await self._deliver(request, via)
        started = time.perf_counter()
        try:
            result = await self._deliver(request, via)
        except Exception as exc:
            if not isinstance(exc, KeyError):  # check_status's KeyError is an answer, not an error
                metrics.on_error(exc)
            raise
        finally:
            metrics.on_call(operation, time.perf_counter() - started)
        _observe_result(metrics, operation, result)
        return result

    async def _deliver(self, request: Request[T], via: Optional[AsyncTransport]) -> T:
        if self.functions:
            request = as_functions(request)
        elif self.evalsha_only:
            request = as_evalsha(request)
        seconds = self.deadline + request.extra_seconds
        token = enter_deadline(seconds)  # a wait_for's read never outlasts the wait
        try:
            if via is not None:
                result = request.decode(await self._replies(request.calls, None, via, request.strict))
            elif self.gate is None:
                result = await self._send_now(request)
            else:
                if not await self.gate.acquire(time_left() or 0.0):
                    raise translate_error(ClientPoolExhausted(self.gate.limit, seconds))  # nothing was sent
                try:
                    result = await self._send_now(request)
                finally:
                    self.gate.release()
        finally:
            DEADLINE.reset(token)
        async_checkpoint()  # a cancel redis-py swallowed (its asyncio.wait_for) is raised, not a result returned
        return result

    async def _send_now(self, request: Request[T]) -> T:
        calls = request.calls
        if len(calls) == 1:  # the fast path: one command, straight to redis-py
            try:
                reply = await self.client.execute_command(*calls[0].args, **self._routed(calls[0]))
            except Exception as exc:  # noqa: BLE001 - NOSCRIPT, a failover, an error: the full path, from this reply on
                return request.decode(await self._replies(calls, [exc], self, request.strict))
            return request.decode([reply])
        return request.decode(await self._replies(calls, None, self, request.strict) if calls else [])

    async def _replies(
        self, calls: list[Call], first: Optional[list[ReplyOrError]], via: AsyncTransport, strict: Optional[int]
    ) -> list[ReplyOrError]:
        """The replies of ``calls``; the errors of the first ``strict`` (None: all) raise, the others stay in place."""
        attempt = 0
        while True:
            try:
                return await self._round_trip(calls, first, via, strict)
            except BackendUnavailableError:
                delays = via.resend_delays  # read each time: a transport may give up (a refused server)
                if attempt >= len(delays) or not may_wait(delays[attempt]):
                    raise
                first = None
                await async_sleep(delays[attempt])
                await via.reset()
                self._resent()
            attempt += 1

    async def _round_trip(
        self, calls: list[Call], replies: Optional[list[ReplyOrError]], via: AsyncTransport, strict: Optional[int]
    ) -> list[ReplyOrError]:
        replies = await via.io(calls) if replies is None else replies
        indices, calls = evalsha_fallback(calls, replies)
        if indices:  # EVALSHA_RO refused: resent as EVALSHA, and sent so from now on (a probe, not a resend)
            self.evalsha_only = True
            merge(replies, indices, await via.io([calls[i] for i in indices]))
        for as_eval in (False, True):
            indices, resend = noscript_resend(calls, replies, as_eval)
            if indices:
                for script in () if as_eval else scripts_of(resend):
                    await via.load(script.source)
                self._resent()
                merge(replies, indices, await via.io(resend))
        checked(calls[:strict], replies[:strict])
        return replies

    def _resent(self) -> None:
        if self.metrics is not None:
            self.metrics.on_resend()

    # The client's own transport.

    async def io(self, calls: list[Call]) -> list[ReplyOrError]:
        try:
            if len(calls) == 1:
                return [await self.client.execute_command(*calls[0].args, **self._routed(calls[0]))]
            async with self.client.pipeline(transaction=False) as pipe:
                for call in calls:
                    if self.cluster and call.script is not None:
                        pipe.execute_command(*call.args, **async_pipeline_route(self.client, call.args[3]))
                    else:
                        pipe.execute_command(*call.args, **self._routed(call))
                replies: list[ReplyOrError] = await pipe.execute(raise_on_error=False)
                return replies
        except REDIS_ERRORS as exc:
            return [exc] * len(calls)

    def _routed(self, call: Call) -> dict[str, object]:
        """redis-py's keyword arguments sending ``call`` to the node of its ``route`` (a cluster only)."""
        if call.route is None or not self.cluster:
            return {}
        return {"target_nodes": self.client.get_node_from_key(call.route)}

    async def reset(self) -> None:
        """Before a resend: a cluster client reloads its slot map."""
        if self.cluster:
            try:
                await self.client.nodes_manager.initialize()
            except REDIS_ERRORS:
                pass  # the resend reports the failure if the cluster is still down

    async def load(self, source: str) -> None:
        try:
            await self.client.script_load(source)
        except REDIS_ERRORS:
            pass  # the resend reports the failure, or runs the script by its source


def _observe_result(metrics: StoreObserver, operation: str, result: Any) -> None:
    """Tell ``metrics`` an update's outcomes, or the timeline a ``clear`` or ``pop`` removed (to ``on_cleared``)."""
    if operation == "update_status":
        metrics.on_update(result)
    elif operation == "update_many":
        metrics.on_updates(result.values())
    elif operation in ("clear", "pop") and result.timeline:
        on_cleared = getattr(metrics, "on_cleared", None)
        if on_cleared is not None:
            on_cleared(result.timeline)
