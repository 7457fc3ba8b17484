"""wait_for: woken by CLIENT TRACKING when its room changes (on a near cache: the store's own, or the one its
backend keeps for waits), times out cleanly, survives a broken link, and the writers publish nothing for it."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Optional

import pytest

from kvstatus import AsyncStatusStore, KVPoll, StatusStore
from kvstatus._sync.store import wait_for
from kvstatus.admin.acl import acl_rules
from kvstatus.errors import InvalidArgumentError
from tests.nearcache.helpers import eventually
from tests.servers import RedisServer
from tests.sglang.support import room_command_counts

pytestmark = pytest.mark.real


def _later(seconds: float, action) -> threading.Thread:  # noqa: ANN001
    def run() -> None:
        time.sleep(seconds)
        action()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _watches(raw: Any) -> list[int]:
    """IDs of the server's near-cache connections: each tracked data connection (flag ``t``) and the invalidation
    connection its REDIRECT names."""
    tracked = [c for c in raw.client_list() if "t" in c["flags"]]
    return sorted({int(c["id"]) for c in tracked} | {int(c["redir"]) for c in tracked if int(c.get("redir", 0)) > 0})


def _invalidations(raw: Any) -> list[int]:
    """IDs of the invalidation connections the server's tracked connections redirect to."""
    return sorted({int(c["redir"]) for c in raw.client_list() if "t" in c["flags"] and int(c.get("redir", 0)) > 0})


def _cache_of(store: StatusStore) -> Any:
    cache = store.near_cache or store._waits_cache()
    assert cache is not None
    return cache


def test_a_change_wakes_the_waiter_through_tracking_alone(writer: StatusStore, redis_server: RedisServer) -> None:
    raw = redis_server.client()
    others = set(_watches(raw))  # other tests' stores, not yet collected
    cache = _cache_of(writer)
    first_read, reads = threading.Event(), []

    def read() -> Optional[KVPoll]:
        reads.append(cache.get(1, ("w", True)))
        first_read.set()
        return reads[-1]

    def update() -> None:
        first_read.wait(30)  # armed and read: from here only the watch can tell the waiter
        writer.update_status(1, KVPoll.Bootstrapping)
        writer.update_status(1, KVPoll.Transferring)

    thread = _later(0, update)
    # a recheck and a poll interval beyond the timeout: only CLIENT TRACKING's invalidation can wake it
    got = wait_for(cache, 1, [KVPoll.Transferring, KVPoll.Success], 30, read, 5.0, recheck=60, poll_interval=60)
    thread.join()
    assert got == KVPoll.Transferring
    # the first; maybe one more for the wake of the link's opening (a new link empties the cache: whatever was
    # read before it is read again); then one per change it was told of
    assert reads[0] is None and 2 <= len(reads) <= 4
    ours = set(_watches(raw)) - others
    assert len(ours) == 2  # the backend's near cache for waits: a data and an invalidation connection, kept
    writer.close()
    # and closed with the store (another test's thread may open its own); Redis drops a closed client on its next
    # turn, so CLIENT LIST may show it a moment after close() returned
    eventually(lambda: ours.isdisjoint(_watches(raw)), what="the waits' near cache gone from CLIENT LIST")


def test_returns_at_once_when_already_there_and_watches_another_participant(writer: StatusStore) -> None:
    writer.update_status(2, KVPoll.Success)
    assert writer.wait_for(2, KVPoll.Success, timeout=0) == KVPoll.Success
    decode = writer.for_participant("decode-0")
    assert decode.wait_for(2, KVPoll.Success, timeout=0) is None  # its own entry is missing
    assert decode.wait_for(2, KVPoll.Success, timeout=0, participant="w") == KVPoll.Success
    later = _later(0.1, lambda: writer.for_participant("prefill-9").update_status(2, KVPoll.Bootstrapping))
    assert decode.wait_for(2, KVPoll.Bootstrapping, timeout=60, participant="prefill-9") == KVPoll.Bootstrapping
    later.join()


def test_times_out_cleanly(writer: StatusStore, redis_server: RedisServer) -> None:
    raw = redis_server.client()
    others = set(_watches(raw))
    start = time.monotonic()
    assert writer.wait_for(3, KVPoll.Success, timeout=0.3) is None
    assert time.monotonic() - start >= 0.3
    writer.update_status(3, KVPoll.Transferring)  # another participant's change is not what it waits for
    assert writer.for_participant("x").wait_for(3, KVPoll.Transferring, timeout=0.2) is None
    assert len(set(_watches(raw)) - others) == 2  # the waits' near cache, idle
    for _ in range(writer.client.connection_pool.max_connections + 10):  # no connection is leaked or counted
        assert writer.wait_for(3, KVPoll.Success, timeout=0) is None
    assert len(set(_watches(raw)) - others) == 2


