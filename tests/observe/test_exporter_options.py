"""Issue 20 item 4: `kvstatus exporter` takes the pair-health options of `kvstatus health` (--window,
--older-than, --threshold: defined once, shared) and --max-pairs, and passes them to
run_exporter; bad values are usage errors (exit 2), never a traceback."""

from __future__ import annotations

from typing import Any

import click
import pytest

import kvstatus.observe.exporter as exporter_module
from kvstatus.admin.health import HealthSettings
from kvstatus.cli import main
from kvstatus.observe.exporter import DEFAULT_MAX_PAIRS, DEFAULT_MAX_PARTICIPANTS
from tests.helpers.cli import assert_clean_failure, invoke

HEALTH_OPTIONS = ("--window", "--older-than", "--threshold")


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """run_exporter replaced by a recorder: the command's arguments, no server."""
    calls: dict[str, Any] = {}

    def fake_run_exporter(client: Any, schemas: Any, **kwargs: Any) -> int:
        calls.update(kwargs, namespaces=[s.namespace for s in schemas])
        return 0

    monkeypatch.setattr(exporter_module, "run_exporter", fake_run_exporter)
    return calls


def exporter(*args: str) -> Any:
    return invoke(lambda url: None, "--namespace", "prod-a", "exporter", *args)


def test_defaults_reach_run_exporter(captured: dict[str, Any]) -> None:
    result = exporter()
    assert result.exit_code == 0, result.output
    assert captured["health"] == HealthSettings() and captured["max_pairs"] == DEFAULT_MAX_PAIRS
    assert captured["max_participants"] == DEFAULT_MAX_PARTICIPANTS and captured["namespaces"] == ["prod-a"]


def test_values_reach_run_exporter(captured: dict[str, Any]) -> None:
    result = exporter("--window", "50s", "--older-than", "45", "--threshold", "3", "--max-pairs", "7")
    assert result.exit_code == 0, result.output
    assert captured["health"] == HealthSettings(window=50, older_than=45, threshold=3)
    assert captured["max_pairs"] == 7
    assert exporter("--max-pairs", "0").exit_code == 0 and captured["max_pairs"] == 0  # every pair under (other)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--window", "0"], "invalid duration '0'"),
        (["--window", "soon"], "invalid duration 'soon'"),
        (["--window", "61s"], "at most the tombstone TTL (60s)"),
        (["--tombstone-ttl", "90s"], "No such option '--tombstone-ttl'"),
        (["--older-than", "0s"], "invalid duration '0s'"),
        (["--older-than", "31d"], "invalid duration '31d'"),
        (["--threshold", "0"], "'--threshold'"),
        (["--threshold", "many"], "'--threshold'"),
        (["--max-pairs", "-1"], "'--max-pairs'"),
        (["--max-pairs", "10001"], "'--max-pairs'"),
        (["--max-pairs", "x"], "'--max-pairs'"),
    ],
)
def test_bad_values_are_usage_errors(captured: dict[str, Any], args: list[str], needle: str) -> None:
    result = exporter(*args)
    assert_clean_failure(result.output, result.exit_code, 2, "Error:", needle)
    assert not captured  # refused before it starts


def test_help_lists_the_options_with_their_defaults() -> None:
    text = " ".join(invoke(lambda url: None, "exporter", "--help").output.split())
    for option in (*HEALTH_OPTIONS, "--max-pairs"):
        assert option in text, option
    assert "[default: (60s)]" in text and "[default: 30s]" in text and "[default: 1; 1<=x<=1000000]" in text
    assert "[default: 50; 0<=x<=10000]" in text
    assert "judges every prefill-decode pair as kvstatus health does" in text


def test_the_health_options_are_defined_once_and_shared_with_health() -> None:
    commands = {name: main.commands[name] for name in ("health", "exporter")}
    for option in HEALTH_OPTIONS:
        found = [next(p for p in c.params if option in getattr(p, "opts", ())) for c in commands.values()]
        health, exporter = found
        assert isinstance(health, click.Option) and isinstance(exporter, click.Option)
        assert (health.help, health.default, health.type, health.show_default) == (
            exporter.help,
            exporter.default,
            exporter.type,
            exporter.show_default,
        ), option
