"""``get``, ``set``, ``clear``, ``cancel`` and ``ls``: one room at a time, or all of them streamed."""

from __future__ import annotations

import json
import time
from typing import Any, Optional

import click

from kvstatus._sync.store import StatusStore
from kvstatus.admin.reads import (
    Deaths,
    entries,
    iter_rooms,
    read_deaths,
    room_matches,
    server_ms,
    without_probe,
)
from kvstatus.admin.stats import without_timeline
from kvstatus.admin.views import fate_text, read_names
from kvstatus.cli.app import (
    EXIT_REFUSED,
    ROOM,
    STATUS,
    CliEnv,
    NotFound,
    batch_option,
    emit_json,
    json_option,
    main,
    note_empty_namespace,
    older_than_option,
    participant_filter_option,
    participant_option,
    pass_env,
    safe,
    status_text,
    table,
    ttl_option,
    ttl_text,
)
from kvstatus.cli.text import StreamTable
from kvstatus.cli.timing import (
    STUCK_HEADERS,
    no_timeline_note,
    stuck_row,
    timeline_table,
    timelines_json,
)
from kvstatus.errors import CorruptedValueError, InvalidArgumentError
from kvstatus.keys import DEFAULT_TTL_SECONDS, truncate_reason
from kvstatus.model import FailureRecord, KVPoll, Outcome, Policy, RoomView, elapsed_text
from kvstatus.rule import reads
from kvstatus.stuck import stuck as stuck_room


def store_for(
    env: CliEnv,
    participant: Optional[str] = None,
    ttl: float = DEFAULT_TTL_SECONDS,
    policy: str = Policy.SEED.value,
    timeline: bool = False,
) -> StatusStore:
    schema = env.schema()
    return StatusStore(
        env.backend(),
        namespace=schema.namespace,
        prefix=schema.prefix,
        participant=participant,
        ttl=ttl,
        policy=policy,
        scripts=env.scripts,
        timeline=timeline,
    )


def room_json(view: RoomView) -> dict[str, Any]:
    read = read_names(view)
    document: dict[str, Any] = {
        "room": view.room,
        "exists": view.exists,
        "ttl_ms": view.ttl_ms,
        "participants": {
            name: {
                "status": None if e.status is None else e.status.name,
                "value": None if e.status is None else int(e.status),
                "reason": e.reason,
                "reads": read[name],
            }
            for name, e in view.participants.items()
        },
    }
    if view.tombstone is not None:
        document["cleared"] = {
            name: {
                "cleared_at": c.cleared_at,
                "status": None if c.status is None else c.status.name,
                "late_failed_at": c.late_failed_at,
            }
            for name, c in view.tombstone.cleared.items()
        }
    if view.failure is not None:
        document["failure"] = view.failure.to_json()
    if any(view.timelines.values()):
        document["timelines"] = timelines_json(view)
    return document


def failure_line(view: RoomView, failure: FailureRecord, now: float) -> str:
    """E.g. "first failure 3.0 s ago: cancelled by router-1: client went away; decode-0 reads Failed (shared fate)".

    ``now``: Unix seconds (the local clock, as for tombstones). The rest is the room's fate
    (:func:`kvstatus.admin.views.fate_text`), as every view shows it. Escaped (:func:`safe`)."""
    return safe(f"first failure {elapsed_text(now - failure.at)} ago: {fate_text(view)}")


def room_rows(view: RoomView, participant: Optional[str] = None) -> list[list[Any]]:
    """One row per entry: its status as its reads answer it (:func:`kvstatus.rule.reads`), and its own reason, or
    for an open entry that reads Failed because the room failed, the room's first failure (shared fate)."""
    read = reads(view)
    rows = []
    for name, e in entries(view, participant):
        reason = e.reason or "-"
        if view.failure is not None and read[name] != e.status:
            reason = f"shared fate (own entry {status_text(e.status)}): {view.failure.describe()}"
        rows.append([view.room, name, status_text(read[name]), ttl_text(view.ttl_ms), reason])
    return rows


