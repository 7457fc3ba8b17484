"""The Redis ACL rules kvstatus needs: one user per namespace, and a read-only variant.

The command lists below are the single source of the README's ACL recipe (a
test holds the two together). ACL checks the commands a Lua script calls as
well as the EVALSHA that runs it, so the scripts' own commands are listed.

- :data:`HANDSHAKE`  what redis-py sends on connect and for health checks
- :data:`CLUSTER_DISCOVERY`  what ``RedisCluster`` needs to learn the slot map
  (harmless on a standalone server)
- :data:`SCRIPTS`  EVALSHA, and SCRIPT LOAD for healing NOSCRIPT
- :data:`READS` / :data:`WRITES`  the commands the store, the scripts and the
  CLI (``ls``, ``stats``, ``watch``, ``doctor``, ``participants``, ``sweep``) run
  on the namespace's keys: rooms, their tombstones (``{<room>}:t``) and the
  lease records (``lease:<participant>``), all under ``<prefix>:<namespace>:``.
  ``time`` is Redis' clock, which the lease, clear and consensus scripts read
"""

from __future__ import annotations

from typing import Optional

from kvstatus.keys import DEFAULT_PREFIX, KeySchema

# CLIENT SETINFO (Redis >= 7.2) is left out on purpose: ACL SETUSER refuses it on older
# servers, and redis-py ignores a refused SETINFO during its handshake.
HANDSHAKE: tuple[str, ...] = ("ping", "client|setname", "select", "hello")
CLUSTER_DISCOVERY: tuple[str, ...] = ("cluster|slots", "cluster|shards", "cluster|nodes", "command", "asking")
SCRIPTS: tuple[str, ...] = ("evalsha", "script|load")
READS: tuple[str, ...] = ("hget", "hmget", "hgetall", "hexists", "pttl", "time", "scan", "info")
WRITES: tuple[str, ...] = ("hset", "hsetnx", "hdel", "hincrby", "pexpire")
SENTINEL_COMMANDS: tuple[str, ...] = (
    "ping", "sentinel|get-master-addr-by-name", "sentinel|masters", "sentinel|sentinels", "sentinel|replicas",
)
"""What the client of a Sentinel URL asks the Sentinels (a user on the Sentinels, not the data nodes)."""


def read_only_commands() -> tuple[str, ...]:
    """Commands of a dashboard or CLI user that reads statuses and never writes."""
    return HANDSHAKE + CLUSTER_DISCOVERY + SCRIPTS + READS


def read_write_commands() -> tuple[str, ...]:
    """Commands of a PD worker's user: everything the store and the CLI do."""
    return read_only_commands() + WRITES


def acl_rules(namespace: str, *, prefix: str = DEFAULT_PREFIX, read_only: bool = False,
              password: Optional[str] = None) -> list[str]:
    """The ``ACL SETUSER <name>`` rules for a user limited to one namespace.

    ``password`` None leaves the password out (add ``>secret`` yourself); keys
    are limited to ``<prefix>:<namespace>:*`` and no Pub/Sub channel is allowed.
    """
    schema = KeySchema(namespace, prefix)
    commands = read_only_commands() if read_only else read_write_commands()
    rules = ["reset", "on"]
    if password is not None:
        rules.append(f">{password}")
    rules += [f"~{schema.base}*", "resetchannels", "-@all", *(f"+{command}" for command in commands)]
    return rules


def sentinel_acl_rules(password: Optional[str] = None) -> list[str]:
    """``ACL SETUSER <name>`` rules for kvstatus's user on the Sentinels (``sentinel_username``)."""
    rules = ["reset", "on"] + ([f">{password}"] if password is not None else [])
    return rules + ["resetchannels", "-@all", *(f"+{command}" for command in SENTINEL_COMMANDS)]


def acl_setuser_line(user: str, namespace: str, *, prefix: str = DEFAULT_PREFIX, read_only: bool = False) -> str:
    """The recipe as one ``ACL SETUSER`` line, with ``>PASSWORD`` as a placeholder (for docs and users.acl)."""
    rules = acl_rules(namespace, prefix=prefix, read_only=read_only)
    rules.insert(2, ">PASSWORD")
    return f"ACL SETUSER {user} " + " ".join(rules)
