"""``participants`` and ``sweep``: the participants' leases, and failing the rooms of the dead ones."""

from __future__ import annotations

import time

import click

from kvstatus.admin.reads import index_problem, list_leases
from kvstatus.admin.sweep import sweep as run_sweep
from kvstatus.cli.app import (
    CliEnv,
    batch_option,
    emit_json,
    json_option,
    main,
    pass_env,
    plural,
    safe,
    stderr_is_tty,
    table,
)


@main.command()
@json_option
@pass_env
def participants(env: CliEnv, as_json: bool) -> None:
    """List the participants' leases: alive, expired or released, incarnation, last seen, lease TTL.

    Only stores built with lease_ttl hold a lease; a participant without one
    is not listed and is never swept. A record stays for the store's room TTL
    after its last renewal, so a dead participant is listed as expired for as
    long as its entries can live.
    """
    schema = env.schema()
    skipped: list[str] = []
    leases = list_leases(env.backend(), schema, on_corrupt=skipped.append)
    _warn_skipped(env, skipped)
    if as_json:
        emit_json({"namespace": schema.namespace, "participants": [info.to_json() for info in leases]})
        return
    if not leases:
        click.echo(
            f"no participant holds or held a lease in namespace {schema.namespace!r} "
            "(stores built without lease_ttl have none)"
        )
        return
    rows = [
        [
            info.participant,
            info.state,
            f"{info.generation} ({info.incarnation[:8]})",
            f"{max(info.now - info.last_seen, 0):.1f}s ago",
            f"{info.ttl:g}s",
        ]
        for info in leases
    ]
    click.echo(table(["PARTICIPANT", "STATE", "INCARNATION", "LAST SEEN", "LEASE TTL"], rows))


@main.command()
@batch_option
@click.option(
    "--participant",
    "-p",
    "only",
    multiple=True,
    metavar="NAME",
    help="Only sweep this lost participant (repeatable); default: every participant whose lease is lost.",
)
@json_option
@pass_env
def sweep(env: CliEnv, batch: int, only: tuple[str, ...], as_json: bool) -> None:
    """Mark every open entry of a participant whose lease is lost as Failed, with that reason.

    Open entries (Bootstrapping, WaitingForInput, Transferring) become Failed
    through the update rule's FAILED row, atomically per room, with the reason
    "participant P lost its lease"; Success, Failed and other participants'
    entries are never touched. Safe to run from several places at once and
    idempotent. Rooms are walked with SCAN in batches (bounded memory);
    progress on stderr on a terminal. Participants that never held a lease are
    never swept. With -p, each named participant that is not lost is named
    (alive, or no lease record), and so are the lost ones left alone. Exits 0
    whether or not it failed anything, 1 if Redis failed (a partial sweep is
    safe to run again).
    """
    schema = env.schema()
    started = time.monotonic()
    progress = None
    if stderr_is_tty():

        def progress(scanned: int) -> None:
            rate = scanned / max(time.monotonic() - started, 1e-6)
            click.echo(f"\rsweep: {plural(scanned, 'key')} scanned ({rate:,.0f} keys/s)", nl=False, err=True)

    result = run_sweep(env.backend(), schema, batch=batch, progress=progress, participants=list(only) if only else None)
    if progress is not None:
        click.echo("\r\033[K", nl=False, err=True)
    _warn_skipped(env, result.skipped_sample, result.skipped)
    if as_json:
        emit_json({"namespace": schema.namespace, **result.to_json()})
        return
    for name, state in result.not_swept.items():
        why = (
            "holds a live lease"
            if state == "alive"
            else ("has no lease record (it never held one, or the record expired one room TTL after its last renewal)")
        )
        click.echo(safe(f"{name} {why}: not swept"))
    if result.other_lost:
        click.echo(
            safe(
                f"not swept, not named by -p: lost participants {', '.join(result.other_lost)} "
                "(run without -p to sweep them)"
            )
        )
    if not result.lost:
        if not only:
            click.echo(f"no lost lease in namespace {schema.namespace!r}: nothing to sweep")
        return
    click.echo(safe(f"lost participants: {', '.join(result.lost)}"))
    rate = result.scanned / result.seconds if result.seconds > 0 else 0.0
    click.echo(
        f"failed {plural(result.swept, 'open entry', 'open entries')} in {plural(result.rooms, 'room')} "
        f"({plural(result.scanned, 'key')} scanned in "
        f"{result.seconds:.1f}s, {rate:,.0f} keys/s)"
    )
    for name, count in result.by_participant.items():
        click.echo(safe(f"  {name}: {count}"))


def _warn_skipped(env: CliEnv, sample: list[str], count: int = -1) -> None:
    """On stderr: the keys a listing skipped (``count``: how many in all; -1: ``sample`` is all of them), and the
    lease index when a tenant's key stands at its name. The listing itself goes on."""
    count = len(sample) if count < 0 else count
    problem = index_problem(env.backend(), env.schema())
    if count:
        shown = "; ".join(sample) + (f"; and {count - len(sample)} more" if count > len(sample) else "")
        click.echo(safe(f"warning: skipped {plural(count, 'key')} kvstatus does not write: {shown}"), err=True)
    if problem is not None:
        click.echo(safe(f"warning: {problem}"), err=True)
