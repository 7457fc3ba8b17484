"""``kvstatus health``: per prefill-decode pair, what the last WINDOW served, failed and left stuck, and a verdict.

Its options that set the judgement (``--window``, ``--older-than``, ``--threshold``) are
defined here once, as :data:`health_options`, and shared with ``kvstatus exporter`` (its pair gauges and
``/ready``); :func:`health_settings` turns them into :class:`~kvstatus.admin.health.HealthSettings`."""

from __future__ import annotations

from typing import Any, Callable

import click

from kvstatus.admin.health import (
    DEFAULT_THRESHOLD,
    DEFAULT_WINDOW_SECONDS,
    FAILURE_STAGES,
    Health,
    HealthSettings,
    read_health,
)
from kvstatus.cli.app import (
    DURATION,
    CliEnv,
    batch_option,
    emit_json,
    json_option,
    main,
    older_than_option,
    pass_env,
    plural,
    safe,
)
from kvstatus.cli.app import table as text_table
from kvstatus.keys import TOMBSTONE_TTL_SECONDS

EXIT_UNHEALTHY = 5
"""``kvstatus health`` found an unhealthy pair (1 stays "could not look": Redis unreachable, ACL denied)."""


def _render(health: Health) -> str:
    rows = [
        [
            pair.prefill,
            pair.decode,
            pair.succeeded,
            pair.failed_total,
            " ".join(f"{stage} {pair.failed[stage]}" for stage in FAILURE_STAGES if pair.failed[stage]) or "-",
            pair.stuck,
            pair.open,
            "UNHEALTHY" if pair.unhealthy else "healthy",
        ]
        for pair in health.pairs
    ]
    headers = ["PREFILL", "DECODE", "SUCCEEDED", "FAILED", "BY STAGE", "STUCK", "OPEN", "VERDICT"]
    settings = health.settings
    lines = [text_table(headers, rows)] if rows else []
    if not rows:
        lines.append(
            f"no prefill-decode pair has a room in namespace {health.namespace!r} in the last {settings.window:g}s "
            "(pairs come from participants named prefill-* and decode-*)"
        )
    else:
        lines.append(
            f"{plural(len(health.pairs), 'pair')}, {len(health.unhealthy)} unhealthy (failed + stuck >= {settings.threshold} "
            f"and nothing succeeded in the last {settings.window:g}s; stuck: no move for {settings.older_than:g}s)"
        )
    for pair in health.pairs:
        if pair.dead:
            lines.append(
                safe(
                    f"{pair.name}: {', '.join(pair.dead)} died (lease lost, or restarted) and the pair served no "
                    "room since"
                )
            )
    if health.unpaired:
        have = "room has" if health.unpaired == 1 else "rooms have"
        lines.append(f"{health.unpaired} {have} no prefill or decode participant: not counted in a pair")
    if health.corrupted:
        lines.append(
            f"{health.corrupted} {'room holds' if health.corrupted == 1 else 'rooms hold'} values kvstatus does not "
            "write: skipped (`kvstatus stats` names them)"
        )
    return "\n".join(lines)


window_option = click.option(
    "--window",
    type=DURATION,
    default=DEFAULT_WINDOW_SECONDS,
    show_default=f"{DEFAULT_WINDOW_SECONDS:g}s",
    help="Count the rooms that succeeded or failed this recently: seconds, or a number with a unit (500ms, 30s, "
    f"5m, 1h); at most {TOMBSTONE_TTL_SECONDS:g}s, the tombstones' TTL, since successes are seen through "
    "tombstones only.",
)
threshold_option = click.option(
    "--threshold",
    type=click.IntRange(min=1, max=1_000_000),
    default=DEFAULT_THRESHOLD,
    show_default=True,
    help="A pair is UNHEALTHY when its failed + stuck rooms reach this and nothing succeeded in the window.",
)
health_options: list[Callable[[Any], Any]] = [window_option, older_than_option, threshold_option]
"""``--window``, ``--older-than``, ``--threshold``: the judgement of ``health`` and ``exporter``."""


def with_health_options(command: Any) -> Any:
    """The decorator adding :data:`health_options` to a command, in that order."""
    for option in reversed(health_options):
        command = option(command)
    return command


def health_settings(window: float, older_than: float, threshold: int) -> HealthSettings:
    """The options as :class:`HealthSettings`; a window above the tombstone TTL is a usage error (exit 2)."""
    try:
        return HealthSettings(window, older_than, threshold)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="'--window'") from None


@main.command()
@with_health_options
@batch_option
@json_option
@pass_env
def health(env: CliEnv, window: float, older_than: float, threshold: int, batch: int, as_json: bool) -> None:
    """Health per prefill-decode pair: rooms succeeded, failed (by stage) and stuck, and a verdict.

    Participants that share rooms form pairs of a prefill and a decode
    instance (ranks folded: prefill-a-tp3-pp0 is prefill-a); a room whose
    other side never wrote counts for (prefill-a, (none)). One SCAN pass
    reads every room and its tombstone, judged at Redis' clock. A pair is
    UNHEALTHY when failed + stuck rooms reach --threshold and none succeeded
    in --window: both sides up, nothing served. It is UNHEALTHY too while a
    participant of it died (its lease lost, or it restarted, leaving rooms
    open or failing them) and none of its rooms succeeded since.

    Exits 5 when a pair is unhealthy, 0 when every pair is healthy (or there
    is none), 1 if Redis cannot be read, 2 for bad options.
    """
    settings = health_settings(window, older_than, threshold)
    found = read_health(env.backend(), env.schema(), settings, batch=batch)
    if as_json:
        emit_json({**found.to_json(), "unhealthy": [pair.name for pair in found.unhealthy]})
    else:
        click.echo(_render(found))
    if not found.healthy:
        raise click.exceptions.Exit(EXIT_UNHEALTHY)
