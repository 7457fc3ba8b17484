"""``stats``, ``watch``, ``doctor``, ``acl``, ``explain`` and ``functions``: a namespace as a whole, its Redis user, the
rule, the Lua library."""

from __future__ import annotations

import sys
from datetime import datetime, timezone
from typing import Any, Optional

import click

from kvstatus.admin.acl import acl_rules, acl_setuser_line
from kvstatus.admin.doctor import run_checks
from kvstatus.admin.functions import load_functions, loaded_libraries
from kvstatus.admin.stats import bucket_labels, collect_stats
from kvstatus.admin.views import explain as explain_rule
from kvstatus.admin.watch import KINDS, Snapshot, entry_events, room_hash, watch_changes
from kvstatus.cli.app import (
    EXIT_FINDINGS,
    EXIT_STUCK,
    STATUS,
    CliEnv,
    NotFound,
    batch_option,
    emit_json,
    json_option,
    main,
    note_empty_namespace,
    older_than_option,
    pass_env,
    plural,
    safe,
    status_text,
    stderr_is_tty,
    table,
    ttl_option,
    ttl_text,
)
from kvstatus.errors import BackendUnavailableError
from kvstatus.model import KVPoll, Policy
from kvstatus.rule import apply_rule, reads
from kvstatus.scripts import ALL as ALL_SCRIPTS
from kvstatus.scripts import LIBRARY_NAME

MAX_CHANGES_SHOWN = 20


def _progress(label: str) -> Any:
    """A stderr progress indicator for long scans (only on a terminal), or None."""
    if not stderr_is_tty():
        return None

    def show(scanned: int) -> None:
        click.echo(f"\r{label}: {plural(scanned, 'key')} scanned", nl=False, err=True)

    return show


def _end_progress(progress: Any) -> None:
    if progress is not None:
        click.echo("\r\033[K", nl=False, err=True)


