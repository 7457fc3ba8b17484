"""StatusStore: the room-status store on a blocking redis-py client.

Generated from :mod:`kvstatus._async.store` (tools/unasync.py); this module keeps its import path.
"""

from kvstatus._sync.store import StatusStore

__all__ = ["StatusStore"]
