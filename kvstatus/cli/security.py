"""``acl``: print the ACL recipe of a namespace's Redis user (offline: no Redis)."""

from __future__ import annotations

from typing import Optional

import click

from kvstatus.admin.acl import acl_rules, acl_setuser_line
from kvstatus.cli.app import CliEnv, emit_json, json_option, main, pass_env


@main.command()
@click.option("--user", metavar="NAME", help="The ACL user name [default: kvstatus-NAMESPACE, or "
                                             "dashboard-NAMESPACE with --read-only].")
@click.option("--read-only", is_flag=True, help="The dashboard user: get, ls, stats, watch, doctor, the exporter and "
                                                "the board; no writes.")
@click.option("--scripts", type=click.Choice(["functions", "eval"]), default="functions", show_default=True,
              help="functions: the tenant recipe (FCALL of the library `kvstatus functions load` installs; URLs "
                   "carry ?scripts=functions); eval: Redis 6 or one tenant per server (may run any Lua).")
@click.option("--near-cache/--no-near-cache", default=True, show_default=True,
              help="--no-near-cache leaves out client|tracking, client|id, role and the __redis__:invalidate "
                   "channel: the user cannot learn other namespaces' room ids through CLIENT TRACKING, and its "
                   "stores run without near cache.")
@json_option
@pass_env
def acl(env: CliEnv, user: Optional[str], read_only: bool, scripts: str, near_cache: bool, as_json: bool) -> None:
    """Print the ACL SETUSER line of a user confined to the namespace (>PASSWORD is a placeholder to replace).

    Run it with an admin user on every node (or put it in an aclfile). With
    the near cache (the default), the user may run CLIENT TRACKING: on the
    Redis versions kvstatus supports, ACL key patterns do not cover tracking
    prefixes, so it can receive the key names (room ids) another namespace
    writes, though never their values. Where tenants must not see each other's
    room ids, give them --no-near-cache (or one Redis per tenant, the only hard
    isolation); `kvstatus doctor` warns about a user that may track.
    """
    schema = env.schema()
    name = user or f"{'dashboard' if read_only else 'kvstatus'}-{schema.namespace}"
    line = acl_setuser_line(name, schema.namespace, prefix=schema.prefix, read_only=read_only, scripts=scripts,
                            near_cache=near_cache)
    if as_json:
        emit_json({"user": name, "namespace": schema.namespace, "scripts": scripts, "near_cache": near_cache,
                   "rules": acl_rules(schema.namespace, prefix=schema.prefix, read_only=read_only, scripts=scripts,
                                      near_cache=near_cache)})
        return
    click.echo(line)
    if near_cache:
        click.echo("kvstatus: this user may run CLIENT TRACKING and so receive the room ids other namespaces write "
                   "(not their values); --no-near-cache takes that away", err=True)
    else:
        click.echo("kvstatus: no near cache for this user: its stores must use near_cache=False (the default)",
                   err=True)
