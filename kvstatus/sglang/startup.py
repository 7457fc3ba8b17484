"""What install() reads from a KV manager (its mode and addresses) and checks before it serves (:func:`check_store`:
a bad setting stops the start), and the one log line that says it took. docs/sglang.md ("A bad setting stops the
start", "How the plugin works inside")."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Optional

from kvstatus.errors import (
    AuthenticationError,
    BackendUnavailableError,
    InvalidArgumentError,
    KVStatusError,
    LeaseLostError,
    PermissionDeniedError,
)
from kvstatus.keys import MAX_ROOM, PROBE_PARTICIPANT, validate_address
from kvstatus.leasestate import this_process
from kvstatus.model import KVPoll
from kvstatus.sglang.outage import log
from kvstatus.translate import denies_a_key

if TYPE_CHECKING:
    from kvstatus._sync.store import StatusStore

MIN_SGLANG_VERSION = (0, 5, 23)
_MINIMUM = ".".join(map(str, MIN_SGLANG_VERSION))
TESTED_SGLANG_VERSION = "0.5.23"
# What install() reads or calls on a manager (sglang 0.5.23's CommonKVManager has all of them after __init__).
REQUIRED_ATTRIBUTES = (
    "request_status",
    "update_status",
    "check_status",
    "check_status_pp_consensus",
    "deferred_bootstrap",
    "_notify_bootstrap",
    "_deferred_ack_targets",
    "_deferred_ack_poisoned_rooms",
    "_staging_outstanding",
)
# The doctor's probe entry (ls, stats and watch never count it), written and cleared at once.
PROBE_ROOM = MAX_ROOM
PROBE_TTL_SECONDS = 30.0
_DENIED = re.compile(r"run the '([\w|]+)' command")


class SettingError(InvalidArgumentError):
    """A setting of the SGLang integration stops the start; ``setting`` names it (``url``, ``namespace``,
    ``near_cache``, ``lease_ttl``, ``scripts``, ``instance``: a live process holds the name)."""

    def __init__(self, message: str, *, setting: str) -> None:
        super().__init__(message)
        self.setting = setting


def version_tuple(version: str) -> tuple[int, ...]:
    """The leading release numbers of a version string: "0.5.23.post1" -> (0, 5, 23); () when there are none."""
    found = re.match(r"\d+(?:\.\d+)*", version)
    return tuple(int(part) for part in found.group().split(".")) if found else ()


def check_sglang_version(version: Optional[str] = None) -> str:
    """Return the installed sglang's version (or ``version``); raise :class:`SettingError` below the minimum."""
    if version is None:
        from importlib import metadata

        try:
            version = metadata.version("sglang")
        except metadata.PackageNotFoundError:
            raise SettingError(
                "sglang is not installed in this environment: the kvstatus plugin runs inside sglang's processes",
                setting="sglang",
            ) from None
    if version_tuple(version) < MIN_SGLANG_VERSION:  # (): no release numbers, below it too
        raise SettingError(
            f"sglang {version} is not supported: kvstatus needs sglang >= {_MINIMUM} (its CommonKVManager applies "
            "the strict update rule and has the deferred-ACK state install() resets); upgrade sglang, or unset the "
            "plugin's URL",
            setting="sglang",
        )
    return version


def check_manager(kv_manager: Any) -> None:
    """Raise :class:`InvalidArgumentError` when ``kv_manager`` lacks an attribute install() relies on."""
    if missing := [name for name in REQUIRED_ATTRIBUTES if not hasattr(kv_manager, name)]:
        raise InvalidArgumentError(
            f"{type(kv_manager).__name__} has no {', '.join(missing)}: not the KV manager of a supported sglang "
            f"(kvstatus needs sglang >= {_MINIMUM}, tested with {TESTED_SGLANG_VERSION})"
        )


