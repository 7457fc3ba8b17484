"""Issue 35 item 2: a write the update rule refuses (REFUSED_*) exits 6 with one line on stderr naming the rule
and the fix, so ``set -e`` stops on it; the outcome is printed as always. As an operator scripts it, against a
real redis-server."""

from __future__ import annotations

import json

import pytest

from tests.helpers.backends import fresh_namespace
from tests.helpers.cli import run_cli
from tests.servers import RedisServer

pytestmark = pytest.mark.real

EXIT_REFUSED = 6


def test_a_refused_write_exits_6_and_names_the_rule_and_the_fix(redis_server: RedisServer) -> None:
    env = {"KVSTATUS_URL": redis_server.url, "KVSTATUS_NAMESPACE": fresh_namespace("refused")}
    late = run_cli("set", "1", "success", "-p", "prefill-0", "--policy", "strict", env=env)
    assert late.returncode == EXIT_REFUSED, late.stdout + late.stderr
    assert late.stdout == "room 1 prefill-0: REFUSED_CREATE -> -\n"
    (line,) = late.stderr.splitlines()
    assert line.startswith("kvstatus: REFUSED_CREATE: under --policy strict only Bootstrapping or WaitingForInput")
    assert "room 1 has none for prefill-0" in line and "--policy seed" in line and "Traceback" not in line
    assert run_cli("get", "1", env=env).returncode == 1  # nothing was written

    assert run_cli("set", "2", "transferring", "-p", "prefill-0", env=env).returncode == 0
    assert run_cli("set", "2", "failed", "-p", "prefill-0", env=env).returncode == 0
    terminal = run_cli("set", "2", "success", "-p", "prefill-0", "--policy", "strict", "--json", env=env)
    assert terminal.returncode == EXIT_REFUSED
    assert json.loads(terminal.stdout)["outcome"] == "REFUSED_TERMINAL"
    (line,) = terminal.stderr.splitlines()
    assert "Failed is terminal" in line and "kvstatus clear 2 -p prefill-0" in line

    allowed = run_cli("set", "3", "success", "-p", "prefill-0", env=env)  # seed creates it: exit 0
    assert allowed.returncode == 0 and allowed.stderr == ""
    ignored = run_cli("set", "4", "failed", "-p", "prefill-0", "--policy", "strict", env=env)
    assert ignored.returncode == 0 and "IGNORED_MISSING" in ignored.stdout  # the rule's answer, not a refusal
