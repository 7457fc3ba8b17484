"""What a participant's name says: its role and its instance (the SGLang plugin's naming, pure Python).

The SGLang plugin names each KV manager ``<role>[-<instance>][-dp<d>][-adp<a>][-cp<c>]-tp<t>-pp<p>``
(:func:`kvstatus.sglang.manager.participant_name`), ``role`` being ``prefill`` or ``decode``. Fleet views
(stage histograms, stuck rooms, pair health) group by role or by instance, never by rank or room, so their
cardinality stays that of the deployment's servers. A name that does not follow the naming has role
``other`` and is its own instance.
"""

from __future__ import annotations

import re
from typing import NamedTuple

ROLES: tuple[str, ...] = ("prefill", "decode")
OTHER = "other"
_RANK = re.compile(r"(dp|adp|cp|tp|pp)[0-9]+")


class Naming(NamedTuple):
    """``role`` (prefill, decode or other) and ``instance``: the name without its rank parts, e.g.
    ``prefill-a`` for ``prefill-a-tp3-pp0``, ``decode`` for ``decode-tp0-pp0`` (a deployment of one server per role)."""

    role: str
    instance: str


def naming(participant: str) -> Naming:
    """The role and instance of ``participant`` (see the module's docstring)."""
    parts = participant.split("-")
    if parts[0] not in ROLES:
        return Naming(OTHER, participant)
    while len(parts) > 1 and _RANK.fullmatch(parts[-1]):
        parts.pop()
    return Naming(parts[0], "-".join(parts))


def role_of(participant: str) -> str:
    """``prefill``, ``decode`` or ``other``."""
    return naming(participant).role


def is_decode(participant: str) -> bool:
    """True when ``participant`` is a decode by the naming (a room's other fields, ``reason:...``, never are)."""
    return naming(participant).role == "decode"