ROOM_HEADERS = ["ROOM", "PARTICIPANT", "STATUS", "TTL LEFT", "REASON"]


@main.command()
@click.argument("rooms", nargs=-1, required=True, type=ROOM, metavar="ROOM...")
@json_option
@pass_env
def get(env: CliEnv, rooms: tuple[int, ...], as_json: bool) -> None:
    """Show the full view of each ROOM: every participant's status, failure reason and TTL left.

    Also the room's first failure (when, at which stage, by whom, why) and the
    open entries that read Failed because of it (shared fate), who cleared
    the room recently, and, when its writers record timelines, when each
    participant first reached each status, since the room's first step (by
    Redis' clock; in --json "timelines", each step's Unix ms). Exits 1 if any
    room does not exist, or holds a value kvstatus does not write (the other rooms are shown first).
    """
    store = store_for(env)
    views, corrupt = [], []
    for room in rooms:
        try:
            views.append(without_probe(store.room(room)))
        except CorruptedValueError as exc:  # one junk room must not hide the others (issue 36)
            corrupt.append(str(exc))
    missing = [v for v in views if not v.exists]
    if as_json:
        emit_json({"namespace": store.namespace, "rooms": [room_json(v) for v in views]})
    else:
        rows = [row for v in views for row in room_rows(v)]
        if rows:
            click.echo(table(ROOM_HEADERS, rows))
        now = time.time()
        for view in views:
            if view.exists and view.failure is not None:
                click.echo(f"room {view.room}: {failure_line(view, view.failure, now)}")
            if view.exists and view.tombstone is not None:
                for line in view.tombstone.describe(now):
                    click.echo(safe(f"room {view.room}: {line}"))
            shown = timeline_table(view) if view.exists else None
            if shown is not None:
                click.echo(f"room {view.room}: timeline, since the room's first step (Redis' clock):")
                click.echo(shown)
    if corrupt:
        raise CorruptedValueError("; ".join(corrupt + [_not_found(view, store.namespace) for view in missing]))
    if missing:
        raise NotFound(safe("; ".join(_not_found(view, store.namespace) for view in missing)))


def _not_found(view: RoomView, namespace: str) -> str:
    """Why a room is absent: its tombstone's account of the clears, or "expired or never created"."""
    if view.tombstone is not None:
        return f"room {view.room} not found in namespace {namespace!r}: " + "; ".join(view.tombstone.describe())
    return (
        f"room {view.room} not found in namespace {namespace!r} (no tombstone: it expired, was never created, "
        "or was cleared longer ago than the tombstone TTL)"
    )


@main.command(name="set")
@click.argument("room", type=ROOM)
@click.argument("status", type=STATUS)
@participant_option
@click.option("--reason", metavar="TEXT", help="Failure reason to record (only with STATUS Failed; first reason wins).")
@ttl_option("Least TTL in seconds this write leaves on the room key; a longer one stays (at most 30 days).")
@click.option(
    "--policy",
    type=click.Choice([p.value for p in Policy]),
    default=Policy.SEED.value,
    show_default=True,
    help="Update rule policy: seed (upstream rule) or strict (Failed is terminal, no late creates).",
)
@click.option(
    "--timeline",
    is_flag=True,
    help="Record when the entry reached STATUS, as a store built with timeline=True does (the SGLang plugin's "
    "default): `get` shows it and `ls --stuck` can judge the room.",
)
@json_option
@pass_env
def set_(
    env: CliEnv,
    room: int,
    status: KVPoll,
    participant: Optional[str],
    reason: Optional[str],
    ttl: float,
    policy: str,
    timeline: bool,
    as_json: bool,
) -> None:
    """Apply STATUS to ROOM through the same Lua update rule as the library, and print the outcome.

    STATUS is a name (case-insensitive) or a number: Failed=0, Bootstrapping=1,
    WaitingForInput=2, Transferring=3, Success=4. A write the rule refuses
    (REFUSED_CREATE, REFUSED_TERMINAL under --policy strict; REFUSED_SUPERSEDED)
    writes nothing: the outcome is printed all the same, the rule and the fix
    on stderr, and it exits 6.
    """
    if reason is not None and status != KVPoll.Failed:
        raise InvalidArgumentError("--reason goes with status Failed only")
    if reason is not None:
        truncate_reason(reason)  # a reason Redis cannot be sent is refused before the update writes Failed
    store = store_for(env, participant, ttl, policy, timeline)
    result = store.update_status(room, status)
    recorded = store.record_failure(room, reason) if reason is not None else None
    if as_json:
        emit_json(
            {
                "room": room,
                "participant": store.participant,
                "outcome": result.outcome.name,
                "status": None if result.status is None else result.status.name,
                "reason_recorded": recorded,
            }
        )
    else:
        line = f"room {room} {store.participant}: {result.outcome.name} -> {status_text(result.status)}"
        if recorded is not None:
            line += "; reason recorded" if recorded else "; reason not recorded (an earlier one is kept, or no entry)"
        click.echo(line)
    refused = _refusal(result.outcome, room, store.participant, status)
    if refused is not None:
        click.echo(f"kvstatus: {result.outcome.name}: {refused}", err=True)
        raise click.exceptions.Exit(EXIT_REFUSED)


