"""The prefill's bootstrap address: its lease carries it, and a decode's rooms wait on it.

A request sent to a prefill that is already dead opens a room on the decode only: no participant with an
entry there lost its lease, so shared fate alone never fails it. The decode knows the address it waits on
(upstream's receiver files each room under its ``bootstrap_addr``), and the prefill's lease carries the same
address (:func:`bootstrap_address`), so the decode's peer watch (:mod:`kvstatus.peerwatch`) fails such a room
within the prefill's lease TTL plus a second of its death or restart, naming it. Addresses match exactly.
"""

from __future__ import annotations

from typing import Any, Optional

from kvstatus.errors import InvalidArgumentError
from kvstatus.keys import validate_address
from kvstatus.sglang.startup import log


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
    port = getattr(kv_manager, "bootstrap_port", None)
    if mode_of(kv_manager) != "prefill" or not port:
        return None
    host = str(getattr(kv_manager, "bootstrap_host", None) or "")
    if host in ("", "0.0.0.0", "::", "[::]"):
        host = str(getattr(kv_manager, "local_ip", None) or "")
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    try:
        return validate_address(f"{host}:{port}")
    except InvalidArgumentError:
        return None


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
