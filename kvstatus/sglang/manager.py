"""install(): put one SGLang KV manager (any object with the attributes of sglang 0.5.23's ``CommonKVManager``)
onto a kvstatus store; sglang is never imported here. docs/sglang.md ("How the plugin works inside")."""

from __future__ import annotations

from collections import OrderedDict
from contextlib import suppress
from datetime import datetime, timezone
from typing import Any, Callable, Optional, Union

from kvstatus._sync.store import StatusStore
from kvstatus.errors import InvalidArgumentError, KVStatusError
from kvstatus.keys import validate_name
from kvstatus.model import STRICT_CREATORS, FailureRecord, KVPoll, Outcome, UpdateResult, to_policy
from kvstatus.sglang.mapping import INVALID_ROOM_RESULT, RoomStatusMap, invalid_room_reason, storable
from kvstatus.sglang.startup import (
    await_address,
    bootstrap_address,
    check_manager,
    check_store,
    describe,
    log,
    mode_of,
    server_of,
    server_tag,
)
from kvstatus.url import parse_url

# The class whose methods install() replaces; a subclass's own override (nixl's check_status) is kept.
UPSTREAM_CLASS = "CommonKVManager"
_PREVIOUS = "_kvstatus_previous_request_status"
_INSTALLED = "_kvstatus_replaced_methods"
# The rooms whose first failure one manager remembers having looked up (FailureNotes); the oldest is forgotten.
MAX_NOTED_ROOMS = 1024


def _rank(kv_manager: Any, name: str) -> int:
    return int(getattr(kv_manager, name, 0) or 0)


def participant_name(kv_manager: Any, instance: Optional[str] = None) -> str:
    """The participant name of a KV manager: ``<mode>-<instance>[-dp<d>][-adp<a>][-cp<c>]-tp<t>-pp<p>`` (``t``:
    ``kv_args.engine_rank``; dp/adp/cp when their size is above 1). ``instance`` None: the server's address
    (:func:`~kvstatus.sglang.startup.server_tag`), if any. docs/sglang.md ("How servers are named")."""
    mode = getattr(kv_manager, "disaggregation_mode", None)
    mode = str(getattr(mode, "value", mode) or "kv")
    tp = getattr(getattr(kv_manager, "kv_args", None), "engine_rank", None)
    if tp is None:
        tp = _rank(kv_manager, "attn_tp_rank")
    parts = [mode]
    if server := instance or server_tag(kv_manager):
        parts.append(server)
    for size, rank, tag in (
        ("system_dp_size", "system_dp_rank", "dp"),
        ("attn_dp_size", "attn_dp_rank", "adp"),
        ("attn_cp_size", "attn_cp_rank", "cp"),
    ):
        if _rank(kv_manager, size) > 1:
            parts.append(f"{tag}{_rank(kv_manager, rank)}")
    parts += [f"tp{int(tp)}", f"pp{_rank(kv_manager, 'pp_rank')}"]
    return validate_name("-".join(parts), "participant")


def pp_participants(kv_manager: Any, participant: str) -> Optional[list[str]]:
    """The participant of every PP rank of this manager's pipeline, rank 0 first (names differ only in their
    ``-pp<rank>`` suffix); None but for a prefill with ``pp_size > 1``, which SGLang gives a ``PPConsensusStore``."""
    pp_size, pp_rank = _rank(kv_manager, "pp_size"), _rank(kv_manager, "pp_rank")
    if pp_size <= 1 or mode_of(kv_manager) != "prefill":
        return None
    suffix = f"-pp{pp_rank}"
    if not participant.endswith(suffix):
        raise InvalidArgumentError(
            f"participant {participant!r} of PP rank {pp_rank} must end with {suffix!r}: rank 0 finds every rank's "
            "entry by that suffix"
        )
    return [f"{participant.removesuffix(suffix)}-pp{rank}" for rank in range(pp_size)]


DEFAULT_LEASE_TTL = 10.0
"""Seconds, as SGLang's own heartbeat (2 misses of 5 s). Renewed every TTL/3, a lease survives a stall of up to 2/3
of it. docs/guide.md ("Choosing lease_ttl")."""
URL_DEFAULTS: dict[str, object] = {"lease_ttl": DEFAULT_LEASE_TTL, "timeline": True}
"""What :func:`install` gives a store it opens from a URL over the store's own defaults: a lease (a dead manager
fails its rooms for every peer) and timelines; ``lease_ttl=None`` or ``timeline=False`` turn them off."""


