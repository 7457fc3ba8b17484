"""Participant leases (see :mod:`kvstatus.leasestate` for what a lease is and how it is kept).

This module keeps the import path of everything lease-related: the logic (:class:`LeaseCore`) and the
keepers, written once in :mod:`kvstatus._async.leases` (:class:`AsyncLeaseKeeper`, an asyncio task)
and generated for threads (:class:`LeaseKeeper`).
"""

from kvstatus._async.leases import AsyncLeaseKeeper
from kvstatus._sync.leases import LeaseKeeper
from kvstatus.leasestate import (
    HELD,
    LOST,
    MAX_LEASE_TTL,
    MIN_LEASE_TTL,
    RELEASED,
    RENEWALS_PER_TTL,
    STALE_SHARE,
    LeaseCore,
    validate_lease_ttl,
)

__all__ = [
    "HELD",
    "LOST",
    "MAX_LEASE_TTL",
    "MIN_LEASE_TTL",
    "RELEASED",
    "RENEWALS_PER_TTL",
    "STALE_SHARE",
    "AsyncLeaseKeeper",
    "LeaseCore",
    "LeaseKeeper",
    "validate_lease_ttl",
]
