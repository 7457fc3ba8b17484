"""kvstatus: a Redis-backed status store for the rooms of a prefill/decode disaggregated LLM serving cluster."""

from kvstatus.aio import AsyncStatusStore
from kvstatus.cachestate import NearCacheOptions
from kvstatus.consensus import LeaseState, RoomConsensus
from kvstatus.errors import (
    AuthenticationError,
    BackendBusyError,
    BackendError,
    BackendRefusedError,
    BackendUnavailableError,
    CorruptedValueError,
    InvalidArgumentError,
    InvalidNameError,
    InvalidRoomError,
    InvalidStatusError,
    InvalidURLError,
    KVStatusError,
    LeaseLostError,
    PermissionDeniedError,
    PoolExhaustedError,
    SupersededError,
)
from kvstatus.observer import StoreObserver
from kvstatus.rule import (
    ClearedEntry,
    KVPoll,
    Outcome,
    ParticipantEntry,
    Policy,
    RoomView,
    Tombstone,
    UpdateResult,
    apply_rule,
)
from kvstatus.store import StatusStore
from kvstatus.url import ConnectionOptions

__version__ = "0.1.0"

__all__ = [
    "NearCacheOptions",
    "StoreObserver",
    "AsyncStatusStore",
    "AuthenticationError",
    "BackendBusyError",
    "BackendError",
    "BackendRefusedError",
    "BackendUnavailableError",
    "ClearedEntry",
    "ConnectionOptions",
    "CorruptedValueError",
    "InvalidArgumentError",
    "InvalidNameError",
    "InvalidRoomError",
    "InvalidStatusError",
    "InvalidURLError",
    "KVPoll",
    "KVStatusError",
    "LeaseLostError",
    "LeaseState",
    "Outcome",
    "PermissionDeniedError",
    "PoolExhaustedError",
    "ParticipantEntry",
    "Policy",
    "RoomConsensus",
    "RoomView",
    "StatusStore",
    "SupersededError",
    "Tombstone",
    "UpdateResult",
    "apply_rule",
]