def open_store(
    url: str,
    *,
    namespace: str,
    participant: str,
    policy: str = "strict",
    near_cache: Optional[bool] = None,
    **store_options: Any,
) -> StatusStore:
    """``StatusStore.from_url`` for one manager, with its near cache on unless ``near_cache=False`` (None: on), so a
    poll of an unchanged room (``in``, ``check_status``, the PP consensus) costs no round trip."""
    store_options["near_cache"] = near_cache is not False
    return StatusStore.from_url(url, namespace=namespace, participant=participant, policy=policy, **store_options)


def failure_text(record: FailureRecord) -> str:
    """What ``failure_exception`` reports for a room whose first failure is ``record`` (when: UTC, milliseconds),
    e.g. "cancelled by router-1: client went away (the room's first failure, at 2025-06-01T10:00:00.123Z, kvstatus)"."""
    when = datetime.fromtimestamp(record.at, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return f"{record.describe()} (the room's first failure, at {when}, kvstatus)"


class FailureNotes:
    """Puts a room's first failure in a manager's ``failure_records`` when its statuses answer Failed, never over a
    reason the manager recorded. One per manager, thread-safe under its ``failure_lock``; one round trip at most per
    room lifecycle; :data:`MAX_NOTED_ROOMS` rooms at most. docs/sglang.md ("First failures")."""

    def __init__(self, records: dict[Any, Any], lock: Any, store: Any, limit: int = MAX_NOTED_ROOMS) -> None:
        self.records, self.lock, self.store, self.limit = records, lock, store, limit
        # The store's outage, if any (RoomStatusMap.outage.reason): no look-up then, its reason is the cause.
        self.down: Callable[[], Optional[str]] = lambda: None
        # room -> the text this put in records (None while being looked up, or when there was nothing to put)
        self.noted: OrderedDict[int, Optional[str]] = OrderedDict()

    def failed(self, room: int, fallback: Optional[str] = None) -> None:
        """``room`` read Failed: record its first failure unless a reason is recorded (``fallback``: it has none)."""
        if not storable(room) or not self._claim(room):
            return  # an id the store cannot hold had its reason recorded when its request opened
        record, cause = None, self.down()  # an outage's reason: no look-up
        if cause is None:
            try:
                record = self.store.failure(room)
            except KVStatusError as exc:
                cause = (
                    "the room reads Failed in kvstatus (a participant failed it, or it was cancelled), but its first "
                    f"failure could not be read: {type(exc).__name__}: {exc}"
                )
        text = failure_text(record) if record is not None else fallback or cause
        if text is not None:
            self._put(room, text)

    def read_failed(self, room: int, reason: Optional[str]) -> None:
        """RoomStatusMap's ``on_failed``: ``reason`` (the store failed the read) is the cause; None: :meth:`failed`."""
        if reason is None:
            self.failed(room)
        elif storable(room) and self._claim(room):
            self._put(room, reason)

    def first_failure(self, room: int) -> Optional[str]:
        """The room's first failure as ``failure_exception`` reports it, or None (no record, or unreadable)."""
        if not storable(room) or self.down() is not None:
            return None
        try:
            record = self.store.failure(room)
        except KVStatusError:
            return None
        return None if record is None else failure_text(record)

    def _claim(self, room: int) -> bool:
        """True when nobody noted ``room`` and the manager holds no reason for it: this caller records one."""
        with self.lock:
            if room in self.noted or room in self.records:
                return False
            self.noted[room] = None  # claimed: another thread reading the room now does not look it up too
            while len(self.noted) > self.limit:
                self._forget(*self.noted.popitem(last=False))
        return True

    def _put(self, room: int, text: str) -> None:
        with self.lock:
            if room in self.noted and self.noted[room] is None and room not in self.records:
                self.records[room] = self.noted[room] = text

    def reopened(self, room: int) -> None:
        """A new request opened ``room`` on this manager: forget the previous one's lookup and record."""
        with self.lock:
            if room in self.noted:
                self._forget(room, self.noted.pop(room))

    def _forget(self, room: int, text: Optional[str]) -> None:
        if text is not None and self.records.get(room) is text:
            del self.records[room]  # a record failure_exception never took (called under the lock)

    def invalid_room(self, room: Any, status: KVPoll | int) -> None:
        """A write of a room id the store cannot hold: its reason becomes the request's, on an opening status or over
        a recorded reason only (a hostile peer's bad ids cannot grow ``failure_records``); none for an unhashable id."""
        with suppress(TypeError), self.lock:
            if status in STRICT_CREATORS or room in self.records:
                self.records[room] = invalid_room_reason(room)


def _status_methods(
    kv_manager: Any, status_map: RoomStatusMap, notes: Optional[FailureNotes]
) -> dict[str, Callable[..., Any]]:
    """The methods install() sets on ``kv_manager`` (instance attributes, called without ``self``): upstream's
    bodies, with one atomic store call. ``check_status`` is the map's own lookup, one call deep like upstream's."""
    self = kv_manager
    store = status_map.store
    awaits = store.lease is not None and mode_of(kv_manager) == "decode"

    def update_status(bootstrap_room: int, status: KVPoll | int) -> UpdateResult:
        result = status_map.update_status(bootstrap_room, status)
        if result.outcome is Outcome.CREATED:
            if status in STRICT_CREATORS:
                if awaits:  # the prefill it waits on is judged by its lease even if it never writes the room
                    await_address(self, store, bootstrap_room)
                # A new room lifecycle drops the deferred-ACK state of the previous request on this room.
                self._deferred_ack_targets.pop(bootstrap_room, None)
                self._deferred_ack_poisoned_rooms.discard(bootstrap_room)
                self._staging_outstanding.pop(bootstrap_room, None)
                if notes is not None:
                    notes.reopened(bootstrap_room)
        elif status == KVPoll.Failed and result.outcome in (Outcome.FAILED, Outcome.UNCHANGED):
            # Upstream notifies a deferred bootstrap on every Failed that finds an entry, even one already Failed.
            if self.deferred_bootstrap is not None:
                self._notify_bootstrap(bootstrap_room, self.deferred_bootstrap.fail(bootstrap_room))
        elif result is INVALID_ROOM_RESULT and notes is not None:
            notes.invalid_room(bootstrap_room, status)
        return result

    def check_status_pp_consensus(bootstrap_room: int) -> KVPoll:
        # A dead rank does not stall the room: with leases, the other ranks' peer watches fail its open entries
        # (kvstatus.peerwatch), so the minimum reads Failed. Without leases this is upstream's consensus.
        statuses = status_map.collect(bootstrap_room)
        if any(status is None for status in statuses):
            return KVPoll.Bootstrapping
        status = min(status for status in statuses if status is not None)
        if status == KVPoll.Failed and notes is not None:
            notes.failed(bootstrap_room, None)
        return status

    def record_failure(bootstrap_room: int, failure_reason: str) -> None:
        shown = failure_reason
        own = getattr(self, "DEFAULT_PREFILL_FAILURE_REASON", None)
        if notes is not None and (failure_reason in PLACEHOLDER_REASONS or failure_reason == own):
            # Upstream's "the prefill said Failed, no reason": the room's first failure, if any, is the cause.
            shown = notes.first_failure(bootstrap_room) or failure_reason
        with self.failure_lock:
            self.failure_records[bootstrap_room] = shown
        # Stored for the room's other participants too: best effort, never an error into the engine.
        try:
            status_map.record_failure(bootstrap_room, failure_reason)
        except KVStatusError as exc:
            log.warning(
                "participant %s: room %r: failure reason not stored: %s", status_map.participant, bootstrap_room, exc
            )

    return {
        "update_status": update_status,
        "check_status": status_map.__getitem__,
        "check_status_pp_consensus": check_status_pp_consensus,
        "record_failure": record_failure,
    }


PLACEHOLDER_REASONS: tuple[str, ...] = ("Failed to get kvcache from prefill instance, it might be dead",)
"""Reasons upstream records when it knows none (``CommonKVManager.DEFAULT_PREFILL_FAILURE_REASON``)."""


def install(
    kv_manager: Any,
    store_or_url: Union[StatusStore, str],
    *,
    participant: Optional[str] = None,
    policy: str = "strict",
    namespace: Optional[str] = None,
    instance: Optional[str] = None,
    near_cache: Optional[bool] = None,
    check: bool = True,
    **store_options: Any,
) -> RoomStatusMap:
    """Put ``kv_manager``'s room statuses into kvstatus; returns the :class:`RoomStatusMap` now in ``request_status``.

    ``store_or_url``: a :class:`~kvstatus.StatusStore` whose policy is ``policy`` (re-bound to this manager's
    participant), or a URL (``namespace`` required; ``near_cache`` and ``store_options`` go to :func:`open_store` over
    :data:`URL_DEFAULTS`). ``participant`` overrides :func:`participant_name`. The status methods and ``record_failure``
    become instance methods of one store call each, keeping upstream's side effects (a subclass's override is left
    alone); ``update_status`` returns the :class:`~kvstatus.UpdateResult`; :func:`uninstall` undoes it. docs/sglang.md.

    Raises :class:`~kvstatus.errors.InvalidArgumentError` for a manager already installed, lacking what install() relies
    on (:func:`~kvstatus.sglang.startup.check_manager`) or whose dict holds rooms, and for URL options with a store;
    with ``check``, :class:`~kvstatus.sglang.startup.SettingError` naming the setting at fault
    (:func:`~kvstatus.sglang.startup.check_store`). Logs one INFO line on ``kvstatus.sglang``.
    """
    if is_installed(kv_manager):
        raise InvalidArgumentError("this KV manager is already on kvstatus")
    check_manager(kv_manager)
    wanted = to_policy(policy)
    name = participant_name(kv_manager, instance) if participant is None else validate_name(participant, "participant")
    ranks = pp_participants(kv_manager, name)
    previous = getattr(kv_manager, "request_status", None)
    if isinstance(previous, dict) and previous:
        raise InvalidArgumentError(
            f"the KV manager already tracks {len(previous)} room(s) in its dict; install() before it serves requests"
        )
    if isinstance(store_or_url, str):
        if namespace is None:
            raise InvalidArgumentError("install() with a URL needs namespace=")
        server = parse_url(store_or_url).masked
        settings = {**URL_DEFAULTS, **store_options}
        address = bootstrap_address(kv_manager)
        if address is not None and "address" not in settings and settings["lease_ttl"]:
            settings["address"] = address  # its lease names it to the decodes that wait on it
        store = open_store(
            store_or_url, namespace=namespace, participant=name, policy=wanted.value, near_cache=near_cache, **settings
        )
    else:
        if namespace is not None or near_cache is not None or store_options:
            raise InvalidArgumentError(
                "namespace, near_cache and store options apply to a URL; build the store with them instead"
            )
        if store_or_url.policy != wanted:
            raise InvalidArgumentError(
                f"the store's policy is {store_or_url.policy.value!r} but install() was asked for {wanted.value!r}; "
                f"pass policy={store_or_url.policy.value!r} or build the store with policy={wanted.value!r}"
            )
        store = store_or_url if store_or_url.participant == name else store_or_url.for_participant(name)
        server = server_of(store.client)
    records, lock = getattr(kv_manager, "failure_records", None), getattr(kv_manager, "failure_lock", None)
    notes = FailureNotes(records, lock, store) if isinstance(records, dict) and lock is not None else None
    status_map = RoomStatusMap(store, pp_participants=ranks, on_failed=None if notes is None else notes.read_failed)
    if notes is not None:
        notes.down = status_map.outage.reason
    if check:
        try:
            check_store(store)
        except Exception:
            if isinstance(store_or_url, str):
                store.close()  # the store install() opened: its connections and threads go with it
            raise
    replaced = []
    for method_name, function in _status_methods(kv_manager, status_map, notes).items():
        owner = next((cls for cls in type(kv_manager).__mro__ if method_name in cls.__dict__), None)
        if owner is None or owner.__name__ == UPSTREAM_CLASS:
            setattr(kv_manager, method_name, function)
            replaced.append(method_name)
    if callable(getattr(kv_manager, "teardown", None)):
        kv_manager.teardown = _closing_teardown(kv_manager.teardown, status_map)
        replaced.append("teardown")
    setattr(kv_manager, _PREVIOUS, previous)
    setattr(kv_manager, _INSTALLED, tuple(replaced))
    kv_manager.request_status = status_map
    log.info(describe(status_map, server))
    return status_map


def _closing_teardown(teardown: Callable[[], Any], status_map: RoomStatusMap) -> Callable[[], Any]:
    """The manager's ``teardown``, then the map's close (the lease is released: the peers fail nothing of a manager
    that left in order); a teardown that raises closes nothing."""

    def closing() -> Any:
        result = teardown()
        status_map.close()
        return result

    return closing


def is_installed(kv_manager: Any) -> bool:
    """True when ``kv_manager.request_status`` is a :class:`RoomStatusMap`."""
    return isinstance(getattr(kv_manager, "request_status", None), RoomStatusMap)


def uninstall(kv_manager: Any) -> None:
    """Undo :func:`install`: the class's methods and the previous ``request_status`` are back (rooms are not copied)."""
    if not is_installed(kv_manager):
        raise InvalidArgumentError("this KV manager is not on kvstatus")
    for method_name in getattr(kv_manager, _INSTALLED, ()):
        kv_manager.__dict__.pop(method_name, None)
    kv_manager.request_status = kv_manager.__dict__.pop(_PREVIOUS, {})
    kv_manager.__dict__.pop(_INSTALLED, None)
