"""Health and permission checks of a Redis for kvstatus (``kvstatus doctor``), without the CLI.

Permissions are checked by behaviour: the library's real operations run
against a probe entry (participant :data:`~kvstatus.keys.PROBE_PARTICIPANT`
in room :data:`PROBE_ROOM`) with a short TTL, cleared afterwards. ``ls``,
``stats`` and ``watch`` never count that entry.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

from redis import exceptions as rx
from redis.cluster import RedisCluster
from redis.sentinel import SentinelConnectionPool

from kvstatus import scripts as lua
from kvstatus._sync.store import StatusStore
from kvstatus.admin.reads import Link, client_of, iter_room_keys, round_trip, scan_clients
from kvstatus.backend import can_track
from kvstatus.errors import KVStatusError, PermissionDeniedError
from kvstatus.keys import DEFAULT_TTL_SECONDS, MAX_ROOM, PROBE_PARTICIPANT, KeySchema
from kvstatus.model import KVPoll, RoomView
from kvstatus.replies import text
from kvstatus.translate import REDIS_ERRORS, translate_error

PROBE_ROOM = MAX_ROOM
PROBE_TTL_SECONDS = 30.0
DOCTOR_STEP_SECONDS = 2.0  # how long the wait_for check waits for the server's push of the probe room's change
MIN_VERSION = (6, 0)
# SGLang's bootstrap and waiting timeouts; a room TTL below them could expire a live request.
SGLANG_TIMEOUT_SECONDS = 300.0

_DENIED_COMMAND = re.compile(r"run the '([\w|]+)' command")


@dataclass(frozen=True)
class Check:
    """One line of the report: ``ok`` False means the check failed; ``warning`` True (with ``ok``) that it passed
    but the detail says what to look at. :attr:`verdict` is one word of the three."""

    name: str
    ok: bool
    detail: str
    warning: bool = False

    @property
    def verdict(self) -> str:
        """ "ok", "warn" (passed, with something to look at) or "fail"."""
        return "fail" if not self.ok else "warn" if self.warning else "ok"

    def to_json(self) -> dict[str, Any]:
        return {"check": self.name, "ok": self.ok, "verdict": self.verdict, "detail": self.detail}


def probe_store(client: Any, schema: KeySchema, **settings: Any) -> StatusStore:
    """A store writing as the probe participant, with the probe's short TTL; it leaves nothing behind, not
    even a tombstone (none is written for the probe participant)."""
    return StatusStore(
        client,
        namespace=schema.namespace,
        prefix=schema.prefix,
        participant=PROBE_PARTICIPANT,
        ttl=PROBE_TTL_SECONDS,
        **settings,
    )


def denied_command(exc: BaseException) -> Optional[str]:
    """The command an ACL denial names, or None if ``exc`` is no ACL denial."""
    text = str(exc)
    if not isinstance(exc, (PermissionDeniedError, rx.NoPermissionError)) and "NOPERM" not in text:
        return None
    found = _DENIED_COMMAND.search(text)
    return found.group(1) if found else "a key of the namespace"


def topology(link: Link) -> str:
    client = client_of(link)
    if isinstance(client, RedisCluster):
        return f"cluster with {len(client.get_primaries())} primaries"
    pool = getattr(client, "connection_pool", None)
    if isinstance(pool, SentinelConnectionPool):
        return f"sentinel, service {pool.service_name!r}"
    return "standalone"


def _attempt(client: Any, action: Callable[[], Any]) -> tuple[bool, str]:
    """Run ``action`` on ``client`` under its admin deadline (:func:`kvstatus.admin.reads.round_trip`: a hung server
    fails the check, it does not hang the doctor); (True, "") or (False, why) with ACL denials named by command."""
    try:
        with round_trip(client):
            action()
        return True, ""
    except (KVStatusError, *REDIS_ERRORS) as exc:
        error = translate_error(exc)
        command = denied_command(error)
        return False, f"NOPERM {command}" if command else str(error)


# (name, writes?) of every operation the probe runs, in order ("script load" only with scripts="eval").
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
# Refused SCAN is no failure under scripts="functions": the tenant recipe gives it to the read-only user only.
OPTIONAL_OPERATIONS = ("scan",)


def _operations(scripts: str) -> tuple[tuple[str, bool], ...]:
    return tuple(op for op in PROBE_OPERATIONS if scripts == "eval" or op[0] != "script load")


def probe_operations(client: Any, schema: KeySchema, scripts: str = "eval") -> dict[str, tuple[Optional[bool], str]]:
    """Run each operation kvstatus needs against the probe entry; name -> (ok, why), ok None: not testable."""
    store = probe_store(client, schema, scripts=scripts)
    actions: dict[str, Callable[[], Any]] = {
        "update_status": lambda: store.update_status(PROBE_ROOM, KVPoll.Bootstrapping),
        "record_failure": lambda: store.record_failure(PROBE_ROOM, "kvstatus doctor probe"),
        "get": lambda: store.get(PROBE_ROOM),
        "get_many": lambda: store.get_many([PROBE_ROOM, PROBE_ROOM - 1]),
        "room": lambda: store.room(PROBE_ROOM),
        "clear": lambda: store.clear(PROBE_ROOM),
        "script load": lambda: [client_of(client).script_load(s.source) for s in lua.ALL],
        "scan": lambda: next(iter_room_keys(client, schema, batch=10), None),
    }
    results: dict[str, tuple[Optional[bool], str]] = {}
    for name, _ in _operations(scripts):
        if name == "record_failure" and not results["update_status"][0]:
            # Without an entry the script writes nothing, so it would pass without testing the write.
            results[name] = (None, "not tested: needs the entry update_status could not write")
            continue
        results[name] = _attempt(client, actions[name])
    if not results["clear"][0]:
        _attempt(client, lambda: store.clear(PROBE_ROOM))
    return results


def is_read_only(results: dict[str, tuple[Optional[bool], str]]) -> bool:
    """True for a read-only user (the README's dashboard recipe): every read allowed, every tested write refused."""
    operations = [op for op in PROBE_OPERATIONS if op[0] in results]
    writes = [name for name, w in operations if w and results[name][0] is not None]
    reads = [name for name, w in operations if not w]
    return bool(writes) and not any(results[n][0] for n in writes) and all(results[n][0] for n in reads)


def permission_checks(results: dict[str, tuple[Optional[bool], str]], scripts: str = "eval") -> list[Check]:
    """One check per operation, or one passing line for a read-only user that can do every read kvstatus does.

    With ``scripts="functions"`` a refused SCAN passes: the tenant recipe's worker has none.
    """
    operations = [op for op in PROBE_OPERATIONS if op[0] in results]
    if is_read_only(results):
        writes = [name for name, w in operations if w and results[name][0] is not None]
        why = ", ".join(f"{n}: {results[n][1]}" for n in writes)
        reads = ", ".join(name for name, w in operations if not w)
        return [
            Check(
                "acl",
                True,
                f"read-only user: reads ok, writes refused ({why}); every read works ({reads}): "
                "enough for get, ls, stats, watch and doctor; set and clear need a read-write user",
            )
        ]
    checks = []
    for name, _ in operations:
        ok, why = results[name]
        if not ok and scripts == "functions" and name in OPTIONAL_OPERATIONS:
            checks.append(
                Check(
                    f"acl {name}",
                    True,
                    f"refused ({why}): enough for every store operation (the "
                    "worker recipe); ls, stats, watch, the exporter and the board need the read-only "
                    "user, which has SCAN",
                )
            )
        else:
            checks.append(Check(f"acl {name}", bool(ok), "allowed" if ok else why))
    return checks


# Lua that cannot compile: a probe that is allowed fails to compile, so it never runs or loads anything.
_BROKEN_LUA = "return ("
_OWN_LUA_PROBES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("SCRIPT LOAD", ("SCRIPT", "LOAD", _BROKEN_LUA)),
    ("EVAL", ("EVAL", _BROKEN_LUA, "0")),
    ("FUNCTION LOAD", ("FUNCTION", "LOAD", "#!lua name=kvstatus_doctor_probe\n" + _BROKEN_LUA)),
)


