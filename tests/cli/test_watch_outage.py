"""``kvstatus watch`` through a Redis that goes away after the first refresh (killed, then restarted empty; or
SIGSTOPped, then continued): it says so once on stderr, goes on, says when Redis answers again, and exits 1 only if
its last refresh failed."""

from __future__ import annotations

import functools
import os
import signal
from collections.abc import Callable

import pytest
from click.testing import Result

import kvstatus.cli.namespace as namespace_commands
from kvstatus import KVPoll, StatusStore
from kvstatus.admin.watch import watch_changes
from kvstatus.connection import connect
from tests.helpers.backends import fresh_namespace
from tests.helpers.cli import assert_clean_failure, invoke, json_lines
from tests.servers import RedisServer

pytestmark = pytest.mark.real


def _watch(
    monkeypatch: pytest.MonkeyPatch, server: RedisServer, steps: list[Callable[[], None]], *args: str, query: str = ""
) -> Result:
    """``kvstatus watch --json ARGS`` on ``server`` (its URL + ``query``), running ``steps[i]`` in its i-th sleep
    between refreshes."""
    pending = list(steps)

    def sleep(seconds: float) -> None:
        pending.pop(0)()

    monkeypatch.setattr(namespace_commands, "watch_changes", functools.partial(watch_changes, sleep=sleep))
    namespace = fresh_namespace("outage")
    StatusStore(server.client(), namespace=namespace, participant="prefill-0").update_status(1, KVPoll.Bootstrapping)
    done = invoke(connect, "--namespace", namespace, "watch", "--json", *args, env={"KVSTATUS_URL": server.url + query})
    assert not pending
    return done


def test_a_restart_between_refreshes_is_said_once_and_the_watch_goes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    with RedisServer() as server:
        done = _watch(monkeypatch, server, [server.kill, server.restart, lambda: None], "--count", "4")
    assert done.exit_code == 0, done.output
    assert "Traceback" not in done.output
    lines = json_lines(done.stdout)
    snapshots = [line for line in lines if line["event"] == "snapshot"]
    assert [s["rooms"] for s in snapshots] == [1, 0, 0]  # the second refresh failed; the restart emptied Redis
    cleared = [line for line in lines if line["event"] == "cleared"]
    assert [(c["room"], c["participant"]) for c in cleared] == [(1, "prefill-0")]
    said = done.stderr.splitlines()
    assert len([line for line in said if "Redis unavailable" in line]) == 1, said
    assert said.count("Redis answers again") == 1 and said.index("Redis answers again") > 0, said


def test_a_watch_whose_last_refresh_failed_exits_1(monkeypatch: pytest.MonkeyPatch) -> None:
    with RedisServer() as server:
        done = _watch(monkeypatch, server, [server.kill, lambda: None], "--count", "3")
    assert_clean_failure(done.output, done.exit_code, 1, "Redis unavailable")
    assert len(json_lines(done.stdout)) == 1  # the first snapshot, then two refreshes that found Redis away
    assert "trying again every 2 s" in done.stderr and "Redis answers again" not in done.stderr


def test_a_hung_server_between_refreshes_is_said_once_and_the_watch_goes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGSTOP: the refresh gives up at the URL's deadline (1 s), as the restart's refused connection does."""
    with RedisServer() as server:

        def signal_server(sig: signal.Signals) -> Callable[[], None]:
            return lambda: os.kill(server.pid, sig)

        try:
            steps = [signal_server(signal.SIGSTOP), signal_server(signal.SIGCONT), lambda: None]
            done = _watch(monkeypatch, server, steps, "--count", "4", query="?deadline=1")
        finally:
            os.kill(server.pid, signal.SIGCONT)
    assert done.exit_code == 0, done.output
    assert "Traceback" not in done.output
    snapshots = [line for line in json_lines(done.stdout) if line["event"] == "snapshot"]
    assert [s["rooms"] for s in snapshots] == [1, 1, 1]  # the second refresh hung; nothing was lost
    said = done.stderr.splitlines()
    assert len([line for line in said if "Redis unavailable" in line]) == 1, said
    assert said.count("Redis answers again") == 1, said
