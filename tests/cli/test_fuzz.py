"""Generated command lines: the CLI exits 0, 1 or 2, never with a traceback, never showing a password."""

from __future__ import annotations

import fakeredis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvstatus import KVPoll, StatusStore
from tests.helpers.cli import invoke
from tests.helpers.depth import DEPTHS, examples

SECRET = "hunter2-not-shown"
COMMANDS = ["clear", "doctor", "explain", "get", "ls", "set", "stats", "watch"]
OPTIONS = [
    "-p",
    "--participant",
    "--json",
    "--reason",
    "--ttl",
    "--policy",
    "-s",
    "--status",
    "-n",
    "--limit",
    "--batch",
    "--oldest",
    "--interval",
    "--count",
    "-h",
    "--help",
    "--bogus",
    "--",
    "-",
]
VALUES = [
    "0",
    "1",
    "42",
    "-1",
    "9223372036854775807",
    "9223372036854775808",
    "1e3",
    "nan",
    "inf",
    "-0",
    "",
    " ",
    "failed",
    "Success",
    "transferring",
    "5",
    "seed",
    "strict",
    "prefill-0",
    "a:b",
    "{x}",
    "*",
    "é",
    "unix://",
    "http://x",
]
URLS = [
    "redis://127.0.0.1:1/0",
    f"redis://:{SECRET}@127.0.0.1:1/0",
    f"rediss://u:{SECRET}@[::1:1",
    "unix://",
    "http://x",
    "redis://h:99999",
    "",
]
token = st.one_of(
    st.sampled_from(OPTIONS),
    st.sampled_from(VALUES),
    st.text(max_size=8),
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
)
room = st.one_of(st.sampled_from(["42", "7", "0", "9223372036854775807"]), token)
status = st.one_of(st.sampled_from(["failed", "Success", "3", "WaitingForInput", "bootstrapping", "missing"]), token)
POSITIONAL = {
    "set": st.tuples(room, status).map(list),
    "get": st.lists(room, min_size=1, max_size=3),
    "clear": st.lists(room, min_size=1, max_size=3),
    "explain": st.tuples(status, status).map(list),
}
option_pairs = st.lists(st.tuples(st.sampled_from(OPTIONS), st.one_of(st.sampled_from(VALUES), token)), max_size=1)
# The password only ever goes where a URL belongs: a URL typed as a namespace is echoed like any bad name.
global_options = st.lists(
    st.one_of(
        st.tuples(
            st.sampled_from(["--namespace", "--prefix"]),
            st.one_of(st.sampled_from(["prod-a", "bad name", "", "x{y}"] + VALUES), st.text(max_size=8)),
        ),
        st.tuples(st.just("--url"), st.one_of(st.sampled_from(URLS), st.text(max_size=12))),
    ),
    max_size=1,
)


@DEPTHS
def test_no_command_line_crashes_the_cli(deep: bool) -> None:
    search = given(
        data=st.data(),
        before=global_options,
        command=st.sampled_from(COMMANDS),
        options=option_pairs,
        json=st.booleans(),
    )(_one_command_line)
    settings(max_examples=examples(deep, 400), deadline=None, suppress_health_check=[HealthCheck.too_slow])(search)()


def _one_command_line(
    data: st.DataObject, before: list[tuple[str, str]], command: str, options: list[tuple[str, str]], json: bool
) -> None:
    server = fakeredis.FakeServer()
    store = StatusStore(fakeredis.FakeRedis(server=server), namespace="prod-a")
    store.update_status(42, KVPoll.Transferring)
    store.record_failure(42, "x")
    positional = data.draw(POSITIONAL.get(command, st.just([])))
    argv = ["--namespace", "prod-a"] + [part for pair in before for part in pair] + [command, *positional]
    argv += [part for pair in options for part in pair] + (["--json"] if json else [])
    if command == "watch":
        argv += ["--count", "1", "--interval", "0.01"]  # the last value wins: watch always ends
    result = invoke(lambda url: fakeredis.FakeRedis(server=server), *argv)  # an unexpected exception propagates
    output = result.output + (result.stderr if result.stderr_bytes is not None else "")
    assert result.exit_code in (0, 1, 2), (argv, output)
    assert "Traceback" not in output, (argv, output)
    assert SECRET not in output, (argv, output)