def test_survives_a_killed_invalidation_connection(writer: StatusStore, redis_server: RedisServer) -> None:
    raw = redis_server.client()
    others = set(_invalidations(raw))

    def kill_then_update() -> None:
        (watch,) = eventually(lambda: set(_invalidations(raw)) - others)
        raw.execute_command("CLIENT", "KILL", "ID", watch)
        time.sleep(0.1)
        writer.update_status(4, KVPoll.WaitingForInput)

    thread = _later(0.1, kill_then_update)
    assert writer.wait_for(4, KVPoll.WaitingForInput, timeout=60) == KVPoll.WaitingForInput
    thread.join()


def test_bad_arguments(writer: StatusStore) -> None:
    for statuses in ([], "Success", [7], None):
        with pytest.raises((InvalidArgumentError, ValueError)):
            writer.wait_for(1, statuses, timeout=0)
    for timeout in (-1, float("nan"), "1"):
        with pytest.raises(InvalidArgumentError):
            writer.wait_for(1, KVPoll.Success, timeout=timeout)


def test_async_wait_for(url: str, namespace: str, writer: StatusStore) -> None:
    async def run() -> None:
        async with AsyncStatusStore.from_url(url, namespace=namespace, participant="w") as store:
            assert await store.wait_for(5, KVPoll.Success, timeout=0.1) is None
            waiter = asyncio.create_task(store.wait_for(5, {KVPoll.Failed, KVPoll.Success}, timeout=60))
            await asyncio.sleep(0.2)
            await store.update_status(5, KVPoll.Bootstrapping)
            await store.update_status(5, KVPoll.Failed)
            assert await waiter == KVPoll.Failed

    asyncio.run(run())


def test_writers_publish_nothing(writer: StatusStore, redis_server: RedisServer) -> None:
    """The update and cancel scripts write the room and nothing else: no PUBLISH a waiter would need."""
    base = writer._core.schema.base

    def work() -> None:
        writer.update_status(8, KVPoll.Bootstrapping)
        writer.for_participant("decode-0").update_status(8, KVPoll.WaitingForInput)
        writer.update_status(8, KVPoll.Failed)
        writer.cancel(9, "router gave up")

    counts = room_command_counts(redis_server.client(), base, work)
    assert counts.get("hset", 0) >= 3, counts
    assert not {"publish", "spublish"} & set(counts), counts


def test_a_user_without_tracking_still_updates_and_its_waiters_poll(redis_server: RedisServer, namespace: str) -> None:
    admin = redis_server.client()
    rules = acl_rules(namespace, password="pw-nc", scripts="eval", near_cache=False)
    assert "+client|tracking" not in rules
    admin.execute_command("ACL", "SETUSER", "nc-notrack", *rules)
    try:
        url = f"redis://nc-notrack:pw-nc@{redis_server.host}:{redis_server.port}/0"
        with StatusStore.from_url(url, namespace=namespace, participant="w") as store:
            assert store.update_status(6, KVPoll.Bootstrapping).status == KVPoll.Bootstrapping
            later = _later(0.2, lambda: store.update_status(6, KVPoll.Success))
            assert store.wait_for(6, KVPoll.Success, timeout=60) == KVPoll.Success  # by polling
            later.join()  # its update_status has returned before the store closes
            assert not [c for c in admin.client_list() if c["user"] == "nc-notrack" and "t" in c["flags"]]
    finally:
        admin.execute_command("ACL", "DELUSER", "nc-notrack")


def test_the_recipe_user_gets_pushes_and_the_cache(redis_server: RedisServer, namespace: str) -> None:
    admin = redis_server.client()
    admin.execute_command("ACL", "SETUSER", "nc-recipe", *acl_rules(namespace, password="pw-nc", scripts="eval"))
    try:
        url = f"redis://nc-recipe:pw-nc@{redis_server.host}:{redis_server.port}/0"
        with StatusStore.from_url(url, namespace=namespace, participant="w", near_cache=True) as store:
            assert store.get(7) is None
            cache = store.near_cache
            assert cache is not None
            writer = _later(
                0.1,
                lambda: (
                    eventually(lambda: cache.state.waiters, what="the wait watching room 7"),
                    store.update_status(7, KVPoll.Bootstrapping),
                ),
            )
            assert store.wait_for(7, KVPoll.Bootstrapping, timeout=60) == KVPoll.Bootstrapping
            assert store.get(7) == KVPoll.Bootstrapping
            writer.join()  # its update_status has returned before the store closes
        from kvstatus.admin.doctor import run_checks
        from kvstatus.connection import connect
        from kvstatus.keys import KeySchema

        checks = {c.name: c for c in run_checks(connect(url), KeySchema(namespace))}
        assert checks["near cache"].ok and checks["wait_for push"].ok, checks
        assert checks["wait_for push"].detail == "changes are pushed to waiters"
        import redis

        tenant = redis.Redis.from_url(url)
        for channel in (f"kvstatus:{namespace}:{{7}}", "__redis__:invalidate"):  # a tenant publishes nowhere
            for command in ("PUBLISH", "SPUBLISH"):
                with pytest.raises(redis.exceptions.NoPermissionError):
                    tenant.execute_command(command, channel, "x")
        tenant.close()
    finally:
        admin.execute_command("ACL", "DELUSER", "nc-recipe")


