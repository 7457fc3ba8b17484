"""The prefill's bootstrap address: its lease carries it, and a decode's rooms wait on it.

A request sent to a prefill that is already dead opens a room on the decode only: no participant with an
entry there lost its lease, so shared fate alone never fails it. The decode knows the address it waits on
(upstream's receiver files each room under its ``bootstrap_addr``), and the prefill's lease carries the same
address (:func:`bootstrap_address`), so the decode's peer watch (:mod:`kvstatus.peerwatch`) fails such a room
within the prefill's lease TTL plus a second of its death or restart, naming it. Addresses match exactly.
"""

from __future__ import annotations

import logging
import re
from typing import Any, Optional

from kvstatus.errors import InvalidArgumentError
from kvstatus.keys import validate_address

log = logging.getLogger("kvstatus.sglang")


def mode_of(kv_manager: Any) -> str:
    """A manager's disaggregation mode: "prefill", "decode", or what it holds otherwise ("None": none)."""
    mode = getattr(kv_manager, "disaggregation_mode", None)
    return str(getattr(mode, "value", mode))


def bootstrap_address(kv_manager: Any) -> Optional[str]:
    """The ``host:port`` a decode names this prefill manager by (the ``bootstrap_addr`` of its receivers), or None
    (not a prefill, or no address). Its lease carries it, so a decode waiting on it in a room this prefill never
    wrote fails the room when this prefill dies or restarts (:mod:`kvstatus.peerwatch`). A server bound to every
    interface (``--host 0.0.0.0``) is named by its node's IP, as upstream's ``local_ip``; a decode that names
    it otherwise (a DNS name) matches nothing and is left to upstream's heartbeat."""
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
