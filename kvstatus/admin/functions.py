"""Loading kvstatus' Redis 7 function library (``kvstatus functions load``): an admin's step of the tenant recipe.

Stores with ``scripts="functions"`` run :data:`kvstatus.scripts.LIBRARY` by
FCALL and never load it themselves (their users may not). Functions are part
of the dataset: replicas receive them, and RDB/AOF persistence and failovers
keep them, unlike the script cache. A new or emptied node (a cluster node
added, a restart without persistence, ``FUNCTION FLUSH``) needs the load again.
"""

from __future__ import annotations

from typing import Any, Optional

from kvstatus import scripts
from kvstatus.admin.reads import Link, NodeTransport, client_of, nodes_of, replies, send
from kvstatus.requests import Call


def _where(node: Any) -> str:
    kwargs = node.connection_pool.connection_kwargs
    return str(kwargs.get("path") or f"{kwargs.get('host')}:{kwargs.get('port')}")


def _nodes(link: Link) -> list[tuple[Optional[NodeTransport], str]]:
    """Each primary of a cluster (else the server) as where to send, and its host:port."""
    return [(node, _where(client_of(link) if node is None else node.node)) for node in nodes_of(link)]


def load_functions(client: Link) -> list[str]:
    """``FUNCTION LOAD REPLACE`` this version's library on the server (every primary of a cluster), through the
    send path (:mod:`kvstatus.admin.reads`: a hung node fails the load at the deadline).

    Returns the nodes (host:port) it was loaded on. Idempotent: the library's
    name carries its version, so REPLACE only ever replaces the same text.
    """
    nodes = _nodes(client)
    for node, _ in nodes:
        send(client, replies([Call(("FUNCTION LOAD", "REPLACE", scripts.LIBRARY))]), node)
    return [where for _, where in nodes]


def loaded_libraries(client: Link) -> dict[str, list[str]]:
    """The kvstatus libraries on each node (host:port -> names, sorted), this version's among them or not."""
    found: dict[str, list[str]] = {}
    for node, where in _nodes(client):
        names = []
        (libraries,) = send(client, replies([Call(("FUNCTION LIST", "LIBRARYNAME", "kvstatus_*"))]), node)
        for library in libraries:
            if isinstance(library, dict):
                name = library.get(b"library_name", library.get("library_name"))
            else:  # RESP2: a flat list of names and values
                name = dict(zip(library[::2], library[1::2])).get(b"library_name")
            names.append(name.decode() if isinstance(name, bytes) else str(name))
        found[where] = sorted(names)
    return found