def test_doctor_names_what_a_user_without_tracking_lacks(redis_server: RedisServer, namespace: str) -> None:
    from kvstatus.admin.doctor import run_checks
    from kvstatus.connection import connect
    from kvstatus.keys import KeySchema

    admin = redis_server.client()
    admin.execute_command(
        "ACL", "SETUSER", "nc-old", *acl_rules(namespace, password="pw-nc", scripts="eval"), "-client|tracking"
    )
    try:
        url = f"redis://nc-old:pw-nc@{redis_server.host}:{redis_server.port}/0"
        checks = {c.name: c for c in run_checks(connect(url), KeySchema(namespace))}
        # Both features are optional: reported with what is missing, never a failed doctor.
        assert checks["near cache"].detail.startswith("not available to this user: ")
        assert "client|tracking" in checks["near cache"].detail
        detail = checks["wait_for push"].detail
        assert detail.startswith("not available to this user: cannot watch a room (")
        assert "polls every 50 ms" in detail and "+client|tracking" in detail and "no permissions" in detail
        assert all(c.ok for c in checks.values()), checks
    finally:
        admin.execute_command("ACL", "DELUSER", "nc-old")


def test_waits_reuse_the_backends_near_cache_and_a_dead_link_is_replaced(
    writer: StatusStore, redis_server: RedisServer
) -> None:
    raw = redis_server.client()
    others = set(_watches(raw))
    writer.update_status(10, KVPoll.Success)
    assert writer.wait_for(10, KVPoll.Success, timeout=5) == KVPoll.Success
    first = set(_watches(raw)) - others  # the waits' near cache, kept open
    for _ in range(5):
        assert writer.wait_for(10, KVPoll.Success, timeout=5) == KVPoll.Success
    assert set(_watches(raw)) - others == first
    (inval,) = set(_invalidations(raw)) & first
    raw.execute_command("CLIENT", "KILL", "ID", inval)  # the link dies while no wait runs

    cache = _cache_of(writer)
    first_read = threading.Event()

    def read() -> Optional[KVPoll]:
        first_read.set()
        return cache.get(11, ("w", True))

    thread = _later(0, lambda: (first_read.wait(30), writer.update_status(11, KVPoll.Success)))
    # push only (recheck and poll beyond the wait): the dead link was replaced, not trusted
    assert wait_for(cache, 11, KVPoll.Success, 30, read, 5.0, recheck=60, poll_interval=60) == KVPoll.Success
    thread.join()

    def replaced() -> bool:  # Redis drops a closed client on its next turn: the old link may show a moment longer
        now = set(_watches(raw)) - others
        return len(now) == 2 and not now & first

    eventually(replaced, what="a new link (a data and an invalidation connection) in place of the dead one")


def test_a_change_of_another_room_wakes_no_wait(writer: StatusStore, redis_server: RedisServer) -> None:
    writer.update_status(20, KVPoll.Bootstrapping)
    assert writer.wait_for(20, KVPoll.Bootstrapping, timeout=5) == KVPoll.Bootstrapping  # room 20 stays tracked
    cache = _cache_of(writer)
    first_read, reads = threading.Event(), []

    def read() -> Optional[KVPoll]:
        first_read.set()
        reads.append(cache.get(21, ("w", True)))
        return reads[-1]

    def update() -> None:
        first_read.wait(30)
        for peer in ("decode-0", "decode-1"):  # room 20: tracked by the same cache
            writer.for_participant(peer).update_status(20, KVPoll.WaitingForInput)
        writer.update_status(21, KVPoll.Success)

    thread = _later(0, update)
    assert wait_for(cache, 21, KVPoll.Success, 30, read, 5.0, recheck=60, poll_interval=60) == KVPoll.Success
    thread.join()
    assert reads == [None, KVPoll.Success]  # room 20's writes woke nothing: one read for room 21's change