@main.command()
@click.option(
    "--oldest",
    type=click.IntRange(min=0, max=1000),
    default=5,
    show_default=True,
    help="How many of the oldest non-terminal rooms to list.",
)
@older_than_option
@batch_option
@json_option
@pass_env
def stats(env: CliEnv, oldest: int, older_than: float, batch: int, as_json: bool) -> None:
    """Count entries by status and participant, and audit leaks: keys without TTL, TTL left, oldest rooms.

    A room holds one entry per participant, so the counts by status are
    entries, beside the number of rooms. "Oldest" are the non-terminal rooms
    with the least TTL left: every write refreshes the TTL, so they went
    longest without progress. Exits 3 if it finds room keys without TTL or
    values kvstatus does not write (for cron and alerting); else 4 if rooms
    are stuck on a participant whose lease is lost (`kvstatus sweep` fails
    them) or that restarted, leaving its entries open; 0 if clean. An empty namespace (often a mistyped name) exits 0 and
    says so on stderr. Rooms stuck for --older-than by their timelines are
    counted by the participant holding each back (`kvstatus ls --stuck` lists
    them); they do not change the exit code.
    """
    schema = env.schema()
    progress = _progress("stats")
    result = collect_stats(env.backend(), schema, oldest=oldest, batch=batch, progress=progress, older_than=older_than)
    _end_progress(progress)
    findings = result.keys_without_ttl > 0 or result.corrupted_rooms > 0
    stuck = result.rooms_on_lost_participants > 0
    code = EXIT_FINDINGS if findings else EXIT_STUCK if stuck else 0
    if result.rooms == 0 and result.corrupted_rooms == 0:
        note_empty_namespace(schema)
    if as_json:
        emit_json({"namespace": schema.namespace, **result.to_json(), "findings": findings, "stuck": stuck})
        if code:
            raise click.exceptions.Exit(code)
        return
    click.echo(
        f"namespace {schema.namespace}: {plural(result.rooms, 'room')} holding "
        f"{plural(result.entries, 'entry', 'entries')} (one per participant); counts below are entries"
    )
    click.echo("")
    participants = sorted(result.by_participant)
    headers = ["STATUS", "ALL ENTRIES"] + participants
    rows = [
        [s.name, result.by_status.get(s, 0)] + [result.by_participant[p].get(s, 0) for p in participants]
        for s in KVPoll
    ]
    click.echo(table(headers, rows))
    click.echo("")
    click.echo("TTL left: " + ", ".join(f"{label} {result.ttl_left.get(label, 0)}" for label in bucket_labels()))
    if result.keys_without_ttl:
        sample = ", ".join(map(str, result.keys_without_ttl_sample))
        click.secho(
            f"LEAK: {plural(result.keys_without_ttl, 'room key')} {'has' if result.keys_without_ttl == 1 else 'have'} "
            "NO TTL and will never expire "
            f"(kvstatus never writes one; something else did): rooms {sample}",
            fg="red",
            bold=True,
        )
    else:
        click.echo("keys without TTL: 0 (good: every room will expire if it is abandoned)")
    if result.rooms_on_lost_participants:
        click.secho(
            safe(
                f"STUCK: {plural(result.rooms_on_lost_participants, 'room')} "
                f"{'has' if result.rooms_on_lost_participants == 1 else 'have'} an open entry a dead participant "
                f"left (lease lost: {', '.join(result.lost_participants) or 'none'}; or restarted under its name): "
                "`kvstatus ls --lost` lists them, `kvstatus sweep` fails those of lost leases"
            ),
            fg="yellow",
            bold=True,
        )
    else:
        click.echo("rooms stuck on lost participants: 0")
    click.echo(_stuck_line(result.stuck_rooms, older_than, result.rooms_without_timeline))
    if result.stuck_by_holder:
        rows = [
            [f"{holder} (dead)" if holder in result.stuck_dead_holders else holder, count]
            for holder, count in sorted(result.stuck_by_holder.items())
        ]
        click.echo(table(["HOLDER", "STUCK ROOMS"], rows))
    if result.corrupted_rooms:
        click.secho(
            f"CORRUPTED: {plural(result.corrupted_rooms, 'room')} {'holds' if result.corrupted_rooms == 1 else 'hold'} "
            "values kvstatus does not write "
            f"(left as they are, not counted above):",
            fg="red",
            bold=True,
        )
        for message in result.corrupted_sample:
            click.echo(safe(f"  {message}"))
    if result.oldest:
        click.echo("")
        click.echo("oldest non-terminal rooms (least TTL left):")
        rows = [
            [v.room, ttl_text(v.ttl_ms), ", ".join(f"{n}={status_text(status)}" for n, status in reads(v).items())]
            for v in result.oldest
        ]
        click.echo(table(["ROOM", "TTL LEFT", "ENTRIES"], rows))
    if code:
        raise click.exceptions.Exit(code)


def _stuck_line(rooms: int, older_than: float, without_timeline: int) -> str:
    """E.g. "rooms stuck for 30 s or more (by their timelines): 2, by holder below; 5 open rooms have no timeline
    and cannot be judged"."""
    line = f"rooms stuck for {older_than:g} s or more (by their timelines): {rooms}"
    if rooms:
        line += ", by holder below (`kvstatus ls --stuck` lists them)"
    if without_timeline:
        line += (
            f"; {without_timeline} open {'room has' if without_timeline == 1 else 'rooms have'} no timeline "
            "and cannot be judged"
        )
    return line


