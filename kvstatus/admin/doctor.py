"""Health and permission checks of a Redis for kvstatus (``kvstatus doctor``), without the CLI.

Permissions are checked by behaviour: the library's real operations run
against a probe entry (participant :data:`~kvstatus.admin.scan.PROBE_PARTICIPANT`
in room :data:`PROBE_ROOM`) with a short TTL, cleared afterwards. ``ls``,
``stats`` and ``watch`` never count that entry.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Optional

from redis import exceptions as rx
from redis.cluster import RedisCluster
from redis.sentinel import SentinelConnectionPool

from kvstatus import scripts
from kvstatus.admin.scan import PROBE_PARTICIPANT, iter_room_keys, scan_clients
from kvstatus.errors import KVStatusError, PermissionDeniedError
from kvstatus.keys import MAX_ROOM, KeySchema
from kvstatus.operations import DEFAULT_TTL_SECONDS
from kvstatus.rule import KVPoll, RoomView
from kvstatus.store import StatusStore
from kvstatus.translate import REDIS_ERRORS, translate_error

PROBE_ROOM = MAX_ROOM
PROBE_TTL_SECONDS = 30.0
MIN_VERSION = (6, 0)
# SGLang's bootstrap and waiting timeouts; a room TTL below them could expire a live request.
SGLANG_TIMEOUT_SECONDS = 300.0

_DENIED_COMMAND = re.compile(r"run the '([\w|]+)' command")


@dataclass(frozen=True)
class Check:
    """One line of the report: ``ok`` False means the check failed."""

    name: str
    ok: bool
    detail: str

    def to_json(self) -> dict[str, Any]:
        return {"check": self.name, "ok": self.ok, "detail": self.detail}


def denied_command(exc: BaseException) -> Optional[str]:
    """The command an ACL denial names, or None if ``exc`` is no ACL denial."""
    text = str(exc)
    if not isinstance(exc, (PermissionDeniedError, rx.NoPermissionError)) and "NOPERM" not in text:
        return None
    found = _DENIED_COMMAND.search(text)
    return found.group(1) if found else "a key of the namespace"


def topology(client: Any) -> str:
    if isinstance(client, RedisCluster):
        return f"cluster with {len(client.get_primaries())} primaries"
    pool = getattr(client, "connection_pool", None)
    if isinstance(pool, SentinelConnectionPool):
        return f"sentinel, service {pool.service_name!r}"
    return "standalone"


def _attempt(action: Callable[[], Any]) -> tuple[bool, str]:
    """Run ``action``; (True, "") or (False, why) with ACL denials named by command."""
    try:
        action()
        return True, ""
    except (KVStatusError, *REDIS_ERRORS) as exc:
        error = translate_error(exc)
        command = denied_command(error)
        return False, f"NOPERM {command}" if command else str(error)


# (name, writes?) of every operation the probe runs, in order.
PROBE_OPERATIONS = (
    ("update_status", True),
    ("record_failure", True),
    ("get", False),
    ("get_many", False),
    ("room", False),
    ("clear", True),
    ("script load", False),
    ("scan", False),
)


def probe_operations(client: Any, schema: KeySchema) -> dict[str, tuple[Optional[bool], str]]:
    """Run each operation kvstatus needs against the probe entry; name -> (ok, why), ok None: not testable."""
    store = StatusStore(client, namespace=schema.namespace, prefix=schema.prefix,
                        participant=PROBE_PARTICIPANT, ttl=PROBE_TTL_SECONDS,
                        tombstone_ttl=0)  # the probe leaves nothing behind, not even a tombstone
    actions: dict[str, Callable[[], Any]] = {
        "update_status": lambda: store.update_status(PROBE_ROOM, KVPoll.Bootstrapping),
        "record_failure": lambda: store.record_failure(PROBE_ROOM, "kvstatus doctor probe"),
        "get": lambda: store.get(PROBE_ROOM),
        "get_many": lambda: store.get_many([PROBE_ROOM, PROBE_ROOM - 1]),
        "room": lambda: store.room(PROBE_ROOM),
        "clear": lambda: store.clear(PROBE_ROOM),
        "script load": lambda: [client.script_load(s.source) for s in scripts.ALL],
        "scan": lambda: next(iter_room_keys(client, schema, batch=10), None),
    }
    results: dict[str, tuple[Optional[bool], str]] = {}
    for name, _ in PROBE_OPERATIONS:
        if name == "record_failure" and not results["update_status"][0]:
            # Without an entry the script writes nothing, so it would pass without testing the write.
            results[name] = (None, "not tested: needs the entry update_status could not write")
            continue
        results[name] = _attempt(actions[name])
    if not results["clear"][0]:
        _attempt(lambda: store.clear(PROBE_ROOM))
    return results


def is_read_only(results: dict[str, tuple[Optional[bool], str]]) -> bool:
    """True for a read-only user (the README's dashboard recipe): every read allowed, every tested write refused."""
    writes = [name for name, w in PROBE_OPERATIONS if w and results[name][0] is not None]
    reads = [name for name, w in PROBE_OPERATIONS if not w]
    return bool(writes) and not any(results[n][0] for n in writes) and all(results[n][0] for n in reads)


def permission_checks(results: dict[str, tuple[Optional[bool], str]]) -> list[Check]:
    """One check per operation, or one passing line for a read-only user that can do every read kvstatus does."""
    if is_read_only(results):
        writes = [name for name, w in PROBE_OPERATIONS if w and results[name][0] is not None]
        why = ", ".join(f"{n}: {results[n][1]}" for n in writes)
        reads = ", ".join(name for name, w in PROBE_OPERATIONS if not w)
        return [Check("acl", True, f"read-only user: reads ok, writes refused ({why}); every read works ({reads}): "
                                   "enough for get, ls, stats, watch and doctor; set and clear need a read-write user")]
    return [Check(f"acl {name}", bool(ok), "allowed" if ok else why)
            for name, (ok, why) in ((n, results[n]) for n, _ in PROBE_OPERATIONS)]


def ttl_check(client: Any, schema: KeySchema, ttl: float, write: bool = True) -> Check:
    """The store's TTL setting, and (``write``) whether a write through the store leaves a TTL on its key."""
    if not write:
        detail = f"store TTL {ttl:g} s; the write check is skipped: a read-only user cannot write the probe"
        if ttl < SGLANG_TIMEOUT_SECONDS:
            return Check("ttl", False, detail + f"; below SGLang's {SGLANG_TIMEOUT_SECONDS:g} s timeouts")
        return Check("ttl", True, detail)
    store = StatusStore(client, namespace=schema.namespace, prefix=schema.prefix,
                        participant=PROBE_PARTICIPANT, ttl=PROBE_TTL_SECONDS,
                        tombstone_ttl=0)  # the probe leaves nothing behind, not even a tombstone
    ok, why = _attempt(lambda: store.update_status(PROBE_ROOM, KVPoll.Bootstrapping))
    if not ok:
        return Check("ttl", False, f"store TTL {ttl:g} s; could not write the probe entry: {why}")
    views: list[RoomView] = []
    try:
        ok, why = _attempt(lambda: views.append(store.room(PROBE_ROOM)))
    finally:
        _attempt(lambda: store.clear(PROBE_ROOM))
    if not ok:
        return Check("ttl", False, f"store TTL {ttl:g} s; could not read the probe entry back: {why}")
    view = views[0]
    if view.ttl_ms is None or not 0 < view.ttl_ms <= PROBE_TTL_SECONDS * 1000:
        return Check("ttl", False, f"store TTL {ttl:g} s, but the probe key has no TTL after a write")
    detail = f"store TTL {ttl:g} s, refreshed by every write (probe key got {view.ttl_ms} ms of {PROBE_TTL_SECONDS * 1000:g})"
    if ttl < SGLANG_TIMEOUT_SECONDS:
        return Check("ttl", False, detail + f"; below SGLang's {SGLANG_TIMEOUT_SECONDS:g} s timeouts, live rooms may expire")
    return Check("ttl", True, detail)


def version_check(node: Any) -> Check:
    """The server's version from INFO; Redis 6.0 or later is needed (ACLs)."""
    version: list[str] = []
    ok, why = _attempt(lambda: version.append(str(node.info("server").get("redis_version"))))
    if not ok:
        if "unknown command" in why:
            return Check("server version", True, "unknown: the server does not implement INFO (fakeredis?)")
        return Check("server version", False, why)
    parts = tuple(int(p) for p in re.findall(r"\d+", version[0])[:2])
    if parts < MIN_VERSION:
        return Check("server version", False, f"Redis {version[0]}; kvstatus needs {'.'.join(map(str, MIN_VERSION))} or later")
    return Check("server version", True, f"Redis {version[0]}")


def run_checks(client: Any, schema: KeySchema, ttl: float = DEFAULT_TTL_SECONDS, where: str = "") -> list[Check]:
    """Every check, in order; stops after connectivity if Redis cannot be reached."""
    ok, why = _attempt(lambda: [node.ping() for node in scan_clients(client)])
    checks = [Check("connectivity", ok, f"PONG from {where}" if ok else why)]
    if not ok:
        return checks
    checks.append(version_check(scan_clients(client)[0]))
    checks.append(Check("topology", True, topology(client)))
    ok, why = _attempt(lambda: [client.script_load(s.source) for s in scripts.ALL])
    names = ", ".join(s.name for s in scripts.ALL)
    checks.append(Check("script load", ok, f"loaded {names}" if ok else why))
    results = probe_operations(client, schema)
    checks.append(ttl_check(client, schema, ttl, write=not is_read_only(results)))
    checks.extend(permission_checks(results))
    return checks
