"""Loading kvstatus' Redis 7 function library (``kvstatus functions load``): an admin's step of the tenant recipe.

Stores with ``scripts="functions"`` run :data:`kvstatus.scripts.LIBRARY` by
FCALL and never load it themselves (their users may not). Functions are part
of the dataset: replicas receive them, and RDB/AOF persistence and failovers
keep them, unlike the script cache. A new or emptied node (a cluster node
added, a restart without persistence, ``FUNCTION FLUSH``) needs the load again.
"""

from __future__ import annotations

from typing import Any

from kvstatus import scripts
from kvstatus.admin.scan import round_trip, scan_clients


def _where(node: Any) -> str:
    kwargs = node.connection_pool.connection_kwargs
    return str(kwargs.get("path") or f"{kwargs.get('host')}:{kwargs.get('port')}")


def load_functions(client: Any) -> list[str]:
    """``FUNCTION LOAD REPLACE`` this version's library on the server (every primary of a cluster).

    Returns the nodes (host:port) it was loaded on. Idempotent: the library's
    name carries its version, so REPLACE only ever replaces the same text.
    """
    nodes = scan_clients(client)
    for node in nodes:
        with round_trip(client):  # a hung node fails the load at the admin deadline (kvstatus.admin.scan)
            node.function_load(scripts.LIBRARY, replace=True)
    return [_where(node) for node in nodes]


def loaded_libraries(client: Any) -> dict[str, list[str]]:
    """The kvstatus libraries on each node (host:port -> names, sorted), this version's among them or not."""
    found: dict[str, list[str]] = {}
    for node in scan_clients(client):
        names = []
        with round_trip(client):
            libraries = node.function_list(library="kvstatus_*")
        for library in libraries:
            if isinstance(library, dict):
                name = library.get(b"library_name", library.get("library_name"))
            else:  # RESP2: a flat list of names and values
                name = dict(zip(library[::2], library[1::2])).get(b"library_name")
            names.append(name.decode() if isinstance(name, bytes) else str(name))
        found[_where(node)] = sorted(names)
    return found