def isolation_check(client: Any) -> Check:
    """Whether this user can run Lua of its own (SCRIPT LOAD, EVAL, FUNCTION LOAD), which no ACL confines.

    Informational (always ok): a tenant that can is not isolated from the
    other namespaces on the server; the functions recipe refuses all three.
    """
    allowed = []
    for name, command in _OWN_LUA_PROBES:
        try:
            with round_trip(client):
                scan_clients(client)[0].execute_command(*command)
            allowed.append(name)
        except (KVStatusError, *REDIS_ERRORS) as exc:
            if denied_command(translate_error(exc)) is None and "NOPERM" not in str(exc):
                allowed.append(name)  # refused for another reason (the Lua does not compile): allowed
    if not allowed:
        return Check(
            "isolation",
            True,
            "this user cannot run Lua of its own: SCRIPT LOAD, EVAL and FUNCTION LOAD refused (the tenant recipe)",
        )
    return Check(
        "isolation",
        True,
        f"this user may run Lua of its own ({', '.join(allowed)} allowed), "
        "which can read any key and block the whole server: fine for an admin, not for "
        "a tenant (use the functions recipe, docs/security.md)",
        warning=True,
    )


def _fcall_probe(client: Any) -> tuple[bool, str]:
    return _attempt(
        client,
        lambda: client_of(client).execute_command("FCALL_RO", lua.function_name(lua.GET_MANY), 0, PROBE_PARTICIPANT),
    )


