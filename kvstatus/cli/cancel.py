"""``cancel``: fail rooms for every participant, with a reason, through the update rule (lua/cancel.lua)."""

from __future__ import annotations

from typing import Any, Optional

import click

from kvstatus.admin.reads import read_rooms
from kvstatus.cli.app import (
    EXIT_SERVED,
    ROOM,
    CliEnv,
    batch_of,
    emit_json,
    json_option,
    main,
    pass_env,
    plural,
    safe,
)
from kvstatus.cli.rooms import store_for
from kvstatus.errors import InvalidArgumentError
from kvstatus.keys import truncate_reason, validate_name
from kvstatus.model import CancelOutcome, CancelResult, FailureRecord

DEFAULT_ORIGIN = "operator"


@main.command()
@click.argument("rooms", nargs=-1, required=True, type=ROOM, metavar="ROOM...")
@click.option(
    "--reason",
    required=True,
    metavar="TEXT",
    help="Why (required, not empty): recorded as the room's first failure and in each failed entry's reason.",
)
@click.option(
    "--origin",
    default=DEFAULT_ORIGIN,
    show_default=True,
    metavar="NAME",
    help="Who cancels, recorded with the failure (letters, digits, _ . -), e.g. router-1.",
)
@batch_of("Rooms per round trip (each batch is one cancel_many; the lines of a batch print when it is done).")
@json_option
@pass_env
def cancel(env: CliEnv, rooms: tuple[int, ...], reason: str, origin: str, batch: int, as_json: bool) -> None:
    """Cancel each ROOM for every participant: its open entries become Failed, and the room's first failure is
    recorded (stage cancelled, by --origin, with --reason) unless it failed before.

    Open entries (Bootstrapping, WaitingForInput, Transferring) are failed
    through the update rule's FAILED row with the reason "cancelled by ORIGIN:
    REASON"; Success and Failed entries stay. A room with no entry yet is
    cancelled too: a participant that writes it later reads Failed. Every room
    is checked before the first write. Exits 0 when every room is failed,
    whether by this cancel or before (a room that had already failed is said
    so, with its first failure); a cancel Redis interrupted is safe to run again.
    A room already fully served (every entry Success, no failure) is left as
    it is, nothing failed or recorded, and said so (ALREADY_SERVED); then it
    exits 7, once every room is done.
    """
    if not reason.strip():
        raise InvalidArgumentError("--reason must not be empty: say why the rooms are cancelled (it is recorded)")
    truncate_reason(reason)  # not text (a lone surrogate from undecodable bytes): refused before any write
    validate_name(origin, "origin")
    store = store_for(env)
    unique = list(dict.fromkeys(rooms))  # a room named twice is cancelled once
    documents: list[dict[str, Any]] = []
    served = 0
    for start in range(0, len(unique), batch):
        results = store.cancel_many(unique[start : start + batch], reason, origin=origin)
        served += sum(1 for r in results.values() if r.outcome is CancelOutcome.ALREADY_SERVED)
        earlier = _first_failures(
            env, [room for room, r in results.items() if r.outcome is CancelOutcome.ALREADY_FAILED]
        )
        for room, result in results.items():
            if as_json:
                documents.append(_cancel_json(room, result, earlier))
            else:
                click.echo(_cancel_text(room, result, earlier))
    if as_json:
        emit_json({"namespace": store.namespace, "origin": origin, "reason": reason, "rooms": documents})
    if served:
        click.echo(
            f"kvstatus: {plural(served, 'room was', 'rooms were')} already fully served (every entry Success): "
            "left as they are, nothing failed or recorded",
            err=True,
        )
        raise click.exceptions.Exit(EXIT_SERVED)


def _first_failures(env: CliEnv, rooms: list[int]) -> dict[int, Optional[FailureRecord]]:
    """The first failures of ``rooms`` that had failed before the cancel, in one pipelined read (None: unreadable,
    warned about on stderr; the cancel itself is done)."""
    if not rooms:
        return {}
    schema = env.schema()

    def warn(room: int, message: str) -> None:
        click.echo(safe(f"warning: room {room}: {message}"), err=True)

    found: dict[int, Optional[FailureRecord]] = dict.fromkeys(rooms)
    for view in read_rooms(env.backend(), schema, schema.room_keys(rooms), on_corrupt=warn, with_ttl=False):
        found[view.room] = view.failure
    return found


def _entries(count: int) -> str:
    return f"{plural(count, 'open entry', 'open entries')} failed"


def _cancel_text(room: int, result: CancelResult, earlier: dict[int, Optional[FailureRecord]]) -> str:
    if result.outcome is CancelOutcome.CANCELLED:
        return f"room {room}: cancelled, {_entries(result.failed)}"
    if result.outcome is CancelOutcome.ALREADY_SERVED:
        return f"room {room}: already served (every entry is Success): nothing failed, no failure recorded"
    failure = earlier.get(room)
    first = f"first failure: {failure.describe()}" if failure is not None else "its first failure could not be read"
    return safe(f"room {room}: had already failed ({first}), {_entries(result.failed)}")


def _cancel_json(room: int, result: CancelResult, earlier: dict[int, Optional[FailureRecord]]) -> dict[str, Any]:
    document: dict[str, Any] = {"room": room, "outcome": result.outcome.name, "failed": result.failed}
    if result.outcome is CancelOutcome.ALREADY_FAILED:
        failure = earlier.get(room)
        document["first_failure"] = None if failure is None else failure.to_json()
    return document
