"""The exceptions kvstatus raises. Catch :class:`KVStatusError` for all of them.

Messages name what was wrong and never contain a password.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Optional

import redis

if TYPE_CHECKING:  # kvstatus.model imports this module
    from kvstatus.model import UpdateResult


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

    It means "unknown whether applied": the last attempt may have run in Redis
    (a hung server executes it when it wakes up). Calling again is safe because
    the update rule is idempotent: the same update applied twice leaves the
    same state.
    """


class BackendRefusedError(BackendUnavailableError):
    """A standalone Redis refused the connection (nothing listens there); raised at once, without retries.

    ``not_sent`` True: no attempt of this call reached Redis, so it was not
    applied. False: an earlier attempt was sent before the server went away, so
    it is "unknown whether applied" like its base class.
    """

    def __init__(self, message: str, *, not_sent: bool = False) -> None:
        super().__init__(message)
        self.not_sent = not_sent


class PoolExhaustedError(BackendError):
    """Every connection of the client's pool stayed busy until the call's deadline; nothing was sent.

    The message says "client connection pool exhausted (max_connections=N)": raise
    ``max_connections`` or make fewer concurrent calls. Redis itself may be fine.
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

    Raised by every write of that store from then on: a sweeper may already have
    failed its entries. ``participant`` names whose lease it was.
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
