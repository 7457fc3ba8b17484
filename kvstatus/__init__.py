"""kvstatus: a Redis-backed status store for the rooms of a prefill/decode disaggregated LLM serving cluster."""

from kvstatus._async.store import AsyncStatusStore
from kvstatus._sync.store import StatusStore
from kvstatus.backend import Backend
from kvstatus.cachestate import NearCacheOptions
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
from kvstatus.model import (
    ClearedEntry,
    KVPoll,
    LeaseState,
    Outcome,
    ParticipantEntry,
    Policy,
    RoomConsensus,
    RoomView,
    StoreObserver,
    Tombstone,
    UpdateResult,
)
from kvstatus.rule import apply_rule
from kvstatus.url import ConnectionOptions

__version__ = "0.1.0"

__all__ = [
    "NearCacheOptions",
    "StoreObserver",
    "AsyncStatusStore",
    "Backend",
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
