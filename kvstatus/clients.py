"""What kind of redis-py client a store or the near cache was given (sync or async)."""

from __future__ import annotations

from typing import Any

from redis.cluster import RedisCluster


def is_cluster_client(client: Any) -> bool:
    """True for redis-py cluster clients (sync or async), whose batches are split by slot."""
    from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

    return isinstance(client, (RedisCluster, AsyncRedisCluster))


def is_sentinel_client(client: Any) -> bool:
    """True for a redis-py client made by ``Sentinel.master_for`` (sync or async)."""
    from redis.asyncio.sentinel import SentinelConnectionPool as AsyncSentinelPool
    from redis.sentinel import SentinelConnectionPool

    return isinstance(getattr(client, "connection_pool", None), (SentinelConnectionPool, AsyncSentinelPool))
