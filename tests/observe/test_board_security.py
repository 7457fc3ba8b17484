"""Issue 19 item 7, run as an attack: tenant B's board (``kvstatus serve``) against a hostile page of tenant A
that uses DNS rebinding (its own domain name resolved to the board's address, so the browser sends
``Host: rebind.attacker.example``), and against a client without the board's token."""

from __future__ import annotations

import base64
import http.client
import json
from typing import Iterator, Optional

import pytest

from kvstatus import KVPoll, StatusStore
from kvstatus.admin.acl import acl_rules
from kvstatus.observe.board import Guard, basic_or_bearer, default_allowed_hosts, host_name
from tests.helpers.backends import fresh_namespace
from tests.helpers.cli import invoke
from tests.observe.support import ServerProcess, wait_until
from tests.servers import RedisServer

TOKEN = "board-t0ken-Secr3t"
REASON = "tenant-b secret failure reason"
PATHS = ["/", "/api/summary", "/api/rooms", "/api/rooms/7", "/api/changes"]


def fetch(port: int, path: str, host: str, auth: Optional[str] = None) -> tuple[int, str, dict[str, str]]:
    """One GET with exactly this Host header (what a rebinding browser sends)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.putrequest("GET", path, skip_host=True)
        conn.putheader("Host", host)
        if auth is not None:
            conn.putheader("Authorization", auth)
        conn.endheaders()
        response = conn.getresponse()
        return response.status, response.read().decode(), {k.lower(): v for k, v in response.getheaders()}
    finally:
        conn.close()


@pytest.fixture(scope="module")
def tenant_b(redis_server: RedisServer) -> Iterator[tuple[str, str]]:
    """Tenant B's namespace with one failed room, and its read-only user's URL (what the board runs as)."""
    namespace = fresh_namespace("tenant-b")
    with StatusStore.from_url(redis_server.url, namespace=namespace, participant="prefill-0") as store:
        store.update_status(7, KVPoll.Transferring)
        store.update_status(7, KVPoll.Failed)
        store.record_failure(7, REASON)
    user = f"board-{namespace}"
    admin = redis_server.client()
    admin.execute_command(
        "ACL", "SETUSER", user, *acl_rules(namespace, read_only=True, password="pw-b", scripts="eval")
    )
    yield namespace, f"redis://{user}:pw-b@{redis_server.host}:{redis_server.port}/0"
    admin.execute_command("ACL", "DELUSER", user)


def serve(url: str, namespace: str, *args: str, env: Optional[dict[str, str]] = None) -> ServerProcess:
    return ServerProcess(
        "--url", url, "--namespace", namespace, "serve", "--port", "0", "--interval", "0.3", *args, env=env
    )


@pytest.mark.real
def test_a_rebinding_page_reads_nothing_and_localhost_reads_everything(tenant_b: tuple[str, str]) -> None:
    namespace, url = tenant_b
    with serve(url, namespace) as board:
        port = board.port
        wait_until(lambda: json.loads(fetch(port, "/api/summary", f"127.0.0.1:{port}")[1])["ready"], 30, "a pass")
        for path in PATHS:
            for attacker in (
                f"rebind.attacker.example:{port}",
                "rebind.attacker.example",
                "localhost.attacker.example",
                "",
                f"evil.example:{port}:1",
            ):
                status, body, _ = fetch(port, path, attacker)
                assert status == 400, (path, attacker, status)
                assert "7" not in body and REASON not in body and "attacker" not in body
        for good in (f"localhost:{port}", f"127.0.0.1:{port}", f"LOCALHOST.:{port}", f"[::1]:{port}"):
            status, body, _ = fetch(port, "/api/rooms/7", good)
            assert status == 200 and REASON in body, (good, status, body)
        assert board.terminate() == 0
        assert "Traceback" not in board.output


@pytest.mark.real
def test_allow_host_adds_a_name_and_star_turns_the_check_off(tenant_b: tuple[str, str]) -> None:
    namespace, url = tenant_b
    with serve(url, namespace, "--allow-host", "Board.Internal") as board:
        assert fetch(board.port, "/api/rooms/7", f"board.internal:{board.port}")[0] == 200
        assert fetch(board.port, "/api/rooms/7", "rebind.attacker.example")[0] == 400
    with serve(url, namespace, "--allow-host", "*") as board:
        assert fetch(board.port, "/api/rooms/7", "rebind.attacker.example")[0] == 200
        assert "any Host header" in "".join(board.stderr)


@pytest.mark.real
def test_a_token_guards_the_page_and_the_json_api(tenant_b: tuple[str, str]) -> None:
    namespace, url = tenant_b
    with serve(url, namespace, env={"KVSTATUS_BOARD_TOKEN": TOKEN}) as board:
        port, host = board.port, f"127.0.0.1:{board.port}"
        basic = "Basic " + base64.b64encode(f"anyone:{TOKEN}".encode()).decode()
        for path in PATHS:
            for wrong in (
                None,
                "Bearer nope",
                f"Bearer {TOKEN}x",
                "Basic " + base64.b64encode(b"x:y").decode(),
                "Basic !!!",
                TOKEN,
                f"Token {TOKEN}",
            ):
                status, body, headers = fetch(port, path, host, wrong)
                assert status == 401, (path, wrong)
                assert REASON not in body and TOKEN not in body
                assert headers["www-authenticate"].startswith("Basic realm=")
            assert fetch(port, path, host, f"Bearer {TOKEN}")[0] == 200
            assert fetch(port, path, host, basic)[0] == 200
        assert fetch(port, "/api/rooms/7", "rebind.attacker.example", f"Bearer {TOKEN}")[0] == 400
        assert board.terminate() == 0
        assert TOKEN not in board.output and "token required" in board.output


def test_an_empty_token_is_a_usage_error() -> None:
    result = invoke(lambda url: None, "--namespace", "x", "serve", env={"KVSTATUS_BOARD_TOKEN": " "})
    assert result.exit_code == 2 and "the token is empty" in result.output


def test_serve_help_says_what_it_exposes_and_how_it_is_guarded() -> None:
    text = " ".join(invoke(lambda url: None, "serve", "--help").output.split())
    for phrase in (
        "What it exposes",
        "every room id",
        "failure reasons",
        "Redis URL with its password masked",
        "/api/",
        "DNS rebinding",
        "--allow-host",
        "KVSTATUS_BOARD_TOKEN",
        "Bearer",
    ):
        assert phrase in text, phrase


@pytest.mark.parametrize(
    "header, name",
    [
        ("Example.COM:8080", "example.com"),
        ("[::1]:80", "::1"),
        ("localhost.", "localhost"),
        ("10.0.0.5", "10.0.0.5"),
        ("", ""),
    ],
)
def test_host_names(header: str, name: str) -> None:
    assert host_name(header) == name


def test_the_default_hosts_and_ip_literals() -> None:
    assert default_allowed_hosts("127.0.0.1") == {"localhost", "127.0.0.1", "::1"}
    assert "board.example" in default_allowed_hosts("board.example")
    guard = Guard(None, default_allowed_hosts("127.0.0.1"), None)
    assert guard.host_allowed("10.1.2.3:8080") and guard.host_allowed("[fe80::1]:80")  # no rebinding via an IP
    assert not guard.host_allowed("10.1.2.3.attacker.example") and not guard.host_allowed("")
    assert basic_or_bearer(f"bearer {TOKEN}", TOKEN) and not basic_or_bearer("", TOKEN)
