"""Issue 19 item 4, run as an attack: tenant A's worker, scripted with raw RESP on sockets, asks Redis to track
tenant B's key prefix (``CLIENT TRACKING ON REDIRECT <id> BCAST PREFIX kvstatus:ns-b:``).

On the Redis versions kvstatus supports (verified here on the local redis-server), ACL key patterns do not cover
tracking prefixes: A receives the room ids B writes although it may not read B's keys. The recipe without the
near cache (``kvstatus acl --no-near-cache``) refuses the attack and still runs every store operation; ``doctor``
warns about a user that may track.
"""

from __future__ import annotations

import logging
import socket
import time
from typing import Any, Iterator

import pytest

from kvstatus import KVPoll, PermissionDeniedError, StatusStore
from kvstatus.admin.acl import acl_rules
from kvstatus.admin.doctor import run_checks, tracking_check
from kvstatus.admin.functions import load_functions
from kvstatus.keys import KeySchema
from tests.helpers.cli import invoke, run_cli
from tests.helpers.resp import resp
from tests.servers import RedisServer

pytestmark = pytest.mark.real

ADMIN = "admin-Tr4ck"
TENANT = "tenant-Tr4ck"


class Hostile:
    """Tenant A's connection, speaking RESP by hand: no kvstatus or redis-py code stands between it and Redis."""

    def __init__(self, server: RedisServer, user: str) -> None:
        self.sock = socket.create_connection((server.host, server.port), timeout=2)
        assert self.ask("AUTH", user, TENANT) == b"+OK\r\n"

    def ask(self, *args: Any) -> bytes:
        self.sock.sendall(resp(*args))
        return self.sock.recv(4096)

    def drain(self, seconds: float) -> bytes:
        got, end = b"", time.monotonic() + seconds
        while time.monotonic() < end:
            try:
                chunk = self.sock.recv(4096)
            except TimeoutError:
                break
            if not chunk:
                break
            got += chunk
        return got

    def close(self) -> None:
        self.sock.close()


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer(password=ADMIN) as started:
        with started.client() as admin:
            for user, namespace, near in (
                ("tenant-a", "ns-a", True),
                ("tenant-b", "ns-b", True),
                ("tenant-a-plain", "ns-a", False),
                ("tenant-a-plain-ro", "ns-a", False),
            ):
                rules = acl_rules(namespace, password=TENANT, near_cache=near, read_only=user.endswith("-ro"))
                admin.execute_command("ACL", "SETUSER", user, *rules)
            load_functions(admin)
        yield started


def _url(server: RedisServer, user: str) -> str:
    return f"redis://{user}:{TENANT}@{server.host}:{server.port}/0"


def _attack(server: RedisServer, user: str, room: int) -> tuple[bytes, bytes, bytes]:
    """A tracks B's prefix, B writes ``room``: (A's tracking reply, what A's listener received, A's direct read)."""
    listener, tracker = Hostile(server, user), Hostile(server, user)
    try:
        # RESP3: a REDIRECT target gets invalidations as pushes, without subscribing to any channel (the
        # recipe grants none for them), so the attack needs only +client|tracking +client|id.
        listener.ask("HELLO", "3")
        time.sleep(0.1)
        listener.drain(0.2)  # the rest of HELLO's map, if it came in pieces
        client_id = listener.ask("CLIENT", "ID")
        if client_id.startswith(b":"):
            reply = tracker.ask(
                "CLIENT", "TRACKING", "ON", "REDIRECT", int(client_id[1:]), "BCAST", "PREFIX", "kvstatus:ns-b:"
            )
        else:
            reply = tracker.ask("CLIENT", "TRACKING", "ON", "BCAST", "PREFIX", "kvstatus:ns-b:")
        with StatusStore.from_url(
            _url(server, "tenant-b"), namespace="ns-b", participant="p0", scripts="functions"
        ) as victim:
            victim.update_status(room, KVPoll.Bootstrapping)
        received = listener.drain(1.0)
        direct = tracker.ask("HGET", f"kvstatus:ns-b:{{{room}}}", "p0")
        return reply, received, direct
    finally:
        listener.close()
        tracker.close()


def test_the_recipe_with_tracking_leaks_another_namespaces_room_ids(server: RedisServer) -> None:
    reply, received, direct = _attack(server, "tenant-a", 424242)
    assert direct.startswith(b"-NOPERM")  # A may not read B's key...
    assert reply == b"+OK\r\n"  # ...but may track B's prefix (the server's limit, stated in doctor and acl)
    assert b"kvstatus:ns-b:{424242}" in received  # and so learns B's room id


def test_the_recipe_without_near_cache_refuses_the_attack(server: RedisServer) -> None:
    reply, received, direct = _attack(server, "tenant-a-plain", 434343)
    assert reply.startswith(b"-NOPERM") and b"client|tracking" in reply
    assert b"434343" not in received
    assert direct.startswith(b"-NOPERM")


