"""Helpers shared by the tests: backends, the async-to-sync adapter, key audits."""

from __future__ import annotations

import asyncio
import inspect
import itertools
import os
from typing import Any, Callable, Iterator, Optional

from kvstatus import AsyncStatusStore, StatusStore

_namespaces = itertools.count()


def fresh_namespace(tag: str = "t") -> str:
    return f"{tag}-{os.getpid()}-{next(_namespaces)}"


class SyncAdapter:
    """Presents an AsyncStatusStore with the sync store's interface, so one test body covers both."""

    def __init__(self, store: AsyncStatusStore, runner: asyncio.AbstractEventLoop) -> None:
        self._store = store
        self._runner = runner

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        if name == "for_participant":
            return lambda participant: SyncAdapter(attr(participant), self._runner)
        if inspect.iscoroutinefunction(attr):
            return lambda *args, **kwargs: self._runner.run_until_complete(attr(*args, **kwargs))
        return attr

    def __repr__(self) -> str:
        return f"SyncAdapter({self._store!r})"


class RedisUnderTest:
    """One Redis to test against: a raw client for assertions and a factory of stores on it."""

    def __init__(
        self,
        name: str,
        raw: Any,
        make_client: Callable[[], Any],
        asynchronous: bool,
        server: Optional[Any] = None,
    ) -> None:
        self.name = name
        self.raw = raw
        self.server = server
        self.namespace = fresh_namespace()
        self._make_client = make_client
        self._asynchronous = asynchronous
        self._runner: Optional[asyncio.AbstractEventLoop] = asyncio.new_event_loop() if asynchronous else None
        self._clients: list[Any] = []
        self._stores: list[Any] = []

    @property
    def asynchronous(self) -> bool:
        return self._asynchronous

    def store(self, **settings: Any) -> Any:
        """A store on this backend (sync, or async behind a SyncAdapter), namespace defaulting to this test's."""
        settings.setdefault("namespace", self.namespace)
        client = self._make_client()
        self._clients.append(client)
        store: Any = (
            StatusStore(client, **settings)
            if self._runner is None
            else SyncAdapter(AsyncStatusStore(client, **settings), self._runner)
        )
        self._stores.append(store)
        return store

    def release_lease(self, store: Any) -> None:
        """What ``store.close()`` does to its lease (released, its presence gone), without closing the client:
        a cluster's stores on this backend share its nodes' connections."""
        if self._runner is not None:
            self._runner.run_until_complete(store._store._keeper.close())
        else:
            store._keeper.close()

    def keys(self, namespace: Optional[str] = None) -> list[str]:
        """Every key of ``namespace`` (default: this test's), via SCAN on the raw client."""
        pattern = f"kvstatus:{namespace or self.namespace}:*"
        return sorted(k.decode() for k in self.raw.scan_iter(match=pattern, count=1000))

    def room_keys(self, namespace: Optional[str] = None) -> list[str]:
        """:meth:`keys` without the tombstones (``...}:t``) and lease records (``...:lease:<p>``)."""
        return [k for k in self.keys(namespace) if k.endswith("}")]

    def keys_without_ttl(self, namespace: Optional[str] = None) -> list[str]:
        return [k for k in self.keys(namespace) if self.raw.pttl(k) < 0]

    def close(self) -> None:
        # The stores first: a lease keeper left running would renew and watch on the session's server for the
        # rest of the run, and its commands would show in other tests' INFO commandstats.
        for store in self._stores:
            try:
                store.close()
            except Exception:  # noqa: BLE001  (a test may have closed it, or broken its server on purpose)
                pass
        for client in dict.fromkeys(self._clients):  # a shared client is closed once
            if self._runner is not None:
                self._runner.run_until_complete(client.aclose())
            else:
                client.close()
        if self._runner is not None:
            self._runner.close()


def all_combinations() -> Iterator[tuple[Optional[int], int]]:
    for current in (None, 0, 1, 2, 3, 4):
        for new in range(5):
            yield current, new


def client_count(server: Any) -> int:
    """How many clients ``server`` (a test's own RedisServer) has, not counting the one that asks."""
    admin = server.client()
    try:
        return len(admin.client_list()) - 1
    finally:
        admin.close()
