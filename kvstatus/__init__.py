"""kvstatus: a Redis-backed status store for the rooms of a prefill/decode disaggregated LLM serving cluster."""

from kvstatus.aio import AsyncStatusStore
from kvstatus.connection import ConnectionOptions
from kvstatus.errors import (
    AuthenticationError,
    BackendBusyError,
    BackendError,
    BackendUnavailableError,
    CorruptedValueError,
    InvalidArgumentError,
    InvalidNameError,
    InvalidRoomError,
    InvalidStatusError,
    InvalidURLError,
    KVStatusError,
    PermissionDeniedError,
    PoolExhaustedError,
)
from kvstatus.rule import (
    KVPoll,
    Outcome,
    ParticipantEntry,
    Policy,
    RoomView,
    UpdateResult,
    apply_rule,
)
from kvstatus.store import StatusStore

__version__ = "0.1.0"

__all__ = [
    "AsyncStatusStore",
    "AuthenticationError",
    "BackendBusyError",
    "BackendError",
    "BackendUnavailableError",
    "ConnectionOptions",
    "CorruptedValueError",
    "InvalidArgumentError",
    "InvalidNameError",
    "InvalidRoomError",
    "InvalidStatusError",
    "InvalidURLError",
    "KVPoll",
    "KVStatusError",
    "Outcome",
    "PermissionDeniedError",
    "PoolExhaustedError",
    "ParticipantEntry",
    "Policy",
    "RoomView",
    "StatusStore",
    "UpdateResult",
    "apply_rule",
]