def test_every_store_operation_works_without_the_near_cache_permissions(server: RedisServer) -> None:
    with StatusStore.from_url(
        _url(server, "tenant-a-plain"), namespace="ns-a", participant="p0", lease_ttl=3, scripts="functions"
    ) as store:
        assert store.update_status(5, KVPoll.Transferring).status is KVPoll.Transferring
        assert store.record_failure(5, "nixl timeout") is True
        assert store.get(5) is KVPoll.Transferring
        assert store.get_many([5, 6]) == {5: KVPoll.Transferring, 6: None}
        assert store.room(5).participants["p0"].reason == "nixl timeout"
        assert store.wait_for(5, KVPoll.Transferring, timeout=1) is KVPoll.Transferring
        assert store.clear(5) is True
    with StatusStore.from_url(_url(server, "tenant-a-plain-ro"), namespace="ns-a", scripts="functions") as reader:
        assert reader.get(5) is None
        with pytest.raises(PermissionDeniedError):
            reader.update_status(5, KVPoll.Bootstrapping)


@pytest.mark.parametrize("user, warned", [("tenant-a", True), ("tenant-a-plain", False), ("tenant-a-plain-ro", False)])
def test_doctor_warns_about_a_user_that_may_track(server: RedisServer, user: str, warned: bool) -> None:
    with server.client(username=user, password=TENANT) as client:
        checks = {c.name: c for c in run_checks(client, KeySchema("ns-a"), 600, "x", scripts="functions")}
    assert all(c.ok for c in checks.values()), checks
    detail = checks["tracking"].detail
    assert checks["tracking"].warning == warned and checks["tracking"].verdict == ("warn" if warned else "ok"), detail
    if warned:
        assert "kvstatus acl --no-near-cache" in detail and "one Redis per tenant" in detail
    else:
        assert "cannot run CLIENT TRACKING" in detail
    doctor = run_cli("--url", _url(server, user), "--namespace", "ns-a", "--scripts", "functions", "doctor")
    tracking = next(line.split() for line in doctor.stdout.splitlines() if " tracking " in line)
    assert doctor.returncode == 0 and tracking[0] == ("warn" if warned else "ok"), doctor.stdout
    assert ("this user may run CLIENT TRACKING" in doctor.stdout) == warned
    assert TENANT not in doctor.stdout + doctor.stderr


def _tracking_ids(server: RedisServer) -> set[str]:
    """The ids of tenant-a's connections with tracking on (flag t)."""
    clients = server.client().execute_command("CLIENT", "LIST")
    text = clients.decode() if isinstance(clients, bytes) else str(clients)
    return {
        line.split("id=")[1].split()[0]
        for line in text.splitlines()
        if "user=tenant-a " in line and "flags=" in line and "t" in line.split("flags=")[1].split()[0]
    }


def test_doctor_leaves_no_tracking_on(server: RedisServer) -> None:
    # Compared with before: another test of this module on the same server may still be closing its connection.
    before = _tracking_ids(server)
    with server.client(username="tenant-a", password=TENANT) as client:
        tracking_check(client, KeySchema("ns-a"))
        assert _tracking_ids(server) <= before


def test_an_admin_is_told_tracking_shows_it_nothing_new(server: RedisServer) -> None:
    with server.client() as admin:
        assert "not a tenant" in tracking_check(admin, KeySchema("ns-a")).detail


def test_the_acl_command_prints_both_variants_and_they_apply(server: RedisServer) -> None:
    plain = invoke(lambda url: None, "--namespace", "ns-c", "acl", "--no-near-cache")
    assert plain.exit_code == 0 and "no near cache for this user" in plain.stderr
    line = plain.stdout.strip()
    assert "client|tracking" not in line and "__redis__:invalidate" not in line and "+client|id" not in line
    assert line.startswith("ACL SETUSER kvstatus-ns-c reset on >PASSWORD ~kvstatus:ns-c:*")
    full = invoke(lambda url: None, "--namespace", "ns-c", "acl", "--read-only")
    assert "+client|tracking" in full.stdout and "dashboard-ns-c" in full.stdout
    assert "room ids other namespaces write" in full.stderr
    with server.client() as admin:
        admin.execute_command(*line.replace(">PASSWORD", f">{TENANT}").split())
    reply, received, _ = _attack(server, "kvstatus-ns-c", 454545)
    assert reply.startswith(b"-NOPERM") and b"454545" not in received


def test_a_near_cache_store_without_tracking_runs_uncached_and_says_so_once(
    server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="kvstatus"):
        with StatusStore.from_url(
            _url(server, "tenant-a-plain"), namespace="ns-a", participant="p1", near_cache=True, scripts="functions"
        ) as store:
            store.update_status(9, KVPoll.Bootstrapping)
            for _ in range(3):
                assert store.get(9) is KVPoll.Bootstrapping
    lines = [r.getMessage() for r in caplog.records if "client|tracking" in r.getMessage()]
    assert len(lines) == 1, lines
