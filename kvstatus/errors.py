"""The exceptions kvstatus raises. Catch :class:`KVStatusError` for all of them.

Messages name what was wrong and never contain a password: every message about a URL goes through :func:`mask_url`.
"""

from __future__ import annotations

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
    """Redis could not be reached (refused, timed out, or down) within the call's retries and deadline.

    It means "unknown whether applied": the last attempt may have run in Redis (a hung server executes it when it
    wakes up). Calling again is safe: the update rule is idempotent (docs/guide.md ("Unknown whether applied")).
    """


class BackendRefusedError(BackendUnavailableError):
    """A standalone Redis refused the connection (nothing listens there); raised at once, without retries.

    ``not_sent`` True: no attempt of this call reached Redis, so it was not applied. False: an earlier attempt was
    sent before the server went away, so it is "unknown whether applied" like its base class.
    """

    def __init__(self, message: str, *, not_sent: bool = False) -> None:
        super().__init__(message)
        self.not_sent = not_sent


class PoolExhaustedError(BackendError):
    """Every connection of the client's pool stayed busy until the call's deadline; nothing was sent.

    The message says "client connection pool exhausted (max_connections=N)": raise ``max_connections`` or make
    fewer concurrent calls. Redis itself may be fine.
    """


class BackendBusyError(BackendError):
    """Redis answered BUSY: a script (another client's, or a runaway one) holds the server past
    ``busy-reply-threshold``. This call was not run and is not resent; Redis is up, not down."""


class AuthenticationError(BackendError):
    """Redis refused the credentials."""


class PermissionDeniedError(BackendError):
    """The Redis user may not run a command or touch a key kvstatus needs (ACL NOPERM)."""


class LeaseLostError(KVStatusError):
    """The store's participant lease is lost (expired, released, or taken over by a new incarnation).

    Raised by every write of that store from then on: a sweeper may already have failed its entries.
    ``participant`` names whose lease it was.
    """

    def __init__(self, message: str, *, participant: str = "") -> None:
        super().__init__(message)
        self.participant = participant


class SupersededError(LeaseLostError):
    """A write found its entry stamped by a later incarnation of the same participant: the name was taken over
    by a new process (a restart under the same name), and this store's writes are refused from now on.

    The refused rooms were not written; ``results`` holds every room's result of the update or batch (the
    other rooms of a batch were written), None for a ``clear`` or ``pop``.
    """

    def __init__(
        self, message: str, *, participant: str = "", results: Optional[Mapping[int, UpdateResult]] = None
    ) -> None:
        super().__init__(message, participant=participant)
        self.results = results


class ClientPoolExhausted(redis.exceptions.RedisError):
    """No pooled connection came free before the call's deadline; nothing was sent (raised by
    :mod:`kvstatus.deadline`'s pools inside redis-py, and made :class:`PoolExhaustedError` by the translation).

    Not a ConnectionError, so that nothing resends it: Redis is fine, the client ran out of connections.
    """

    def __init__(self, max_connections: object, waited: float) -> None:
        super().__init__(
            f"client connection pool exhausted (max_connections={max_connections}): no connection "
            f"came free within {waited:.3g} s; nothing was sent. Raise max_connections (a "
            "ConnectionOptions field and URL option) or the deadline, or make fewer concurrent calls"
        )


MASK = "***"
_QUERY_SEPARATORS = "?&;"


def _userinfo_span(text: str, start: int) -> tuple[int, int] | None:
    """The span to mask in the user info of the URL whose authority starts at ``start``, or None."""
    at = text.rfind("@", start)
    if at < 0:
        return None
    colon = text.find(":", start, at)
    return (colon + 1 if colon >= 0 else start), at


def _query_password_span(text: str, start: int) -> tuple[int, int] | None:
    """From the value of the first ``*password=`` query option after ``start`` to the end of the text, or None."""
    for i in range(start, len(text)):
        if text[i] not in _QUERY_SEPARATORS:
            continue
        equals = text.find("=", i + 1)
        if equals < 0:
            return None
        name = text[i + 1 : equals]
        if any(sep in name for sep in _QUERY_SEPARATORS):
            continue  # no "=" before the next option: this one has no value
        if unquote_plus(name).strip().lower().endswith("password"):
            return equals + 1, len(text)
    return None


def mask_url(text: str) -> str:
    """``text`` (a URL, or a message holding URLs) with every password replaced by ``***``; safe to print.

    It parses, as a password pasted unencoded may hold any character. For each ``scheme://``: the user info runs to
    the text's *last* ``@``, and all of it after the user name's first ``:`` is masked (all of it without a ``:``);
    from the first query option whose percent-decoded name ends in ``password``, the rest of the text is masked.
    Masking too much is the safe direction: a part of a URL may be lost, never a part of the password shown.
    """
    text = str(text)
    spans: list[tuple[int, int]] = []
    start = text.find("://")
    while start >= 0:
        authority = start + 3
        for span in (_userinfo_span(text, authority), _query_password_span(text, authority)):
            if span is not None and span[0] < span[1]:
                spans.append(span)
        start = text.find("://", authority)
    if not spans:
        return text
    spans.sort()
    merged: list[list[int]] = []
    for low, high in spans:
        if merged and low <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], high)
        else:
            merged.append([low, high])
    pieces, last = [], 0
    for low, high in merged:
        pieces += [text[last:low], MASK]
        last = high
    pieces.append(text[last:])
    return "".join(pieces)
