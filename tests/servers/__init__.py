"""Test infrastructure: real ``redis-server`` topologies on free loopback ports (not shipped in the wheel).

The standalone server (:mod:`tests.servers.standalone`) builds on the demo's embedded one
(``kvstatus.demo.server``); the cluster, Sentinel and TLS launchers, the server family and its binaries
(:mod:`tests.servers.launch`) live here, and the ports of all of them come from :mod:`tests.servers.ports`
(a range per xdist worker).
"""

from kvstatus.demo.server import RedisServerError, RedisServerNotFound
from tests.servers.cluster import RedisClusterServers
from tests.servers.launch import find_redis_server
from tests.servers.ports import free_port
from tests.servers.sentinel import RedisSentinelServers
from tests.servers.standalone import RedisServer
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