def may_call_functions(client: Any) -> bool:
    """True if the ACL lets this user FCALL_RO (whether or not the library is loaded yet)."""
    ok, why = _fcall_probe(client)
    return ok or "Function not found" in why


def _outside(schema: KeySchema) -> str:
    """A prefix next to the namespace's but outside it (another namespace could be named so)."""
    return f"{schema.prefix}:{schema.namespace}-kvstatus-doctor-other:"


def tracking_check(client: Any, schema: KeySchema) -> Check:
    """Whether this user, confined to the namespace's keys, may still learn other key names by CLIENT TRACKING.

    ACL key patterns do not cover ``BCAST PREFIX`` on the Redis versions kvstatus supports (upstream
    redis/redis#15371, 2026, filters the invalidations). Informational (always ok): the near cache needs
    tracking; the detail says what it costs and what takes it away. The probe runs on a connection of its own,
    closed afterwards, so no tracking is left on.
    """
    node = scan_clients(client)[0]
    confined, _ = _attempt(client, lambda: node.execute_command("HGET", _outside(schema) + "{0}", PROBE_PARTICIPANT))
    confined = not confined
    pool = node.connection_pool
    try:
        with round_trip(client):
            conn = pool.get_connection()
    except REDIS_ERRORS as exc:
        return Check("tracking", True, f"not checked: {translate_error(exc)}")
    try:
        with round_trip(client):
            conn.send_command("CLIENT", "TRACKING", "ON", "BCAST", "PREFIX", _outside(schema))
            conn.read_response()
        tracks = True
    except rx.ResponseError:
        tracks = False
    except REDIS_ERRORS as exc:
        return Check("tracking", True, f"not checked: {translate_error(exc)}")
    finally:
        conn.disconnect()
        pool.release(conn)
    if not tracks:
        return Check(
            "tracking",
            True,
            "this user cannot run CLIENT TRACKING: it learns no key names of other "
            "namespaces (and its stores run without the near cache)",
        )
    if not confined:
        return Check(
            "tracking",
            True,
            "this user may read keys outside the namespace anyway: not a tenant, so "
            "CLIENT TRACKING shows it nothing new",
        )
    return Check(
        "tracking",
        True,
        "this user may run CLIENT TRACKING ... BCAST PREFIX with another "
        "namespace's prefix: ACL key patterns do not cover tracking prefixes on this "
        "server, so it receives the room ids (key names, not values) other tenants write. "
        "Where that matters, give it the recipe without the near cache (`kvstatus acl "
        "--no-near-cache`) or one Redis per tenant",
        warning=True,
    )


def functions_check(client: Any) -> Check:
    """With ``scripts="functions"``: is this version's function library loaded (an FCALL_RO of it, no keys)?"""
    ok, why = _fcall_probe(client)
    if ok:
        return Check("functions", True, f"library {lua.LIBRARY_NAME} loaded, FCALL_RO allowed")
    if "Function not found" in why:
        why = (
            f"library {lua.LIBRARY_NAME} is not loaded: an admin runs `kvstatus --url ADMIN_URL functions "
            "load` (once per server, every primary of a cluster)"
        )
    return Check("functions", False, why)


