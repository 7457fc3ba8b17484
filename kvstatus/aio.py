"""AsyncStatusStore: the same store on ``redis.asyncio``; every method is awaitable.

Written in :mod:`kvstatus._async.store`; this module keeps its import path.
"""

from kvstatus._async.store import AsyncStatusStore

__all__ = ["AsyncStatusStore"]
