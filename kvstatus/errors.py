"""The exceptions kvstatus raises (catch :class:`KVStatusError` for all); a message about a URL goes through
:func:`mask_url`, so none contains a password."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Optional
from urllib.parse import unquote_plus

import redis

if TYPE_CHECKING:  # kvstatus.model imports this module
    from kvstatus.model import UpdateResult


EARLIER = "kvstatus_earlier"
"""Set by the resends on a timeout that ends a call: what an earlier attempt's error said (``Redis is loading``)."""


class KVStatusError(Exception):
    """Base class of every kvstatus error."""


class InvalidArgumentError(KVStatusError, ValueError):
    """An argument was rejected before Redis was touched."""


class InvalidRoomError(InvalidArgumentError):
    """A room id is not an int in [0, 2**63 - 1] (bool is rejected)."""


class InvalidStatusError(InvalidArgumentError):
    """A status is not a KVPoll member or an int 0..4."""


class InvalidNameError(InvalidArgumentError):
    """A prefix, namespace or participant does not match ``^[A-Za-z0-9_.-]+$``."""


class InvalidURLError(InvalidArgumentError):
    """A Redis URL is malformed or uses an unsupported scheme."""


class CorruptedValueError(KVStatusError):
    """A value found in Redis is not one kvstatus writes; it was left as it is."""


class BackendError(KVStatusError):
    """Redis could not serve the request."""


class BackendUnavailableError(BackendError, ConnectionError):
    """Redis could not be reached within the call's retries and deadline: "unknown whether applied"; calling again
    is safe (docs/guide.md ("Unknown whether applied"))."""


class BackendRefusedError(BackendUnavailableError):
    """A standalone Redis refused the connection; raised at once, without retries. ``not_sent`` True: no attempt
    reached Redis, so it was not applied; False: "unknown whether applied" like its base class."""

    def __init__(self, message: str, *, not_sent: bool = False) -> None:
        super().__init__(message)
        self.not_sent = not_sent


class PoolExhaustedError(BackendError):
    """Every connection of the client's pool stayed busy until the call's deadline; nothing was sent (raise
    ``max_connections`` or make fewer concurrent calls)."""


class BackendBusyError(BackendError):
    """Redis answered BUSY (a script holds it past ``busy-reply-threshold``): the call was not run nor resent."""


class AuthenticationError(BackendError):
    """Redis refused the credentials."""


class PermissionDeniedError(BackendError):
    """The Redis user may not run a command or touch a key kvstatus needs (ACL NOPERM)."""


class LeaseLostError(KVStatusError):
    """The store's ``participant`` lost its lease (expired, released, or taken over by a new incarnation): raised
    by every write of that store from then on (a sweeper may already have failed its entries)."""

    def __init__(self, message: str, *, participant: str = "") -> None:
        super().__init__(message)
        self.participant = participant


class SupersededError(LeaseLostError):
    """A write found its entry stamped by a later incarnation of the same participant (a restart under its name);
    this store's writes are refused from now on. ``results``: every room's result of the update or batch (refused
    rooms were not written, the others were), None for a ``clear`` or ``pop``."""

    def __init__(
        self, message: str, *, participant: str = "", results: Optional[Mapping[int, UpdateResult]] = None
    ) -> None:
        super().__init__(message, participant=participant)
        self.results = results


class ClientPoolExhausted(redis.exceptions.RedisError):
    """No pooled connection came free before the deadline (:mod:`kvstatus.deadline`'s pools, inside redis-py):
    translated to :class:`PoolExhaustedError`. Not a ConnectionError, so that nothing resends it."""

    def __init__(self, max_connections: object, waited: float) -> None:
        super().__init__(
            f"client connection pool exhausted (max_connections={max_connections}): no connection "
            f"came free within {waited:.3g} s; nothing was sent. Raise max_connections (a "
            "ConnectionOptions field and URL option) or the deadline, or make fewer concurrent calls"
        )


MASK = "***"
_QUERY_SEPARATOR = re.compile("[?&;]")


def _userinfo_span(text: str, start: int) -> tuple[int, int] | None:
    """The span to mask in the user info of the URL whose authority starts at ``start``, or None."""
    at = text.rfind("@", start)
    if at < 0:
        return None
    colon = text.find(":", start, at)
    return (colon + 1 if colon >= 0 else start), at


def _query_password_span(text: str, start: int) -> tuple[int, int] | None:
    """From the value of the first ``*password=`` query option after ``start`` to the end of the text, or None."""
    for separator in _QUERY_SEPARATOR.finditer(text, start):
        equals = text.find("=", separator.end())
        if equals < 0:
            return None
        name = text[separator.end() : equals]
        if _QUERY_SEPARATOR.search(name):
            continue  # no "=" before the next option: this one has no value
        if unquote_plus(name).strip().lower().endswith("password"):
            return equals + 1, len(text)
    return None


def mask_url(text: str) -> str:
    """``text`` (a URL, or a message holding URLs) with every password replaced by ``***``; safe to print. For each
    ``scheme://`` it masks the user info up to the text's *last* ``@`` (from the user name's first ``:`` if any) and
    the rest of the text from the first query option whose percent-decoded name ends in ``password``: too much,
    never too little (a password pasted unencoded may hold any character)."""
    text = str(text)
    spans: list[tuple[int, int]] = []
    for scheme_end in re.finditer("://", text):
        authority = scheme_end.end()
        for span in (_userinfo_span(text, authority), _query_password_span(text, authority)):
            if span is not None and span[0] < span[1]:
                spans.append(span)
    pieces: list[str] = []
    last = 0
    for low, high in sorted(spans):
        if low > last or not pieces:  # else it overlaps or touches the last masked span
            pieces += [text[last:low], MASK]
        last = max(last, high)
    pieces.append(text[last:])
    return "".join(pieces)