def _refusal(outcome: Outcome, room: int, participant: str, status: KVPoll) -> Optional[str]:
    """Why the update rule refused a write, and what to do instead (one line), or None if it did not."""
    if outcome is Outcome.REFUSED_CREATE:
        return (
            f"under --policy strict only Bootstrapping or WaitingForInput may create an entry, and room {room} "
            f"has none for {participant} (never written, cleared or expired): nothing written. Write "
            f"Bootstrapping first, or --policy seed to create it as {status.name}"
        )
    if outcome is Outcome.REFUSED_TERMINAL:
        return (
            f"under --policy strict Failed is terminal, and room {room}'s entry for {participant} is Failed: "
            f"nothing written. `kvstatus clear {room} -p {participant}` removes the entry (then write it anew), "
            "or --policy seed lets it leave Failed"
        )
    if outcome is Outcome.REFUSED_SUPERSEDED:
        return (
            f"room {room}'s entry for {participant} is stamped by a later lease incarnation of {participant} (it "
            "restarted under that name): nothing written. Its running process owns the entry; `kvstatus clear "
            f"{room} -p {participant}` removes it if that process is gone"
        )
    return None


@main.command()
@click.argument("rooms", nargs=-1, required=True, type=ROOM, metavar="ROOM...")
@participant_option
@json_option
@pass_env
def clear(env: CliEnv, rooms: tuple[int, ...], participant: Optional[str], as_json: bool) -> None:
    """Remove the participant's entry (and its failure reason) from each ROOM. Clearing nothing is not an error."""
    store = store_for(env, participant)
    cleared = {room: store.clear(room) for room in dict.fromkeys(rooms)}  # a room named twice is cleared once
    if as_json:
        emit_json(
            {
                "namespace": store.namespace,
                "participant": store.participant,
                "rooms": [{"room": room, "cleared": removed} for room, removed in cleared.items()],
            }
        )
        return
    for room, removed in cleared.items():
        click.echo(f"room {room} {store.participant}: {'cleared' if removed else 'nothing to clear'}")


