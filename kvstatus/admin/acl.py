"""The Redis ACL rules kvstatus needs: one user per namespace, a read-only variant and a router variant.

The command lists below are the single source of the README's ACL recipe (a
test holds the two together). ACL checks the commands a Lua script or function
calls as well as the command that runs it, so those commands are listed too.

Two recipes, by how the store runs its Lua (``scripts=``):

- ``functions`` (the tenant recipe, Redis >= 7): an admin loads kvstatus'
  function library once (``kvstatus functions load``); tenants may only
  ``FCALL`` / ``FCALL_RO`` it. No ``EVAL``, ``EVALSHA`` or ``SCRIPT LOAD``:
  a tenant cannot run Lua of its own. The read-write (worker) user has no
  ``SCAN`` either: SCAN cannot be limited to a key pattern, so it would list
  every namespace's room ids; only the read-only (dashboard, ``ls``) user has it.
- ``eval`` (Redis 6, or one tenant per server): ``EVALSHA`` plus ``SCRIPT
  LOAD`` and ``EVAL`` to heal NOSCRIPT by itself. A user that may load a
  script can run any Lua, which can block the whole server: not an isolation
  boundary.

No recipe grants ``INFO`` (it shows every namespace's totals); ``doctor``
reads the server version from ``HELLO``.

- :data:`HANDSHAKE`  what redis-py sends on connect and for health checks
- :data:`CLUSTER_DISCOVERY`  what ``RedisCluster`` needs to learn the slot map
  (harmless on a standalone server); ``COMMAND`` also lets it find FCALL's keys
- :data:`FUNCTIONS` / :data:`FUNCTIONS_READ_ONLY` / :data:`EVAL_SCRIPTS`  how the Lua runs
- :data:`READS` / :data:`WRITES`  the commands the store and its scripts run on the namespace's keys:
  rooms, their tombstones (``{<room>}:t``) and the lease records (``lease:<participant>``), all under
  ``<prefix>:<namespace>:``; ``time`` is Redis' clock, which the lease, clear, consensus and failure-record
  scripts read; ``hgetall`` also lets ``clear`` tidy a room it left without entries (best effort)
- :data:`ROUTER_WRITES`  what ``cancel`` writes: the router user's only writes (no ``hdel``, ``hexists``,
  ``hincrby``, so the scripts' own pre-checks refuse it ``clear``, ``record_failure``, leaving
  Failed and acquiring a lease). ACL cannot limit ``FCALL`` to one function, nor ``HSET`` to Lua: see
  docs/security.md for what a router can still do inside its namespace
- :data:`SCAN`  what ``ls``, ``stats``, ``watch``, the exporter and the board walk the namespace with
- :data:`NEAR_CACHE`  the near cache's tracking and invalidation connections, which ``wait_for`` watches on
  too (no channel: invalidations arrive as RESP3 pushes). Left out by ``near_cache=False``: on the
  Redis versions kvstatus supports, ACL key patterns do not cover
  ``CLIENT TRACKING ... BCAST PREFIX``, so a user allowed ``client|tracking``
  receives the key names (room ids) written under any prefix, another
  namespace's included (upstream redis/redis#15371 filters them, 2026). A
  store of such a user runs without its near cache, and its ``wait_for`` polls.
- :data:`HEALTH`  what ``kvstatus health`` and the board read beyond the store: whether a tombstone's room is
  gone (``EXISTS``)

- :data:`PRESENCE`  a lease holder's presence (:class:`kvstatus._async.leases.AsyncPresence`): it subscribes to its own
  channel under ``<prefix>:<namespace>:presence:``, and counts its peers' with ``PUBSUB NUMSUB``; the worker
  recipe grants that channel pattern alone. No recipe grants ``PUBLISH`` or ``SPUBLISH``: a tenant can fill no
  subscriber's output buffer, its own namespace's included.
"""

from __future__ import annotations

from typing import Optional

from kvstatus.errors import InvalidArgumentError
from kvstatus.keys import DEFAULT_PREFIX, KeySchema, validate_script_mode

# CLIENT SETINFO (Redis >= 7.2) is left out on purpose: ACL SETUSER refuses it on older
# servers, and redis-py ignores a refused SETINFO during its handshake.
HANDSHAKE: tuple[str, ...] = ("ping", "client|setname", "select", "hello")
CLUSTER_DISCOVERY: tuple[str, ...] = ("cluster|slots", "cluster|shards", "cluster|nodes", "command", "asking")
FUNCTIONS: tuple[str, ...] = ("fcall", "fcall_ro")
FUNCTIONS_READ_ONLY: tuple[str, ...] = ("fcall_ro",)
EVAL_SCRIPTS: tuple[str, ...] = ("evalsha", "eval", "script|load")
READS: tuple[str, ...] = ("hget", "hmget", "hgetall", "pttl", "time")
WRITES: tuple[str, ...] = ("hexists", "hset", "hsetnx", "hdel", "hincrby", "pexpire")
ROUTER_WRITES: tuple[str, ...] = ("hset", "hsetnx", "pexpire")  # lua/cancel.lua (and its TIME, in READS)
SCAN: tuple[str, ...] = ("scan",)
# The invalidation connection is a RESP3 REDIRECT target (HELLO 3 is in HANDSHAKE): it subscribes to nothing, so
# nothing a tenant publishes reaches another's cache or wait.
NEAR_CACHE: tuple[str, ...] = ("client|tracking", "client|id", "role")  # ROLE: a Sentinel master's demotion
PRESENCE: tuple[str, ...] = ("subscribe", "ssubscribe", "pubsub|numsub", "pubsub|shardnumsub")
HEALTH: tuple[str, ...] = ("exists",)  # kvstatus health and the board: a tombstone read without its room
SENTINEL_COMMANDS: tuple[str, ...] = (
    "ping",
    "sentinel|get-master-addr-by-name",
    "sentinel|masters",
    "sentinel|sentinels",
    "sentinel|replicas",
)
"""What the client of a Sentinel URL asks the Sentinels (a user on the Sentinels, not the data nodes)."""


