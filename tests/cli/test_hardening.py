"""First-hour defects of issue 9 (items 11, 13, 14, 16): the CLI as an operator scripts it (cron, alerting,
``set -e``), its options defined once, and the repository files a user expects."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import zipfile
from dataclasses import fields
from importlib.metadata import version
from pathlib import Path
from typing import Iterator

import click
import fakeredis
import pytest

from kvstatus import KVPoll
from kvstatus.admin.acl import acl_rules
from kvstatus.cli import main
from kvstatus.connection import connect
from kvstatus.errors import InvalidURLError
from kvstatus.url import DEFAULT_URL, ConnectionOptions, options_for
from tests.helpers.backends import fresh_namespace
from tests.helpers.cli import NS, cli, invoke, json_lines
from tests.helpers.tiers import require_redis_server
from tests.servers import RedisServer

ROOT = Path(__file__).resolve().parents[2]
DOCS = {p: p.read_text(encoding="utf-8") for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]}
CLI_GUIDE = DOCS[ROOT / "docs" / "cli.md"]
SECRET = "s3cr3t-hardening"
CHECKOUT_ENV = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
"""The ``kvstatus`` command of the venv, running the code of this checkout."""


@pytest.fixture
def connect_fake(server: fakeredis.FakeServer):
    return lambda url: fakeredis.FakeRedis(server=server)


# ---------------------------------------------------------------- item 11: which server, said on stderr


def test_without_a_url_the_cli_says_which_server_it_uses_on_stderr(connect_fake) -> None:
    result = cli(connect_fake, "get", "1", env={"KVSTATUS_URL": None})
    assert f"no --url or KVSTATUS_URL given, using {DEFAULT_URL}" in result.stderr
    assert DEFAULT_URL not in result.stdout  # stdout stays parseable
    quiet = cli(connect_fake, "get", "1", env={"KVSTATUS_URL": DEFAULT_URL})
    assert "KVSTATUS_URL given" not in quiet.stderr
    offline = cli(connect_fake, "explain", "missing", "failed", env={"KVSTATUS_URL": None})
    assert offline.exit_code == 0 and "KVSTATUS_URL" not in offline.stderr  # no Redis, no notice


# ---------------------------------------------------------------- item 13: stats exit codes


def test_stats_exits_3_on_keys_without_ttl_and_on_corrupted_values(connect_fake, store, server) -> None:
    store.update_status(1, KVPoll.Bootstrapping)
    assert cli(connect_fake, "stats").exit_code == 0
    raw = fakeredis.FakeRedis(server=server)
    raw.persist(store.schema.room_key(1))
    for as_json in ([], ["--json"]):
        result = cli(connect_fake, "stats", *as_json)
        assert result.exit_code == 3, result.output
    assert json.loads(cli(connect_fake, "stats", "--json").stdout)["findings"] is True
    raw.pexpire(store.schema.room_key(1), 60_000)
    raw.hset(store.schema.room_key(2), "default", "banana")
    raw.pexpire(store.schema.room_key(2), 60_000)
    corrupted = cli(connect_fake, "stats")
    assert corrupted.exit_code == 3 and "CORRUPTED" in corrupted.output


def test_exit_codes_are_in_the_help_and_the_readme() -> None:
    help_text = invoke(lambda url: None, "--help").output
    assert "3 stats found keys without TTL or corrupted values" in " ".join(help_text.split())
    assert "3 `stats` found room keys" in CLI_GUIDE
    assert "Exits 3" in invoke(lambda url: None, "stats", "--help").output


@pytest.fixture(scope="module")
def real_server() -> Iterator[RedisServer]:
    require_redis_server()
    with RedisServer(password=SECRET) as started:
        admin = started.client()
        # The eval variant of the recipe: these CLI calls run the scripts by EVALSHA (tests/admin/test_tenancy.py
        # runs the functions recipe).
        dashboard = acl_rules(NS, read_only=True, password=SECRET, scripts="eval")
        admin.execute_command("ACL", "SETUSER", "dashboard", *dashboard)
        admin.execute_command("ACL", "SETUSER", "dashboard-noscan", *dashboard, "-scan")
        yield started


def _sh(script: str, real_server: RedisServer, namespace: str, user: str = "default") -> subprocess.CompletedProcess:
    env = {
        "KVSTATUS_URL": f"redis://{user}:{SECRET}@{real_server.host}:{real_server.port}/0",
        "KVSTATUS_NAMESPACE": namespace,
        **CHECKOUT_ENV,
    }
    return subprocess.run(
        ["bash", "-c", "set -e\n" + script + "\necho reached-the-end"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.real
@pytest.mark.parametrize(
    "command, code",
    [
        ("kvstatus set 5 bootstrapping -p prefill-0", 0),
        ("kvstatus get 5", 0),
        ("kvstatus get 99", 1),  # not found
        ("kvstatus set 5 finished", 2),  # usage
        ("kvstatus set 5 1 --ttl 0", 2),
        ("kvstatus --url redis://127.0.0.1:1/0?retries=0 get 5", 1),  # unreachable
        ("kvstatus stats", 0),
        ("kvstatus doctor", 0),
        ("kvstatus ls -n 1", 0),
        ("kvstatus watch --count 1 --interval 0.1", 0),
        ("kvstatus set 6 transferring --timeline", 0),
        ("KVSTATUS_SCRIPTS=lua kvstatus get 5", 2),  # usage: names the option and its choices
        ('kvstatus --url "$KVSTATUS_URL?scripts=functions" get 5', 2),  # a store setting is no URL option
        ("kvstatus --scripts functions set 7 bootstrapping", 1),  # no function library on this server
    ],
)
def test_exit_codes_as_a_set_e_script_sees_them(real_server: RedisServer, command: str, code: int) -> None:
    namespace = fresh_namespace("sh")
    done = _sh(f"kvstatus set 5 bootstrapping >/dev/null\n{command} >/dev/null", real_server, namespace)
    assert done.returncode == code, done.stderr
    assert ("reached-the-end" in done.stdout) == (code == 0)
    assert "Traceback" not in done.stderr and SECRET not in done.stderr


@pytest.mark.real
def test_cron_stats_alerts_on_a_leak(real_server: RedisServer) -> None:
    namespace = fresh_namespace("cron")
    admin = real_server.client()
    admin.hset(f"kvstatus:{namespace}:{{7}}", "prefill-0", "1")  # written without TTL by something else
    done = _sh("kvstatus stats >/dev/null || { rc=$?; echo ALERT $rc; exit $rc; }", real_server, namespace)
    assert done.returncode == 3 and "ALERT 3" in done.stdout


# ---------------------------------------------------------------- item 14: doctor and the read-only user


@pytest.mark.real
def test_doctor_passes_for_the_readme_read_only_user(real_server: RedisServer) -> None:
    done = _sh("kvstatus doctor", real_server, NS, user="dashboard")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "read-only user" in done.stdout and "writes refused" in done.stdout
    assert not re.search(r"^fail", done.stdout, re.M)


@pytest.mark.real
def test_doctor_fails_for_a_read_only_user_missing_a_read(real_server: RedisServer) -> None:
    done = _sh("kvstatus doctor", real_server, NS, user="dashboard-noscan")
    assert done.returncode == 1
    assert "NOPERM scan" in done.stdout


# ---------------------------------------------------------------- item 16: the smaller defects


def test_dev_works_by_a_relative_path_from_another_directory() -> None:
    relative = (ROOT / "dev").relative_to("/")
    done = subprocess.run(
        ["bash", "-c", f"cd / && {relative} no-such-command"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert "./dev demo" in done.stderr and "sed:" not in done.stderr, done.stderr


def test_ls_participant_help_says_what_ls_does() -> None:
    text = " ".join(invoke(lambda url: None, "ls", "--help").output.split())
    assert "shared 'default' entry" not in text and "default: every participant" in text


@pytest.mark.parametrize(
    "args",
    [
        ["set", "7", "success", "--reason", "x"],
        ["set", "7", "1", "--ttl", "0"],
        ["doctor", "--ttl", "-1"],
        ["get", "-5"],
        ["clear", "-5"],
        ["set", "-5", "1"],
    ],
)
def test_usage_errors_print_the_usage_of_their_command(connect_fake, args: list[str]) -> None:
    result = cli(connect_fake, *args)
    assert result.exit_code == 2
    assert f"Usage: kvstatus {args[0]} " in result.output, result.output
    assert "No such option" not in result.output


def test_ttl_errors_say_30_days() -> None:
    result = cli(lambda url: None, "set", "1", "1", "--ttl", "9e9")
    assert result.exit_code == 2 and "30 days" in result.output and "e+06" not in result.output


def ttl_commands() -> list[str]:
    return [name for name, command in main.commands.items() if any(p.name == "ttl" for p in command.params)]


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "2592001", "x"])
def test_every_ttl_option_has_the_same_check(connect_fake, value: str) -> None:
    assert sorted(ttl_commands()) == ["doctor", "exporter", "set"]
    for name in ttl_commands():
        args = ["set", "1", "1"] if name == "set" else [name]
        result = cli(connect_fake, *args, "--ttl", value)
        assert result.exit_code == 2 and "invalid ttl" in result.output, (name, result.output)
    types = {type(next(p for p in main.commands[n].params if p.name == "ttl").type) for n in ttl_commands()}
    assert len(types) == 1


def test_demo_help_does_not_promise_reproducible_counts() -> None:
    text = " ".join(invoke(lambda url: None, "demo", "--help").output.split())
    assert "reproducible" not in text and "vary" in text


def test_ls_prints_no_header_before_a_connection_error(server) -> None:
    server.connected = False
    result = cli(lambda url: fakeredis.FakeRedis(server=server), "ls")
    assert result.exit_code == 1
    assert "ROOM" not in result.stdout and "Redis unavailable" in result.output


def test_ls_prints_the_header_of_an_empty_namespace(connect_fake) -> None:
    assert cli(connect_fake, "ls").stdout.split() == ["ROOM", "PARTICIPANT", "STATUS", "TTL", "LEFT", "REASON"]


def test_clear_json_rooms_are_integers_like_get_and_set(connect_fake, store) -> None:
    store.update_status(5, KVPoll.Bootstrapping)
    doc = json.loads(cli(connect_fake, "clear", "5", "6", "--json").stdout)
    assert doc["rooms"] == [{"room": 5, "cleared": True}, {"room": 6, "cleared": False}]
    assert isinstance(json.loads(cli(connect_fake, "set", "5", "1", "--json").stdout)["room"], int)


def test_stats_and_watch_say_their_counts_are_entries(connect_fake, store) -> None:
    store.update_status(1, KVPoll.Bootstrapping)
    store.for_participant("decode-0").update_status(1, KVPoll.WaitingForInput)
    stats = cli(connect_fake, "stats").stdout
    assert "1 room holding 2 entries" in stats and "ALL ENTRIES" in stats
    watch = cli(connect_fake, "watch", "--count", "1").stdout
    assert "rooms 1  entries: Failed 0  Bootstrapping 1  WaitingForInput 1" in watch
    snapshot = json_lines(cli(connect_fake, "watch", "--count", "1", "--json").stdout)[0]
    assert snapshot["rooms"] == 1 and snapshot["entries"] == 2


@pytest.mark.parametrize("as_json", [False, True])
def test_ls_limit_counts_printed_rows(connect_fake, store, as_json: bool) -> None:
    for room in range(6):
        for participant in ("prefill-0", "decode-0"):
            store.for_participant(participant).update_status(room, KVPoll.Bootstrapping)
    result = cli(connect_fake, "ls", "-n", "5", *(["--json"] if as_json else []))
    lines = result.stdout.splitlines()
    assert len(lines) == (5 if as_json else 6), result.stdout  # + the header


def _url_value(name: str) -> str:
    """A valid value other than the default where one is easy to pick."""
    special = {"ssl_check_hostname": "false"}
    default = getattr(ConnectionOptions(), name)
    return special.get(name, "/x.pem" if default is None else str(default * 2))


def test_every_connection_option_is_a_url_option() -> None:
    for field in fields(ConnectionOptions):
        value = _url_value(field.name)
        scheme = "rediss" if field.name.startswith("ssl_") else "redis"
        opts = options_for(f"{scheme}://127.0.0.1:1/0?{field.name}={value}")
        assert str(getattr(opts, field.name)).lower() == value.lower(), field.name
    assert options_for("redis://127.0.0.1:1/0?retries=0").retries == 0
    assert connect("redis://127.0.0.1:1/0?retries=0").get_retry()._retries == 0
    assert options_for("redis://h/0?retries=2", retries=7).retries == 2  # the URL wins


@pytest.mark.parametrize(
    "query",
    [
        "retries=-1",
        "retries=x",
        "socket_timeout=0",
        "socket_timeout=nan",
        "nope=1",
    ],
)
def test_bad_connection_options_in_a_url_are_refused(query: str) -> None:
    with pytest.raises(InvalidURLError):
        options_for(f"redis://127.0.0.1:1/0?{query}")


@pytest.mark.parametrize(
    "query, argument",
    [
        ("scripts=functions", "the CLI: --scripts functions"),
        ("timeline=yes", "the CLI: set --timeline"),
        ("lease_ttl=10", "pass lease_ttl=SECONDS to the store"),
        ("near_cache_size=5", "near_cache=NearCacheOptions(max_rooms=N)"),
    ],
)
def test_a_store_setting_in_the_url_is_a_usage_error_naming_what_replaces_it(query: str, argument: str) -> None:
    done = invoke(connect, "--url", f"redis://u:{SECRET}@127.0.0.1:1/0?{query}", "--namespace", NS, "get", "5")
    assert done.exit_code == 2 and "is a store setting, not a connection option" in done.output, done.output
    assert argument in done.output and SECRET not in done.output and "Traceback" not in done.output


@pytest.mark.parametrize(
    "option, instead",
    [
        ("backoff_base=0.01", "retries and deadline size the resends"),
        ("backoff_cap=2", "retries and deadline size the resends"),
        ("health_check_interval=30", "checked after 30 s"),
        ("client_name=worker-1", "every connection is named 'kvstatus'"),
        ("ssl_cert_reqs=none", "always verified: trust a private CA with ssl_ca_certs"),
    ],
)
def test_a_removed_connection_option_says_it_was_removed(option: str, instead: str) -> None:
    with pytest.raises(InvalidURLError, match=f"option '{option.partition('=')[0]}' was removed: .*{instead}"):
        options_for(f"rediss://127.0.0.1:1/0?{option}")
    done = invoke(connect, "--url", f"rediss://u:{SECRET}@127.0.0.1:1/0?{option}", "--namespace", NS, "get", "5")
    assert done.exit_code == 2 and "was removed" in done.output and instead in done.output, done.output
    assert SECRET not in done.output and "Traceback" not in done.output


def test_a_bad_scripts_choice_is_a_usage_error() -> None:
    done = invoke(connect, "--scripts", "lua", "--namespace", NS, "get", "5")
    assert done.exit_code == 2 and "'lua' is not one of 'eval', 'functions'" in done.output, done.output


def test_readme_and_guides_cite_only_files_in_the_repository() -> None:
    text = "\n".join(DOCS.values())
    assert "DESIGN §" not in text and "DESIGN.md" not in text
    cited = set(re.findall(r"\b((?:kvstatus|tests|lua|benchmarks)/[\w/]+\.(?:py|lua))\b", text))
    cited |= set(re.findall(r"`([\w-]+\.(?:md|yml|toml))`", text))
    missing = sorted(path for path in cited if not (ROOT / path).exists())
    assert not missing


def test_license_changelog_and_typing_marker() -> None:
    license_text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text
    assert "END OF TERMS AND CONDITIONS" in license_text
    assert 'license = "Apache-2.0"' in (ROOT / "pyproject.toml").read_text()
    assert (ROOT / "CHANGELOG.md").read_text().startswith("# Changelog")
    assert (ROOT / "kvstatus" / "py.typed").exists()


@pytest.mark.slow
def test_wheel_ships_py_typed_and_the_license(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        timeout=300,
    )
    (built,) = tmp_path.glob("kvstatus-*.whl")
    names = zipfile.ZipFile(built).namelist()
    assert "kvstatus/py.typed" in names
    assert any(name.endswith(".dist-info/licenses/LICENSE") for name in names), names


def test_version_and_completion_work_and_are_in_the_readme() -> None:
    result = invoke(lambda url: None, "--version")
    assert result.exit_code == 0 and result.output.strip() == f"kvstatus {version('kvstatus')}"
    assert "kvstatus --version" in CLI_GUIDE and "_KVSTATUS_COMPLETE=bash_source kvstatus" in CLI_GUIDE
    env = CHECKOUT_ENV
    for shell in ("bash", "zsh", "fish"):
        script = subprocess.run(
            ["kvstatus"],
            env={**env, "_KVSTATUS_COMPLETE": f"{shell}_source"},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert script.returncode == 0 and "_KVSTATUS_COMPLETE" in script.stdout, (shell, script.stderr)
    words = subprocess.run(
        ["kvstatus"],
        env={**env, "_KVSTATUS_COMPLETE": "bash_complete", "COMP_WORDS": "kvstatus st", "COMP_CWORD": "1"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "plain,stats" in words.stdout.splitlines()
    assert isinstance(main, click.Group)