@main.command(name="ls")
@click.option("--status", "-s", type=STATUS, help="Only rooms with an entry in this status (name or number).")
@participant_filter_option
@click.option(
    "--limit",
    "-n",
    type=click.IntRange(min=1),
    help="Print at most this many rows (one per entry; with --json one line per room).",
)
@batch_option
@click.option(
    "--lost",
    is_flag=True,
    help="Only rooms with an open entry that a dead participant left: its lease is lost (what `kvstatus sweep` "
    "fails), or it restarted under the same name (the entry carries the previous incarnation's epoch).",
)
@click.option(
    "--stuck",
    is_flag=True,
    help="Only stuck rooms, one line each: the room, the participant holding it back (or '<role> (no entry)'), "
    "its status, and the seconds since any entry of the room moved (judged from the timelines, at Redis' clock). "
    "A room with an open entry a dead participant left (see --lost) is stuck at once, held by the dead one.",
)
@older_than_option
@json_option
@click.pass_context
def ls(
    ctx: click.Context,
    status: Optional[KVPoll],
    participant: Optional[str],
    limit: Optional[int],
    batch: int,
    lost: bool,
    stuck: bool,
    older_than: float,
    as_json: bool,
) -> None:
    """Stream the rooms of the namespace (SCAN in bounded batches, constant memory), in no particular order.

    Each entry shows the status its reads answer, as `get` does: an entry still
    open in a room that failed is Failed, its reason the room's first failure
    (shared fate); --status matches that status. With --json, one JSON object
    per room (JSON lines), each participant with "status" (as stored) and
    "reads". A room holding a value
    kvstatus does not write is skipped with a warning on stderr, and the exit code is 1.
    An empty namespace (often a mistyped name) exits 0 and says so on stderr.

    --stuck lists the rooms with an open entry whose timelines have not moved
    for --older-than (with --json: room, holder, status, seconds); open rooms
    without timelines cannot be judged and are counted on stderr. It exits 0
    whether or not it finds any, as every ls does: count the lines to alert.
    The other filters (--status, --participant, --lost) pick the rooms first.
    """
    if not stuck and ctx.get_parameter_source("older_than") is not click.core.ParameterSource.DEFAULT:
        raise click.UsageError("--older-than goes with --stuck (or with `kvstatus stats`)", ctx)
    env = ctx.find_object(CliEnv)
    assert env is not None
    schema = env.schema()
    client = env.backend()
    shown = 0
    text = StreamTable(STUCK_HEADERS if stuck else ROOM_HEADERS, block=batch)
    corrupted: list[int] = []
    deaths = read_deaths(client, schema) if lost or stuck else Deaths()
    now_ms = server_ms(client) if stuck else 0
    unjudged = 0

    def warn(room: int, message: str) -> None:
        corrupted.append(room)
        click.echo(safe(f"warning: skipped room {room}: {message}"), err=True)

    def rows_of(view: RoomView) -> list[Any]:
        """JSON lines (str), or table rows (lists)."""
        nonlocal unjudged
        if stuck:
            found = stuck_room(view, now_ms, older_than, deaths.left(view))
            if found is None:
                unjudged += without_timeline(view)
                return []
            return [json.dumps(found.to_json()) if as_json else stuck_row(found)]
        if as_json:
            return [json.dumps(room_json(view))]
        rows = room_rows(view, participant)
        if not view.participants and view.failure is not None:  # cancelled before anyone wrote it
            rows = [[view.room, "-", "-", ttl_text(view.ttl_ms), view.failure.describe()]]
        return [row for row in rows if status is None or row[2] == status_text(status)]

    seen = 0
    # Rows print in blocks of --batch, each sized to its content: never a header before an error from Redis.
    try:
        for view in iter_rooms(client, schema, batch, on_corrupt=warn):
            seen += 1
            if not room_matches(view, status, participant):
                continue
            if lost and not deaths.left(view):
                continue
            for row in rows_of(view):
                if as_json:
                    click.echo(row)
                else:
                    text.add(row)
                shown += 1
                if limit is not None and shown >= limit:
                    break
            if limit is not None and shown >= limit:
                break
    finally:
        text.flush()  # the rows read before an error from Redis are shown
    if not as_json:
        text.close()
    if seen == 0 and not corrupted:
        note_empty_namespace(schema)
    if unjudged:
        click.echo(no_timeline_note(unjudged), err=True)
    if corrupted:
        held = "rooms hold" if len(corrupted) != 1 else "room holds"
        raise click.ClickException(
            f"{len(corrupted)} {held} values kvstatus does not write; skipped and left as they are"
        )