def _setting_error(error: KVStatusError, step: str, store: StatusStore) -> SettingError:
    """The :class:`SettingError` for ``error`` met at ``step`` (read, write or lease) of :func:`check_store`."""
    if isinstance(error, AuthenticationError):
        return SettingError(f"Redis refused the URL's credentials (user name or password): {error}", setting="url")
    if isinstance(error, BackendUnavailableError):
        return SettingError(f"cannot reach Redis at {server_of(store.client)}: {error}", setting="url")
    if isinstance(error, LeaseLostError):
        return SettingError(f"the participant lease could not be held: {error}", setting="lease_ttl")
    if isinstance(error, PermissionDeniedError):
        denied = _DENIED.search(str(error))
        command = denied.group(1).lower() if denied else ""
        if store.near_cache is not None and step == "read" and command.startswith("client"):
            return SettingError(
                f"the URL's user may not set up the near cache (CLIENT TRACKING): turn the near "
                f"cache off, or grant +client|tracking +client|id ({error})",
                setting="near_cache",
            )
        if command.startswith(("eval", "script", "fcall")):
            hint = (
                "scripts=functions needs the functions recipe's commands, else use scripts=eval"
                if command.startswith("fcall")
                else "a user of the tenant recipe needs scripts=functions"
            )
            return SettingError(f"the URL's user may not run {command!r}: {hint} ({error})", setting="scripts")
        if step == "read" and denies_a_key(error):
            return SettingError(
                f"the URL's user may not read namespace {store.namespace!r}: the ACL's key pattern "
                f"must cover its keys ({error})",
                setting="namespace",
            )
        if step == "write":
            return SettingError(
                f"the URL's user may read namespace {store.namespace!r} but not write it (a read-only "
                f"user?): an SGLang manager needs the worker user ({error})",
                setting="url",
            )
        return SettingError(f"the URL's user lacks a command kvstatus needs ({error})", setting="url")
    if "function library" in str(error):
        return SettingError(str(error), setting="url")
    return SettingError(f"Redis at {server_of(store.client)} cannot serve kvstatus: {error}", setting="url")


def check_store(store: StatusStore) -> None:
    """Make the calls a manager will make, once: a script read, a probe write and clear (the doctor's participant,
    room 2**63 - 1, TTL 30 s), and the lease; raises :class:`SettingError` naming the setting at fault."""
    step = "read"
    try:
        store.get_many([PROBE_ROOM])  # connects, authenticates, runs get_many's script or function
        step = "write"
        probe = type(store)(  # the store's own class: this module never imports the store
            store.backend,
            namespace=store.namespace,
            prefix=store.prefix,
            participant=PROBE_PARTICIPANT,
            ttl=PROBE_TTL_SECONDS,
            scripts=store.scripts,
        )
        probe.update_status(PROBE_ROOM, KVPoll.Bootstrapping)
        probe.clear(PROBE_ROOM)
        if store.lease is not None:
            step = "lease"
            holder = None if store.lease.held else store.live_holder()
            if holder is not None:
                raise SettingError(
                    f"participant {store.participant} is held by a live process, {holder} (its lease is alive and "
                    f"its presence subscribed): this process, {this_process()}, will not take a live server's name; "
                    "give each server its own instance, or stop the other one",
                    setting="instance",
                )
            store.acquire_lease()
    except SettingError:
        raise
    except KVStatusError as exc:
        raise _setting_error(exc, step, store) from exc
    # A near cache the server refuses to track warned once and runs uncached (describe() shows it): no error.


def server_of(client: Any) -> str:
    """Where ``client`` connects, without credentials: ``host:port/db``, a socket path, or the cluster's nodes."""
    nodes = getattr(client, "startup_nodes", None) or getattr(
        getattr(client, "nodes_manager", None), "startup_nodes", None
    )
    if nodes:
        return "cluster " + ",".join(sorted(str(name) for name in nodes))
    pool = getattr(client, "connection_pool", None)
    if service := getattr(pool, "service_name", None):
        return f"sentinel service {service}"
    kwargs = getattr(pool, "connection_kwargs", {}) or {}
    if kwargs.get("path"):
        return f"unix:{kwargs['path']}/{kwargs.get('db', 0)}"
    if kwargs.get("host"):
        return f"{kwargs['host']}:{kwargs.get('port', 6379)}/{kwargs.get('db', 0)}"
    return type(client).__name__


