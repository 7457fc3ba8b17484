"""What install() reads from a KV manager and checks before it serves, and the one log line that says it took.

A misconfiguration must stop the engine's start, not surface at the first request: :func:`check_store` makes
the calls a manager will make, once, and raises :class:`SettingError` naming the setting at fault. What it
reads: the manager's mode, and a prefill's bootstrap address, which its lease carries and a decode's rooms wait
on. docs/sglang.md: "A bad setting stops the start", "One room, one fate" (a prefill already dead) and "How the
plugin works inside" (the minimum sglang, the check's calls).
"""

from __future__ import annotations

import logging
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
from kvstatus.translate import denies_a_key

if TYPE_CHECKING:
    from kvstatus._sync.store import StatusStore

log = logging.getLogger("kvstatus.sglang")

MIN_SGLANG_VERSION = (0, 5, 23)
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
    numbers = []
    for part in version.split("."):
        digits = re.match(r"\d+", part)
        if digits is None:
            break
        numbers.append(int(digits.group()))
        if digits.end() != len(part):
            break
    return tuple(numbers)


def check_sglang_version(version: Optional[str] = None) -> str:
    """Return the installed sglang's version (or ``version``); raise :class:`SettingError` below the minimum."""
    if version is None:
        from importlib.metadata import PackageNotFoundError
        from importlib.metadata import version as installed

        try:
            version = installed("sglang")
        except PackageNotFoundError:
            raise SettingError(
                "sglang is not installed in this environment: the kvstatus plugin runs inside sglang's processes",
                setting="sglang",
            ) from None
    found = version_tuple(version)
    if not found or found < MIN_SGLANG_VERSION:
        minimum = ".".join(map(str, MIN_SGLANG_VERSION))
        raise SettingError(
            f"sglang {version} is not supported: kvstatus needs sglang >= {minimum} (its "
            "CommonKVManager applies the strict update rule and has the deferred-ACK state "
            f"install() resets); upgrade sglang, or unset the plugin's URL",
            setting="sglang",
        )
    return version


def check_manager(kv_manager: Any) -> None:
    """Raise :class:`InvalidArgumentError` when ``kv_manager`` lacks an attribute install() relies on."""
    missing = [name for name in REQUIRED_ATTRIBUTES if not hasattr(kv_manager, name)]
    if missing:
        minimum = ".".join(map(str, MIN_SGLANG_VERSION))
        raise InvalidArgumentError(
            f"{type(kv_manager).__name__} has no {', '.join(missing)}: not the KV manager of a supported sglang "
            f"(kvstatus needs sglang >= {minimum}, tested with {TESTED_SGLANG_VERSION})"
        )


def _denied_command(error: PermissionDeniedError) -> str:
    found = _DENIED.search(str(error))
    return found.group(1).lower() if found else ""