def test_a_user_without_tracking_polls_without_reconnecting(redis_server: RedisServer, namespace: str) -> None:
    """The server refuses the waits' near cache its CLIENT TRACKING once: the waits poll on, and open no
    connection per poll."""
    admin = redis_server.client()
    rules = acl_rules(namespace, password="pw-nc", scripts="eval") + ["-client|tracking"]
    admin.execute_command("ACL", "SETUSER", "nc-notrack2", *rules)
    try:
        url = f"redis://nc-notrack2:pw-nc@{redis_server.host}:{redis_server.port}/0"
        with StatusStore.from_url(url, namespace=namespace, participant="w") as store:
            store.update_status(12, KVPoll.Bootstrapping)
            opened = int(admin.info("stats")["total_connections_received"])
            assert store.wait_for(12, KVPoll.Success, timeout=1.0) is None  # 20 polls of 50 ms
            assert int(admin.info("stats")["total_connections_received"]) - opened <= 3
            assert _cache_of(store).refused
    finally:
        admin.execute_command("ACL", "DELUSER", "nc-notrack2")


def test_tracking_taken_away_keeps_the_open_link(redis_server: RedisServer, namespace: str) -> None:
    """The ACL takes +client|tracking away while the waits' near cache idles: its link tracks on, and the next
    wait asks no new connection of the server (which would be refused)."""
    admin = redis_server.client()
    admin.execute_command("ACL", "SETUSER", "nc-lost", *acl_rules(namespace, password="pw-nc", scripts="eval"))
    try:
        url = f"redis://nc-lost:pw-nc@{redis_server.host}:{redis_server.port}/0"
        with StatusStore.from_url(url, namespace=namespace, participant="w") as store:
            store.update_status(13, KVPoll.Bootstrapping)
            assert store.wait_for(13, KVPoll.Bootstrapping, timeout=5) == KVPoll.Bootstrapping
            admin.execute_command("ACL", "SETUSER", "nc-lost", "-client|tracking")
            opened = int(admin.info("stats")["total_connections_received"])
            later = _later(0.1, lambda: store.update_status(13, KVPoll.Success))
            assert store.wait_for(13, KVPoll.Success, timeout=30) == KVPoll.Success
            later.join()
            assert int(admin.info("stats")["total_connections_received"]) == opened
    finally:
        admin.execute_command("ACL", "DELUSER", "nc-lost")


def test_each_read_of_a_wait_ends_by_the_stores_deadline(writer: StatusStore) -> None:
    """Issue 36 (Low): ``wait_for(timeout=None)`` on a server hung before the call raised after 2 x the deadline.
    Each read of a wait now runs under its own step deadline: at most ``deadline`` seconds after it starts, and
    no later than the wait's end unless that leaves less than 0.5 s. Asserted on the deadlines themselves."""
    from kvstatus.deadline import DEADLINE

    cache = _cache_of(writer)
    steps: list[tuple[float, Optional[float]]] = []

    def read() -> Optional[KVPoll]:
        steps.append((time.monotonic(), DEADLINE.get()))
        return cache.get(30, ("w", True))

    assert wait_for(cache, 30, KVPoll.Success, 0.3, read, 5.0, recheck=0.1, poll_interval=0.1) is None
    assert len(steps) >= 2
    ends = steps[0][0] + 0.3  # the wait's end is at most this: it was taken before the first read
    for began, deadline in steps:
        assert deadline is not None and deadline <= began + 5.0
        assert deadline <= max(ends, began + 0.5)  # the wait's end, unless that leaves a step less than 0.5 s


def test_a_closed_cache_opens_no_link_and_its_waits_poll(writer: StatusStore) -> None:
    """A wait that outlives its near cache (another store on the backend closed it) reads on without it: the
    closed cache opens no link that nobody would close, and a new wait on it polls."""
    writer.update_status(40, KVPoll.Bootstrapping)
    assert writer.wait_for(40, KVPoll.Bootstrapping, timeout=5) == KVPoll.Bootstrapping
    cache = _cache_of(writer)
    assert cache.links.links
    cache.shut()
    assert cache.get(40, ("w", True)) == KVPoll.Bootstrapping
    assert not cache.links.links and not cache.watch(40, lambda: None)
    later = _later(0.1, lambda: writer.update_status(40, KVPoll.WaitingForInput))
    assert writer.wait_for(40, KVPoll.WaitingForInput, timeout=30) == KVPoll.WaitingForInput  # by polling
    later.join()
    assert not cache.links.links


def test_a_forked_child_waits_on_a_cache_of_its_own(writer: StatusStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """The waits' near cache is per process: a child forked after a wait does not read on its parent's links
    (one socket, two readers), it opens its own. The fork is stood in for by the process id."""
    import os

    writer.update_status(41, KVPoll.Bootstrapping)
    assert writer.wait_for(41, KVPoll.Bootstrapping, timeout=5) == KVPoll.Bootstrapping
    parent = _cache_of(writer)
    assert _cache_of(writer) is parent
    monkeypatch.setattr(os, "getpid", lambda: -7)
    child = _cache_of(writer)
    assert child is not parent and not child.links.links
    assert writer.wait_for(41, KVPoll.Bootstrapping, timeout=5) == KVPoll.Bootstrapping
    assert child.links.links and parent.links.links