def ttl_check(client: Any, schema: KeySchema, ttl: float, write: bool = True, scripts: str = "eval") -> Check:
    """The store's TTL setting, and (``write``) whether a write through the store leaves a TTL on its key."""
    if not write:
        detail = f"store TTL {ttl:g} s; the write check is skipped: a read-only user cannot write the probe"
        if ttl < SGLANG_TIMEOUT_SECONDS:
            return Check("ttl", False, detail + f"; below SGLang's {SGLANG_TIMEOUT_SECONDS:g} s timeouts")
        return Check("ttl", True, detail)
    store = probe_store(client, schema, scripts=scripts)
    ok, why = _attempt(client, lambda: store.update_status(PROBE_ROOM, KVPoll.Bootstrapping))
    if not ok:
        return Check("ttl", False, f"store TTL {ttl:g} s; could not write the probe entry: {why}")
    views: list[RoomView] = []
    try:
        ok, why = _attempt(client, lambda: views.append(store.room(PROBE_ROOM)))
    finally:
        _attempt(client, lambda: store.clear(PROBE_ROOM))
    if not ok:
        return Check("ttl", False, f"store TTL {ttl:g} s; could not read the probe entry back: {why}")
    view = views[0]
    if view.ttl_ms is None or not 0 < view.ttl_ms <= PROBE_TTL_SECONDS * 1000:
        return Check("ttl", False, f"store TTL {ttl:g} s, but the probe key has no TTL after a write")
    detail = f"store TTL {ttl:g} s, refreshed by every write (probe key got {view.ttl_ms} ms of {PROBE_TTL_SECONDS * 1000:g})"
    if ttl < SGLANG_TIMEOUT_SECONDS:
        return Check(
            "ttl", False, detail + f"; below SGLang's {SGLANG_TIMEOUT_SECONDS:g} s timeouts, live rooms may expire"
        )
    return Check("ttl", True, detail)


def _hello_version(node: Any) -> str:
    """The server's name and version from HELLO (no INFO: the ACL recipes do not grant it): "Valkey 9.1.2"."""
    reply = node.execute_command("HELLO")
    fields = reply if isinstance(reply, dict) else dict(zip(reply[::2], reply[1::2]))
    hello = {text(key): text(value) for key, value in fields.items()}
    return f"{_server_name(hello.get('server', 'redis'))} {hello.get('version')}"


def _info_version(node: Any) -> str:
    """The server's name and version from INFO: Valkey reports Redis 7.2.4 as redis_version, its own apart."""
    info = node.info("server")
    if str(info.get("server_name", "")).lower() == "valkey":
        return f"Valkey {info.get('valkey_version')}"
    return f"Redis {info.get('redis_version')}"


def _server_name(name: str) -> str:
    return "Valkey" if name.lower() == "valkey" else "Redis"


def version_check(node: Any) -> Check:
    """The server's version from INFO, or HELLO where the ACL refuses INFO (the recipes do); Redis 6.0 or later
    (Valkey: every release is)."""
    version: list[str] = []
    ok, why = _attempt(node, lambda: version.append(_info_version(node)))
    if not ok and why.startswith("NOPERM"):
        ok, why = _attempt(node, lambda: version.append(_hello_version(node)))
    if not ok:
        if "unknown command" in why:
            return Check("server version", True, "unknown: the server does not implement INFO (fakeredis?)")
        return Check("server version", False, why)
    parts = tuple(int(p) for p in re.findall(r"\d+", version[0])[:2])
    if version[0].startswith("Redis") and parts < MIN_VERSION:
        return Check(
            "server version", False, f"{version[0]}; kvstatus needs {'.'.join(map(str, MIN_VERSION))} or later"
        )
    return Check("server version", True, version[0])