def _render(schema_ns: str, snap: Snapshot, changes: list, interval: float, hash_rooms: bool = False) -> str:
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    lines = [
        f"kvstatus watch  namespace {schema_ns}  {now}  every {interval:g}s  (Ctrl-C to stop)",
        "",
        f"rooms {len(snap.rooms)}  entries: "
        + "  ".join(f"{s.name} {snap.by_status.get(s, 0)}" for s in KVPoll)
        + (f"  (skipped {plural(snap.corrupted, 'corrupted room')})" if snap.corrupted else ""),
        "",
    ]
    counts = {kind: sum(1 for c in changes if c.kind == kind) for kind in KINDS}
    lines.append("since last refresh: " + "  ".join(f"{k} {counts[k]}" for k in KINDS))
    for change in changes[:MAX_CHANGES_SHOWN]:
        after = ", ".join(f"{n}={s}" for n, s in change.after.items()) or "-"
        room = room_hash(change.room) if hash_rooms else change.room
        lines.append(safe(f"  {change.kind:<9} room {room}  {after}"))
    if len(changes) > MAX_CHANGES_SHOWN:
        lines.append(f"  ... and {len(changes) - MAX_CHANGES_SHOWN} more")
    return "\n".join(lines)


@main.command()
@click.option(
    "--interval", type=click.FloatRange(min=0.1), default=2.0, show_default=True, help="Seconds between refreshes."
)
@click.option("--count", type=click.IntRange(min=1), help="Stop after this many refreshes (default: until Ctrl-C).")
@batch_option
@click.option(
    "--hash-rooms",
    is_flag=True,
    help="Show each room as a stable hash instead of its id (the first 16 hex digits of SHA-256 of the decimal "
    "id), e.g. for logs shared outside the deployment.",
)
@json_option
@pass_env
def watch(env: CliEnv, interval: float, count: Optional[int], batch: int, hash_rooms: bool, as_json: bool) -> None:
    """A live view: rooms, entries by status, and the rooms that changed (new, advanced, failed, cleared) since the last refresh.

    With --json, streams JSON lines, one event each: a "snapshot" line per
    refresh with the counts ("by_status" counts entries, one per participant),
    then one "status" or "cleared" line per entry that changed since the
    previous refresh: room (a JSON integer), participant, status,
    previous_status, at_ms (Redis' clock), and for a Failed entry its reason
    and the room's first failure (docs/cli.md has the schema). Exits cleanly on Ctrl-C.

    Once the first refresh worked, a refresh that finds Redis unavailable (a
    restart, a failover) says so on stderr and the watch goes on; exits 1 if
    the last refresh of --count found it so.
    """
    schema = env.schema()
    terminal = sys.stdout.isatty() and not as_json
    previous: Optional[Snapshot] = None
    outage: list[BackendUnavailableError] = []  # the error of the refresh that failed last, while Redis is away

    def unavailable(error: Optional[BackendUnavailableError]) -> None:
        if error is None and outage:
            click.echo("Redis answers again", err=True)
        elif error is not None and not outage:
            click.echo(f"{error}\nkvstatus watch goes on: trying again every {interval:g} s", err=True)
        outage[:] = [error] if error is not None else []

    try:
        refreshes = watch_changes(
            env.backend(), schema, interval, count=count, batch=batch, detail=as_json, unavailable=unavailable
        )
        for snap, changes in refreshes:
            if as_json:
                emit_json(
                    {
                        "event": "snapshot",
                        "at_ms": snap.at_ms,
                        "rooms": len(snap.rooms),
                        "corrupted": snap.corrupted,
                        "entries": sum(snap.by_status.values()),
                        "by_status": {s.name: snap.by_status.get(s, 0) for s in KVPoll},
                    }
                )
                for event in entry_events(previous, snap) if previous is not None else ():
                    emit_json(event.to_json(hash_rooms))
                previous = snap
                continue
            if terminal:
                click.clear()
            click.echo(_render(schema.namespace, snap, changes, interval, hash_rooms))
            if not terminal:
                click.echo("")
    except KeyboardInterrupt:
        if not as_json:
            click.echo("\nstopped", err=True)
        return
    if outage:
        raise outage[0]  # the last refresh found Redis away: exit 1, as at the first


_VERDICT_MARKS = {
    "ok": click.style("ok  ", fg="green"),
    "warn": click.style("warn", fg="yellow", bold=True),
    "fail": click.style("fail", fg="red", bold=True),
}