def describe(status_map: Any, server: str) -> str:
    """The line logged when a manager is installed."""
    store = status_map.store
    lease, cache = store.lease, store.near_cache
    near = "off" if cache is None else "refused by the server (uncached)" if cache.refused else "on"
    held = "off" if lease is None else f"{lease.ttl:g} s (generation {lease.generation})"
    fate = "on" if store.shared_fate else "off"
    timeline = "on" if getattr(store, "timeline", False) else "off"
    pp = f", PP ranks {len(status_map.pp_participants)}" if status_map.pp_participants else ""
    return (
        f"kvstatus: SGLang KV manager {store.participant} on {server}, namespace {store.namespace}, "
        f"policy {store.policy.value}, scripts {store.scripts}, near cache {near}, lease {held}, "
        f"shared fate {fate}, timeline {timeline}{pp}"
    )


def mode_of(kv_manager: Any) -> str:
    """A manager's disaggregation mode: "prefill", "decode", or what it holds otherwise ("None": none)."""
    mode = getattr(kv_manager, "disaggregation_mode", None)
    return str(getattr(mode, "value", mode))


def bootstrap_address(kv_manager: Any) -> Optional[str]:
    """The ``host:port`` a decode names this prefill manager by (its receivers' ``bootstrap_addr``; matched exactly),
    or None (not a prefill, or no address)."""
    found = _host_port(kv_manager, "prefill") if mode_of(kv_manager) == "prefill" else None
    if found is None:
        return None
    host = found[0]
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    try:
        return validate_address(f"{host}:{found[1]}")
    except InvalidArgumentError:
        return None


def _host_port(kv_manager: Any, mode: str) -> Optional[tuple[str, int]]:
    """(host, port) of the manager's server in ``mode`` (a prefill's bootstrap server, a decode's HTTP server), a host
    bound to every interface named by the node's IP; None when unknown."""
    if mode == "prefill":
        host, port = getattr(kv_manager, "bootstrap_host", None), getattr(kv_manager, "bootstrap_port", None)
    elif mode == "decode":
        args = getattr(kv_manager, "server_args", None)
        host, port = getattr(args, "host", None), getattr(args, "port", None)
    else:
        return None
    try:
        number = int(port)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    text = str(host or "")
    if text in ("", "0.0.0.0", "::", "[::]"):
        text = str(getattr(kv_manager, "local_ip", None) or "")
    if not text or not 0 < number < 65536:
        return None
    return text, number


def server_tag(kv_manager: Any) -> Optional[str]:
    """What tells this manager's server from every other of its role, as a name part (``10.0.0.7-8998``, IPv6 colons
    made dots): a prefill's bootstrap address, a decode's ``server_args.host:port``; None when it carries neither."""
    found = _host_port(kv_manager, mode_of(kv_manager))
    if found is None:
        return None
    host = re.sub(r"[^A-Za-z0-9_.-]", ".", found[0].strip("[]"))
    return f"{host}-{found[1]}"


def await_address(kv_manager: Any, store: Any, room: int) -> None:
    """A decode manager opened ``room``: tell its store the prefill address the room waits on, if any (upstream's
    receiver files the room under its ``bootstrap_addr`` in ``addr_to_rooms_tracker`` before it opens it)."""
    tracker = getattr(kv_manager, "addr_to_rooms_tracker", None) or {}
    # list(): one C call, as the heartbeat thread may drop an address meanwhile
    address = next((str(address) for address, rooms in list(tracker.items()) if room in rooms), None)
    if address is None:
        return
    try:
        store.awaits(room, address)
    except InvalidArgumentError as exc:  # an address kvstatus cannot match (upstream's heartbeat still watches it)
        log.debug(
            "participant %s: room %d waits on %r, which no lease can carry: %s", store.participant, room, address, exc
        )
