"""The lease keeper: keeps a :class:`~kvstatus.leasestate.LeaseCore` alive in the background and
renews it before a write when it may have lapsed. Every renewal goes through the store's send path."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from kvstatus.concurrency import AsyncBackground, AsyncLock
from kvstatus.leasestate import LeaseCore, log


class AsyncLeaseKeeper:
    """Keeps ``core`` held; ``send`` is the store's send (the deadline, the observer and the error
    translation apply to every renewal)."""

    def __init__(self, core: LeaseCore, send: Callable[[Any], Awaitable[Any]]) -> None:
        self.core = core
        self._send = send
        self._lock = AsyncLock()
        self._background = AsyncBackground()

    async def ensure(self) -> None:
        """Before a write: acquire or renew when due; raise :class:`~kvstatus.errors.LeaseLostError` if lost."""
        core = self.core
        if core.fresh():
            return
        async with self._lock:
            if not core.lost and not core.fresh():
                await self._call("renew" if core.incarnation is not None and not core.released else "acquire")
        if core.lost:
            raise core.lost_error()

    async def refresh(self) -> None:
        """Acquire the lease, or renew it now; raise :class:`~kvstatus.errors.LeaseLostError` if it is lost."""
        async with self._lock:
            if not self.core.lost:
                await self._call("renew" if self.core.held else "acquire")
        if self.core.lost:
            raise self.core.lost_error()

    async def _call(self, op: str) -> None:
        sent_at = time.monotonic()
        reply = await self._send(self.core.request(op))
        self.core.settle(op, sent_at, reply)
        if op == "acquire" and not self._background.started:
            self._background.start(self._run, f"kvstatus-lease-{self.core.participant}")

    async def _run(self) -> None:
        core = self.core
        delay = core.next_delay()
        while not await self._background.wait(delay):
            try:
                async with self._lock:
                    if core.lost or core.released:
                        return
                    await self._call("renew")
                delay = core.next_delay()
            except Exception as exc:  # noqa: BLE001 - the keeper outlives Redis errors; writes report them
                log.warning("participant %s: lease renewal failed: %s", core.participant, exc)
                delay = core.interval
            if core.lost:
                return

    async def close(self) -> None:
        """Stop renewing and release the lease (best effort: an unreachable Redis lets it expire instead)."""
        await self._background.stop()
        async with self._lock:
            if self.core.held:
                try:
                    await self._call("release")
                except Exception as exc:  # noqa: BLE001
                    log.warning("participant %s: lease release failed (it will expire): %s", self.core.participant, exc)