@main.command()
@ttl_option("The store TTL in seconds your workers use, to check against SGLang's timeouts.")
@json_option
@pass_env
def doctor(env: CliEnv, ttl: float, as_json: bool) -> None:
    """Check connectivity, server version, topology, script load, TTL, and that the ACL allows every command kvstatus needs.

    Permissions are checked by running the real operations against a probe
    entry in the namespace (30 s TTL, removed afterwards). A read-only user
    (every read works, every write is refused) passes: it is what get, ls,
    stats and watch need. Each check prints one line with its verdict: ok,
    warn (it passed; the detail says what to look at) or fail. Exits 1 if any
    check fails (a warning does not).
    """
    schema = env.schema()
    checks = run_checks(env.backend(), schema, ttl, env.shown_url, scripts=env.scripts)
    if as_json:
        emit_json({"url": env.shown_url, "namespace": schema.namespace, "checks": [c.to_json() for c in checks]})
    else:
        for check in checks:
            click.echo(f"{_VERDICT_MARKS[check.verdict]}  {check.name:<20} {safe(check.detail)}")
    if not all(c.ok for c in checks):
        raise click.exceptions.Exit(1)


@main.command()
@click.option(
    "--user",
    metavar="NAME",
    help="The ACL user name [default: kvstatus-NAMESPACE, dashboard-NAMESPACE with --read-only, router-NAMESPACE "
    "with --router].",
)
@click.option(
    "--read-only",
    is_flag=True,
    help="The dashboard user: get, ls, stats, watch, doctor, the exporter and the board; no writes.",
)
@click.option(
    "--router",
    is_flag=True,
    help="The router user: cancel rooms and read them (get, room, failure), no SCAN, no near cache unless "
    "--near-cache; it still reaches every kvstatus function on the namespace's keys (docs/security.md).",
)
@click.option(
    "--scripts",
    type=click.Choice(["functions", "eval"]),
    default="functions",
    show_default=True,
    help="functions: the tenant recipe (FCALL of the library `kvstatus functions load` installs; its "
    'stores run with scripts="functions", the CLI with --scripts functions); eval: Redis 6 or one tenant per server (may run any Lua).',
)
@click.option(
    "--near-cache/--no-near-cache",
    default=None,
    help="--no-near-cache leaves out client|tracking, client|id and role: the user cannot learn other namespaces' room ids through CLIENT TRACKING, and its "
    "stores run without near cache [default: --near-cache, except with --router].",
)
@json_option
@pass_env
def acl(
    env: CliEnv,
    user: Optional[str],
    read_only: bool,
    router: bool,
    scripts: str,
    near_cache: Optional[bool],
    as_json: bool,
) -> None:
    """Print the ACL SETUSER line of a user confined to the namespace (>PASSWORD is a placeholder to replace).

    Run it with an admin user on every node (or put it in an aclfile). With
    the near cache (the default), the user may run CLIENT TRACKING: on the
    Redis versions kvstatus supports, ACL key patterns do not cover tracking
    prefixes, so it can receive the key names (room ids) another namespace
    writes, though never their values. Where tenants must not see each other's
    room ids, give them --no-near-cache (or one Redis per tenant, the only hard
    isolation); `kvstatus doctor` warns about a user that may track.

    --router prints the recipe of a router that cancels rooms (`kvstatus
    cancel`, store.cancel) and reads them. ACL cannot limit FCALL to one
    function: within its namespace a router can run every kvstatus function
    that needs no more than its commands (docs/security.md says what that is).
    --read-only and --router exclude each other (exit 2).
    """
    schema = env.schema()
    if read_only and router:
        raise click.UsageError("--read-only and --router are two different users: choose one")
    near_cache = (not router) if near_cache is None else near_cache
    name = user or f"{'dashboard' if read_only else 'router' if router else 'kvstatus'}-{schema.namespace}"
    recipe: dict[str, Any] = {"read_only": read_only, "router": router, "scripts": scripts, "near_cache": near_cache}
    line = acl_setuser_line(name, schema.namespace, prefix=schema.prefix, **recipe)
    if as_json:
        emit_json(
            {
                "user": name,
                "namespace": schema.namespace,
                "scripts": scripts,
                "near_cache": near_cache,
                "rules": acl_rules(schema.namespace, prefix=schema.prefix, **recipe),
            }
        )
        return
    click.echo(line)
    if router:
        click.echo(
            "kvstatus: a router may FCALL every kvstatus function, and HSET or PEXPIRE any key, of this namespace: "
            "it can fail, forge or expire any room of it, though not clear one by the script (docs/security.md)",
            err=True,
        )
    if near_cache:
        click.echo(
            "kvstatus: this user may run CLIENT TRACKING and so receive the room ids other namespaces write "
            "(not their values); --no-near-cache takes that away",
            err=True,
        )
    else:
        click.echo(
            "kvstatus: no near cache for this user: build its stores with near_cache=False (from_url's default), "
            "and its SGLang managers with KVSTATUS_SGLANG_NEAR_CACHE=0",
            err=True,
        )


