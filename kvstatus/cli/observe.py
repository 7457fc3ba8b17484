"""``exporter`` and ``serve``: Prometheus metrics and the read-only web board (optional extras, imported on use)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Optional

import click

from kvstatus.admin.reads import read_deaths
from kvstatus.cli.app import CliEnv, batch_option, main, pass_env, require_extra, ttl_option
from kvstatus.cli.health import health_settings, with_health_options
from kvstatus.keys import KeySchema


def _schemas(env: CliEnv, namespaces: tuple[str, ...]) -> list[KeySchema]:
    if not namespaces:
        return [env.schema()]
    return [KeySchema(ns, env.prefix) for ns in dict.fromkeys(namespaces)]


def _logging() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")


def _interval_option(default: float) -> Any:
    return click.option(
        "--interval",
        type=click.FloatRange(min=0.1),
        default=default,
        show_default=True,
        help="Seconds from the start of one pass over the namespace to the start of the next.",
    )


scan_options = [
    batch_option,
    click.option(
        "--pause",
        type=click.FloatRange(min=0),
        default=0.0,
        show_default=True,
        help="Seconds to sleep between batches, capping the load at BATCH/PAUSE keys per second.",
    ),
]


def _with_scan_options(interval: float = 15.0) -> Callable[[Any], Any]:
    """The decorator adding --interval (default ``interval`` seconds), --batch and --pause to a command."""

    def decorate(command: Any) -> Any:
        for option in reversed([_interval_option(interval), *scan_options]):
            command = option(command)
        return command

    return decorate


@main.command()
@click.argument("namespaces", nargs=-1, metavar="[NAMESPACE]...")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=9808,
    show_default=True,
    help="TCP port of /metrics (0: any free port, printed on stderr).",
)
@click.option("--host", default="0.0.0.0", show_default=True, help="Address to listen on.")
@_with_scan_options()
@ttl_option("The store TTL in seconds your workers use; the age of the oldest room is TTL minus its TTL left.")
@click.option(
    "--max-participants",
    type=click.IntRange(min=0, max=10_000),
    default=50,
    show_default=True,
    help="Participants with their own kvstatus_entries series (those with the most entries); the rest "
    'are summed under participant="(other)".',
)
@click.option(
    "--max-pairs",
    type=click.IntRange(min=0, max=10_000),
    default=50,
    show_default=True,
    help="Prefill-decode pairs with their own kvstatus_pair_* series (the unhealthy ones first, then those with "
    'the most rooms); the rest are summed under prefill="(other)",decode="(other)".',
)
@with_health_options
@pass_env
def exporter(
    env: CliEnv,
    namespaces: tuple[str, ...],
    port: int,
    host: str,
    interval: float,
    batch: int,
    pause: float,
    ttl: float,
    max_participants: int,
    max_pairs: int,
    window: float,
    older_than: float,
    threshold: int,
) -> None:
    """Serve Prometheus metrics of one or more namespaces on http://HOST:PORT/metrics (needs kvstatus[metrics]).

    [NAMESPACE]... default to --namespace. Counts come from a bounded, incremental
    SCAN every --interval seconds; a scrape reads the last completed pass and
    never touches Redis. Redis down: kvstatus_up 0, and the exporter keeps
    trying. Stops cleanly (exit 0) on SIGTERM or Ctrl-C.

    Each pass also judges every prefill-decode pair as kvstatus health does
    (--window, --older-than, --threshold): the
    kvstatus_pair_* gauges, kvstatus_unhealthy_pairs, and /ready (200 when
    every pair is healthy, else 503) on the same port.

    Series are bounded whatever the number of participants: per namespace 63,
    plus 5 kvstatus_entries series (one per status) for each of at most
    --max-participants participants and one more participant "(other)", plus
    4 kvstatus_pair_* series for each of at most --max-pairs pairs and one
    more pair "(other)" (with the defaults, 50 and 50: at most 522), plus the
    exporter's process metrics.
    """
    settings = health_settings(window, older_than, threshold)
    require_extra("metrics", "kvstatus exporter")
    from kvstatus.observe.exporter import run_exporter

    schemas = _schemas(env, namespaces)
    _logging()

    def ready(bound_host: str, bound_port: int) -> None:
        names = ", ".join(s.namespace for s in schemas)
        click.echo(
            f"exporter: serving http://{bound_host}:{bound_port}/metrics for {names} "
            f"from {env.shown_url} (Ctrl-C or SIGTERM to stop)",
            err=True,
        )

    try:
        run_exporter(
            env.backend(),
            schemas,
            port=port,
            host=host,
            interval=interval,
            batch=batch,
            pause=pause,
            ttl=ttl,
            max_participants=max_participants,
            max_pairs=max_pairs,
            health=settings,
            ready=ready,
            lost_participants=read_deaths,
        )
    except OSError as exc:
        raise click.ClickException(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    click.echo("exporter: stopped", err=True)


@main.command()
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8080,
    show_default=True,
    help="TCP port of the board (0: any free port, printed on stderr).",
)
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to listen on. Without --token, expose it only where rooms may be seen.",
)
@click.option(
    "--allow-host",
    "allow_hosts",
    multiple=True,
    metavar="NAME",
    help="Also answer requests whose Host header is NAME (repeatable), e.g. the DNS name users browse "
    "to; '*' answers any Host (defeats the DNS-rebinding check).",
)
@click.option(
    "--token",
    envvar="KVSTATUS_BOARD_TOKEN",
    metavar="TOKEN",
    help="Require this token on every request (env KVSTATUS_BOARD_TOKEN; prefer it: a command line is "
    "visible to other users in ps): 'Authorization: Bearer TOKEN', or Basic auth with TOKEN as the "
    "password (any user name), which browsers prompt for.",
)
@_with_scan_options(interval=2.0)
@pass_env
def serve(
    env: CliEnv,
    port: int,
    host: str,
    allow_hosts: tuple[str, ...],
    token: Optional[str],
    interval: float,
    batch: int,
    pause: float,
) -> None:
    """Serve the read-only live web board of a namespace on http://HOST:PORT/ (needs kvstatus[web]).

    Counts by status over time, rooms filtered by status and participant with
    paging over SCAN cursors, a room's detail, and recent changes. It never
    writes: a read-only ACL user is enough.

    What it exposes, to anyone who can reach HOST:PORT (and passes --token if
    set): every room id of the namespace, each room's participants, statuses,
    failure reasons (free text from your workers), TTL and tombstone (who
    cleared it, when), the counts by status and participant over time, and the
    Redis URL with its password masked. The JSON API under /api/ serves the
    same data.

    Against DNS rebinding (a web page of another site made to resolve to this
    address) it answers only a Host header that is localhost, an IP address,
    the bound name (with --host 0.0.0.0: this machine's host names) or an
    --allow-host NAME; any other gets 400.
    """
    require_extra("web", "kvstatus serve")
    from kvstatus.observe.board import run_board

    schema = env.schema()
    _logging()

    any_host = "*" in allow_hosts
    if token is not None and not token.strip():
        raise click.BadParameter("the token is empty", param_hint="--token / KVSTATUS_BOARD_TOKEN")

    def ready(bound_host: str, bound_port: int) -> None:
        access = "token required" if token else "no token: anyone who reaches it can read the rooms"
        hosts = "any Host header" if any_host else "Host checked"
        click.echo(
            f"serve: board of {schema.namespace} at http://{bound_host}:{bound_port}/ "
            f"from {env.shown_url} ({access}; {hosts}; Ctrl-C or SIGTERM to stop)",
            err=True,
        )

    try:
        run_board(
            env.backend(),
            schema,
            shown_url=env.shown_url,
            host=host,
            port=port,
            interval=interval,
            batch=batch,
            pause=pause,
            allow_hosts=[h for h in allow_hosts if h != "*"],
            any_host=any_host,
            token=token,
            ready=ready,
        )
    except OSError as exc:
        raise click.ClickException(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    click.echo("serve: stopped", err=True)