def _setting_error(error: KVStatusError, step: str, store: StatusStore) -> SettingError:
    """The :class:`SettingError` for ``error`` met at ``step`` (read, write or lease) of :func:`check_store`."""
    namespace = store.namespace
    if isinstance(error, AuthenticationError):
        return SettingError(f"Redis refused the URL's credentials (user name or password): {error}", setting="url")
    if isinstance(error, BackendUnavailableError):
        return SettingError(f"cannot reach Redis at {server_of(store.client)}: {error}", setting="url")
    if isinstance(error, LeaseLostError):
        return SettingError(f"the participant lease could not be held: {error}", setting="lease_ttl")
    if isinstance(error, PermissionDeniedError):
        command = _denied_command(error)
        near_cache = store.near_cache is not None and step == "read"
        if near_cache and command.startswith("client"):
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
                f"the URL's user may not read namespace {namespace!r}: the ACL's key pattern "
                f"must cover its keys ({error})",
                setting="namespace",
            )
        if step == "write":
            return SettingError(
                f"the URL's user may read namespace {namespace!r} but not write it (a read-only "
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
    # A near cache the server refuses to track has said so once (a WARNING naming the permission) and runs
    # uncached: the manager works, at a round trip a poll. describe() shows it.


def server_of(client: Any) -> str:
    """Where ``client`` connects, without credentials: ``host:port/db``, a socket path, or the cluster's nodes."""
    nodes = getattr(client, "startup_nodes", None) or getattr(
        getattr(client, "nodes_manager", None), "startup_nodes", None
    )
    if nodes:
        return "cluster " + ",".join(sorted(str(name) for name in nodes))
    pool = getattr(client, "connection_pool", None)
    service = getattr(pool, "service_name", None)
    if service:
        return f"sentinel service {service}"
    kwargs = getattr(pool, "connection_kwargs", {}) or {}
    if kwargs.get("path"):
        return f"unix:{kwargs['path']}/{kwargs.get('db', 0)}"
    if kwargs.get("host"):
        return f"{kwargs['host']}:{kwargs.get('port', 6379)}/{kwargs.get('db', 0)}"
    return type(client).__name__


def describe(status_map: Any, server: str) -> str:
    """The line logged when a manager is installed: participant, server, namespace, policy, near cache, lease,
    shared fate, timeline."""
    store = status_map.store
    lease = store.lease
    cache = store.near_cache
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
    """The ``host:port`` a decode names this prefill manager by (the ``bootstrap_addr`` of its receivers), or None
    (not a prefill, or no address). A server bound to every interface (``--host 0.0.0.0``) is named by its
    node's IP, as upstream's ``local_ip``; addresses are matched exactly."""
    if mode_of(kv_manager) != "prefill":
        return None
    found = _host_port(
        getattr(kv_manager, "bootstrap_host", None),
        getattr(kv_manager, "bootstrap_port", None),
        getattr(kv_manager, "local_ip", None),
    )
    if found is None:
        return None
    host = found[0]
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    try:
        return validate_address(f"{host}:{found[1]}")
    except InvalidArgumentError:
        return None


def _host_port(host: object, port: object, local_ip: object) -> Optional[tuple[str, int]]:
    """(host, port) of a server, a host bound to every interface named by the node's IP; None when unknown."""
    try:
        number = int(port)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return None
    text = str(host or "")
    if text in ("", "0.0.0.0", "::", "[::]"):
        text = str(local_ip or "")
    if not text or not 0 < number < 65536:
        return None
    return text, number


def server_tag(kv_manager: Any) -> Optional[str]:
    """What tells this manager's server apart from every other server of its role: a prefill's bootstrap address,
    a decode's HTTP address (``server_args.host:port``), as a name part (``10.0.0.7-8998``; an IPv6 address's colons
    become dots). None when the manager carries neither (not an sglang manager: its name then has no such part)."""
    mode = mode_of(kv_manager)
    if mode == "prefill":
        found = _host_port(
            getattr(kv_manager, "bootstrap_host", None),
            getattr(kv_manager, "bootstrap_port", None),
            getattr(kv_manager, "local_ip", None),
        )
    elif mode == "decode":
        args = getattr(kv_manager, "server_args", None)
        found = _host_port(
            getattr(args, "host", None), getattr(args, "port", None), getattr(kv_manager, "local_ip", None)
        )
    else:
        found = None
    if found is None:
        return None
    host = re.sub(r"[^A-Za-z0-9_.-]", ".", found[0].strip("[]"))
    return f"{host}-{found[1]}"


def awaited_address(kv_manager: Any, room: int) -> Optional[str]:
    """The prefill address a decode manager's ``room`` waits on: upstream's receiver files the room under its
    ``bootstrap_addr`` in ``addr_to_rooms_tracker`` before it opens the room; None when it is in none."""
    tracker = getattr(kv_manager, "addr_to_rooms_tracker", None)
    if not tracker:
        return None
    for address, rooms in list(tracker.items()):  # one C call: the heartbeat thread may drop an address meanwhile
        if room in rooms:
            return str(address)
    return None


def await_address(kv_manager: Any, store: Any, room: int) -> None:
    """A decode manager opened ``room``: tell its store the prefill address the room waits on, if any."""
    address = awaited_address(kv_manager, room)
    if address is None:
        return
    try:
        store.awaits(room, address)
    except InvalidArgumentError as exc:  # an address kvstatus cannot match (upstream's heartbeat still watches it)
        log.debug(
            "participant %s: room %d waits on %r, which no lease can carry: %s", store.participant, room, address, exc
        )