@main.group()
def functions() -> None:
    """Load or list kvstatus' Redis 7 function library (the admin's step of the tenant ACL recipe).

    Stores built with scripts="functions" run the update rule by FCALL of
    this library and never load Lua themselves, so their ACL users need neither
    EVAL nor SCRIPT LOAD. Run `load` with an admin user, once per server (every
    primary of a cluster), and again after upgrading kvstatus.
    """


@functions.command(name="load")
@json_option
@pass_env
def functions_load(env: CliEnv, as_json: bool) -> None:
    """FUNCTION LOAD this kvstatus version's library (REPLACE; idempotent) on the server or every primary."""
    nodes = load_functions(env.backend())
    if as_json:
        emit_json({"library": LIBRARY_NAME, "nodes": nodes})
        return
    names = ", ".join(script.name for script in ALL_SCRIPTS)
    click.echo(
        f"loaded kvstatus' function library ({names}) on {', '.join(nodes)}; tenants run with --scripts functions"
    )


@functions.command(name="list")
@json_option
@pass_env
def functions_list(env: CliEnv, as_json: bool) -> None:
    """List the kvstatus libraries on each node; exit 1 if this version's is missing on one."""
    found = loaded_libraries(env.backend())
    if as_json:
        emit_json({"library": LIBRARY_NAME, "nodes": found})
    else:
        for node, names in found.items():
            shown = ", ".join(f"{n} (this version)" if n == LIBRARY_NAME else n for n in names) or "none"
            click.echo(safe(f"{node}: {shown}"))
    missing = [node for node, names in found.items() if LIBRARY_NAME not in names]
    if missing:
        raise NotFound(f"{LIBRARY_NAME} is not loaded on {', '.join(missing)}: run `kvstatus functions load`")


def _current(text: str) -> Optional[KVPoll]:
    return None if text.strip().lower() in ("missing", "none", "-") else STATUS.convert(text, None, None)


@main.command()
@click.argument("old", metavar="OLD")
@click.argument("new", type=STATUS, metavar="NEW")
@click.option(
    "--policy",
    type=click.Choice([p.value for p in Policy]),
    default=Policy.SEED.value,
    show_default=True,
    help="Which policy's rule to explain.",
)
@json_option
def explain(old: str, new: KVPoll, policy: str, as_json: bool) -> None:
    """Explain what the update rule does to a stored OLD status (or 'missing') given NEW. Offline: no Redis.

    Uses kvstatus.rule.apply_rule, the reference the tests hold the Lua script to.
    """
    try:
        current = _current(old)
    except click.BadParameter as exc:
        raise click.BadParameter(exc.message, param_hint="OLD") from None
    result = apply_rule(current, new, Policy(policy))
    if as_json:
        emit_json(
            {
                "old": None if current is None else current.name,
                "new": new.name,
                "policy": policy,
                "outcome": result.outcome.name,
                "status": None if result.status is None else result.status.name,
                "explanation": explain_rule(current, new, Policy(policy)),
            }
        )
        return
    click.echo(explain_rule(current, new, Policy(policy)))
