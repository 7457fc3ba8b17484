"""wait_for: woken by the update script's publish, times out cleanly, survives a broken subscription."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from kvstatus import AsyncStatusStore, KVPoll, StatusStore
from kvstatus.admin.acl import acl_rules
from kvstatus.demo.server import RedisServer
from kvstatus.errors import InvalidArgumentError
from tests.nearcache.helpers import eventually

pytestmark = pytest.mark.real


def _later(seconds: float, action) -> threading.Thread:  # noqa: ANN001
    def run() -> None:
        time.sleep(seconds)
        action()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _subscribers(raw, channel: str) -> int:  # noqa: ANN001
    return int(raw.execute_command("PUBSUB", "SHARDNUMSUB", channel)[1])


def test_wakes_on_change_with_the_pushed_status(writer: StatusStore, redis_server: RedisServer) -> None:
    raw = redis_server.client()
    key = writer._core.schema.room_key(1)
    thread = _later(
        0.2,
        lambda: (
            eventually(lambda: _subscribers(raw, key) == 1),
            writer.update_status(1, KVPoll.Bootstrapping),
            writer.update_status(1, KVPoll.Transferring),
        ),
    )
    # recheck far beyond the test: only the push can wake it early
    got = writer.wait_for(1, [KVPoll.Transferring, KVPoll.Success], timeout=60)
    thread.join()
    assert got == KVPoll.Transferring
    assert _subscribers(raw, key) == 0  # the subscription was closed


def test_returns_at_once_when_already_there_and_watches_another_participant(writer: StatusStore) -> None:
    writer.update_status(2, KVPoll.Success)
    assert writer.wait_for(2, KVPoll.Success, timeout=0) == KVPoll.Success
    decode = writer.for_participant("decode-0")
    assert decode.wait_for(2, KVPoll.Success, timeout=0) is None  # its own entry is missing
    assert decode.wait_for(2, KVPoll.Success, timeout=0, participant="w") == KVPoll.Success
    _later(0.1, lambda: writer.for_participant("prefill-9").update_status(2, KVPoll.Bootstrapping))
    assert decode.wait_for(2, KVPoll.Bootstrapping, timeout=60, participant="prefill-9") == KVPoll.Bootstrapping


def test_times_out_cleanly(writer: StatusStore, redis_server: RedisServer) -> None:
    raw = redis_server.client()
    start = time.monotonic()
    assert writer.wait_for(3, KVPoll.Success, timeout=0.3) is None
    assert time.monotonic() - start >= 0.3
    writer.update_status(3, KVPoll.Transferring)  # another participant's change is not what it waits for
    assert writer.for_participant("x").wait_for(3, KVPoll.Transferring, timeout=0.2) is None
    assert not [c for c in raw.client_list() if int(c.get("ssub", 0)) or int(c.get("sub", 0))]  # none left open
    for _ in range(writer.client.connection_pool.max_connections + 10):  # no connection is leaked or counted
        assert writer.wait_for(3, KVPoll.Success, timeout=0) is None
    assert _subscribers(raw, writer._core.schema.room_key(3)) == 0


def test_survives_a_killed_subscription(writer: StatusStore, redis_server: RedisServer) -> None:
    raw = redis_server.client()
    key = writer._core.schema.room_key(4)

    def kill_then_update() -> None:
        eventually(lambda: _subscribers(raw, key) == 1)
        raw.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
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


def test_a_user_without_the_channel_still_updates_and_its_waiters_poll(
    redis_server: RedisServer, namespace: str
) -> None:
    admin = redis_server.client()
    rules = [r for r in acl_rules(namespace, password="pw-nc", scripts="eval") if not r.startswith("&")]
    admin.execute_command("ACL", "SETUSER", "nc-nochan", *rules)
    try:
        url = f"redis://nc-nochan:pw-nc@{redis_server.host}:{redis_server.port}/0"
        with StatusStore.from_url(url, namespace=namespace, participant="w") as store:
            assert store.update_status(6, KVPoll.Bootstrapping).status == KVPoll.Bootstrapping  # no NOPERM
            _later(0.2, lambda: store.update_status(6, KVPoll.Success))
            assert store.wait_for(6, KVPoll.Success, timeout=60) == KVPoll.Success  # by polling
    finally:
        admin.execute_command("ACL", "DELUSER", "nc-nochan")


def test_the_recipe_user_gets_pushes_and_the_cache(redis_server: RedisServer, namespace: str) -> None:
    admin = redis_server.client()
    admin.execute_command("ACL", "SETUSER", "nc-recipe", *acl_rules(namespace, password="pw-nc", scripts="eval"))
    try:
        url = f"redis://nc-recipe:pw-nc@{redis_server.host}:{redis_server.port}/0"
        with StatusStore.from_url(url, namespace=namespace, participant="w", near_cache=True) as store:
            assert store.get(7) is None
            raw = redis_server.client()
            key = store._core.schema.room_key(7)
            _later(
                0.1,
                lambda: (eventually(lambda: _subscribers(raw, key) == 1), store.update_status(7, KVPoll.Bootstrapping)),
            )
            assert store.wait_for(7, KVPoll.Bootstrapping, timeout=60) == KVPoll.Bootstrapping
            assert store.get(7) == KVPoll.Bootstrapping
        from kvstatus.admin.doctor import run_checks
        from kvstatus.connection import connect
        from kvstatus.keys import KeySchema

        checks = {c.name: c for c in run_checks(connect(url), KeySchema(namespace))}
        assert checks["near cache"].ok and checks["wait_for push"].ok, checks
    finally:
        admin.execute_command("ACL", "DELUSER", "nc-recipe")


def test_doctor_names_what_a_user_without_tracking_lacks(redis_server: RedisServer, namespace: str) -> None:
    from kvstatus.admin.doctor import run_checks
    from kvstatus.connection import connect
    from kvstatus.keys import KeySchema

    admin = redis_server.client()
    admin.execute_command(
        "ACL",
        "SETUSER",
        "nc-old",
        *acl_rules(namespace, password="pw-nc", scripts="eval"),
        "-client|tracking",
        "-ssubscribe",
        "-subscribe",
    )
    try:
        url = f"redis://nc-old:pw-nc@{redis_server.host}:{redis_server.port}/0"
        checks = {c.name: c for c in run_checks(connect(url), KeySchema(namespace))}
        # Both features are optional: reported with what is missing, never a failed doctor.
        assert checks["near cache"].detail.startswith("not available to this user: ")
        assert "client|tracking" in checks["near cache"].detail
        assert checks["wait_for push"].detail.startswith("not available to this user: ")
        assert "polls instead" in checks["wait_for push"].detail and "+ssubscribe" in checks["wait_for push"].detail
        assert all(c.ok for c in checks.values()), checks
    finally:
        admin.execute_command("ACL", "DELUSER", "nc-old")
