"""Test infrastructure: real ``redis-server`` topologies on free loopback ports (not shipped in the wheel).

The standalone server is the product's own (``kvstatus.demo.server``, the demo's
embedded Redis); the cluster, Sentinel and TLS launchers live here, and the
ports of all of them come from :mod:`tests.servers.ports` (a range per xdist worker).
"""

from kvstatus.demo.server import (
    RedisServer,
    RedisServerError,
    RedisServerNotFound,
    find_redis_server,
)
from tests.servers.cluster import RedisClusterServers
from tests.servers.ports import free_port
from tests.servers.sentinel import RedisSentinelServers
from tests.servers.tls import TLSFiles, make_tls_files

__all__ = [
    "RedisClusterServers",
    "RedisSentinelServers",
    "RedisServer",
    "RedisServerError",
    "RedisServerNotFound",
    "TLSFiles",
    "find_redis_server",
    "free_port",
    "make_tls_files",
]