def _near_cache(near_cache: bool) -> tuple[str, ...]:
    return NEAR_CACHE if near_cache else ()


def read_only_commands(scripts: str = "functions", near_cache: bool = True) -> tuple[str, ...]:
    """Commands of a dashboard or CLI user that reads statuses (``get``, ``ls``, ``stats``, ``watch``), never writes."""
    lua = FUNCTIONS_READ_ONLY if validate_script_mode(scripts) == "functions" else EVAL_SCRIPTS
    return _unique(HANDSHAKE + CLUSTER_DISCOVERY + lua + READS + SCAN + _near_cache(near_cache) + HEALTH)


def read_write_commands(scripts: str = "functions", near_cache: bool = True) -> tuple[str, ...]:
    """Commands of a PD worker's user: every store operation (no SCAN under the functions recipe)."""
    if validate_script_mode(scripts) == "functions":
        lua: tuple[str, ...] = FUNCTIONS
    else:
        lua = EVAL_SCRIPTS + SCAN
    return _unique(HANDSHAKE + CLUSTER_DISCOVERY + lua + READS + WRITES + _near_cache(near_cache) + HEALTH + PRESENCE)


def router_commands(scripts: str = "functions", near_cache: bool = False) -> tuple[str, ...]:
    """Commands of a router's user: ``cancel``/``cancel_many`` and the reads (``get``, ``room``, ``failure``,
    ``get_many``); no SCAN, no ``wait_for``, and the near cache only when asked for."""
    lua = FUNCTIONS if validate_script_mode(scripts) == "functions" else EVAL_SCRIPTS
    return _unique(HANDSHAKE + CLUSTER_DISCOVERY + lua + READS + ROUTER_WRITES + _near_cache(near_cache))


def recipe_commands(
    *, read_only: bool = False, router: bool = False, scripts: str = "functions", near_cache: Optional[bool] = None
) -> tuple[str, ...]:
    """The commands of one recipe: a PD worker's (the default), ``read_only`` a dashboard's, ``router`` a router's.
    ``near_cache`` None: on for a worker and a dashboard, off for a router (it reads a room once or twice: no
    cache is worth learning other namespaces' room ids through CLIENT TRACKING)."""
    if read_only and router:
        raise InvalidArgumentError("choose one recipe: read_only (a dashboard) or router, not both")
    if router:
        return router_commands(scripts, bool(near_cache))
    cache = True if near_cache is None else near_cache
    return read_only_commands(scripts, cache) if read_only else read_write_commands(scripts, cache)


def _unique(commands: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(commands))


def acl_rules(
    namespace: str,
    *,
    prefix: str = DEFAULT_PREFIX,
    read_only: bool = False,
    router: bool = False,
    password: Optional[str] = None,
    scripts: str = "functions",
    near_cache: Optional[bool] = None,
) -> list[str]:
    """The ``ACL SETUSER <name>`` rules for a user limited to one namespace.

    ``scripts`` "functions" is the tenant recipe (its stores use
    ``scripts="functions"``; an admin runs ``kvstatus functions load``);
    "eval" the recipe for Redis 6 or a server of one tenant. ``password``
    None leaves the password out (add ``>secret`` yourself); keys are limited to ``<prefix>:<namespace>:*``, and
    channels to the worker's presence channels (``&<prefix>:<namespace>:presence:*``). ``near_cache`` False
    leaves out what only the near cache (and ``wait_for``'s watch on one) needs (``client|tracking``,
    ``client|id``, ``role``): no key names of other namespaces through tracking, no near cache, and a
    ``wait_for`` that polls every 50 ms; None (the default) means True, except for a ``router``. ``read_only``
    is the dashboard's recipe, ``router`` the router's (cancel and read rooms); neither is the worker's.
    """
    schema = KeySchema(namespace, prefix)
    commands = recipe_commands(read_only=read_only, router=router, scripts=scripts, near_cache=near_cache)
    rules = ["reset", "on"]
    if password is not None:
        rules.append(f">{password}")
    rules += [
        f"~{schema.base}*",
        "resetchannels",
        *([] if read_only or router else [f"&{schema.presence_pattern}"]),
        "-@all",
        *(f"+{command}" for command in commands),
    ]
    return rules


def sentinel_acl_rules(password: Optional[str] = None) -> list[str]:
    """``ACL SETUSER <name>`` rules for kvstatus's user on the Sentinels (``sentinel_username``)."""
    rules = ["reset", "on"] + ([f">{password}"] if password is not None else [])
    return rules + ["resetchannels", "-@all", *(f"+{command}" for command in SENTINEL_COMMANDS)]


def acl_setuser_line(
    user: str,
    namespace: str,
    *,
    prefix: str = DEFAULT_PREFIX,
    read_only: bool = False,
    router: bool = False,
    scripts: str = "functions",
    near_cache: Optional[bool] = None,
) -> str:
    """The recipe as one ``ACL SETUSER`` line, with ``>PASSWORD`` as a placeholder (for docs and users.acl)."""
    rules = acl_rules(
        namespace, prefix=prefix, read_only=read_only, router=router, scripts=scripts, near_cache=near_cache
    )
    rules.insert(2, ">PASSWORD")
    return f"ACL SETUSER {user} " + " ".join(rules)