def run_checks(
    client: Any, schema: KeySchema, ttl: float = DEFAULT_TTL_SECONDS, where: str = "", scripts: str = "eval"
) -> list[Check]:
    """Every check, in order; stops after connectivity if Redis cannot be reached.

    ``scripts`` is the store's mode: "eval" checks SCRIPT LOAD, "functions" that the library is loaded.
    """
    ok, why = _attempt(client, lambda: [node.ping() for node in scan_clients(client)])
    checks = [Check("connectivity", ok, f"PONG from {where}" if ok else why)]
    if not ok:
        return checks
    checks.append(version_check(scan_clients(client)[0]))
    checks.append(Check("topology", True, topology(client)))
    if scripts == "functions":
        checks.append(functions_check(client))
    else:
        ok, why = _attempt(client, lambda: [client_of(client).script_load(s.source) for s in lua.ALL])
        names = ", ".join(s.name for s in lua.ALL)
        if not ok and why.startswith("NOPERM") and may_call_functions(client):
            # A tenant of the functions recipe on an eval URL: say so once, then check what would work.
            why += (
                ": this user may not run Lua by EVALSHA or SCRIPT LOAD, but may FCALL kvstatus' function library "
                "(the tenant recipe): pass --scripts functions / KVSTATUS_SCRIPTS=functions (stores: "
                'scripts="functions"); the checks below are run that way'
            )
            scripts = "functions"
        checks.append(Check("script load", ok, f"loaded {names}" if ok else why))
        if scripts == "functions":
            checks.append(functions_check(client))
    results = probe_operations(client, schema, scripts)
    write = not is_read_only(results)
    checks.append(ttl_check(client, schema, ttl, write=write, scripts=scripts))
    checks.extend(permission_checks(results, scripts))
    checks.append(isolation_check(client))
    fake = not can_track(client_of(client))
    if fake:
        checks.append(Check("tracking", True, "not tested: fakeredis has no CLIENT TRACKING"))
    else:
        checks.append(tracking_check(client, schema))
    if fake:
        checks.append(Check("near cache / wait_for push", True, "not tested: fakeredis has no CLIENT TRACKING"))
    else:
        checks.append(near_cache_check(client, schema))
        checks.append(wait_check(client, schema, write=write, scripts=scripts))
    return checks


def near_cache_check(client: Any, schema: KeySchema) -> Check:
    """Whether the near cache can open its links (CLIENT ID, CLIENT TRACKING; HELLO 3 on the invalidation link).
    Never a failure: the cache is opt-in, and the detail says what a user without it lacks."""
    store = probe_store(client, schema, near_cache=True)
    try:
        ok, why = _attempt(client, lambda: store.get(PROBE_ROOM))
        refused = store.near_cache.refused  # the cache runs uncached when the server refuses tracking
        if refused:
            ok, why = False, refused
    finally:
        store.near_cache.close()
    if ok:
        return Check("near cache", True, "CLIENT TRACKING is allowed")
    # A store without it runs uncached (SGLang managers included, with one warning): reported, not failed.
    return Check(
        "near cache",
        True,
        f"not available to this user: {why}; its stores and SGLang managers run uncached, a round trip a poll "
        "(grant +client|tracking +client|id for it)",
        warning=True,
    )


def wait_check(client: Any, schema: KeySchema, write: bool = True, scripts: str = "eval") -> Check:
    """Whether wait_for is told of changes: a near cache reads the probe room (Redis then tracks it), the probe
    entry is written, and the server's invalidation must reach the cache. ``write`` False (a read-only user): only
    the tracked read is checked. Only a failed probe write fails: without pushes wait_for still works, by
    polling every 50 ms, and the detail says so."""
    watcher = probe_store(client, schema, near_cache=True)
    store = probe_store(client, schema, scripts=scripts)
    cache = watcher.near_cache
    assert cache is not None
    pushed = threading.Event()
    try:
        ok, why = _attempt(client, lambda: watcher.get(PROBE_ROOM))
        if cache.refused:
            return Check(
                "wait_for push",
                True,
                f"not available to this user: cannot watch a room ({cache.refused}); wait_for polls "
                "every 50 ms instead (needs +client|tracking +client|id)",
                warning=True,
            )
        if not ok:
            return Check("wait_for push", False, f"could not watch the probe room: {why}")
        if not write:
            return Check("wait_for push", True, "waiters can watch rooms (read-only user)")
        before = cache.state.pushed
        cache.watch(PROBE_ROOM, pushed.set)
        ok, why = _attempt(client, lambda: store.update_status(PROBE_ROOM, KVPoll.Bootstrapping))
        if not ok:
            return Check("wait_for push", False, f"could not write the probe entry: {why}")
        ends = time.monotonic() + DOCTOR_STEP_SECONDS
        while cache.state.pushed == before and pushed.wait(max(0.0, ends - time.monotonic())):
            pushed.clear()  # woken by something else (a link reset empties the cache): wait on
        if cache.state.pushed == before:
            return Check("wait_for push", False, "the server did not tell the watch of the probe room's change")
        return Check("wait_for push", True, "changes are pushed to waiters")
    finally:
        cache.close()
        if write:
            _attempt(client, lambda: store.clear(PROBE_ROOM))
