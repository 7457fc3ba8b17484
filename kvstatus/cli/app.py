"""The ``kvstatus`` click group: shared options, the client seam, and the one place errors become exit codes.

Exit codes: 0 ok, 1 not found or operational error (unreachable, ACL denied,
corrupted value, a failed doctor check), 2 usage error (bad argument, option,
room, status, name, URL), 3 ``stats`` found keys without TTL or corrupted values,
4 ``stats`` found rooms stuck on participants whose lease is lost or that restarted (and no finding of 3),
5 ``health`` found an unhealthy prefill-decode pair, 6 ``set``'s write was refused by the update rule
(REFUSED_CREATE, REFUSED_TERMINAL, REFUSED_SUPERSEDED: nothing written), 7 ``cancel`` found a room already
fully served (every entry Success: left as it is).
"""

from __future__ import annotations

import importlib
import json
import re
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import click

from kvstatus import connection
from kvstatus.admin.reads import DEFAULT_BATCH
from kvstatus.admin.views import parse_room, parse_status
from kvstatus.backend import Backend
from kvstatus.cli.text import plural, safe, table  # noqa: F401  (re-exported: the commands' one escaping)
from kvstatus.errors import InvalidArgumentError, KVStatusError, mask_url
from kvstatus.keys import DEFAULT_PREFIX, DEFAULT_TTL_SECONDS, KeySchema, ttl_to_ms, validate_name
from kvstatus.model import KVPoll
from kvstatus.stuck import DEFAULT_OLDER_THAN_SECONDS
from kvstatus.translate import REDIS_ERRORS, translate_error
from kvstatus.url import DEFAULT_URL, ConnectionOptions, options_for, parse_url

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_FINDINGS, EXIT_STUCK = 0, 1, 2, 3, 4
EXIT_REFUSED = 6
"""``set``: the update rule refused the write (an outcome REFUSED_*): nothing was written."""
EXIT_SERVED = 7
"""``cancel``: a room was already fully served (every entry Success): nothing was failed or recorded."""
EXIT_CODES_HELP = (
    "Exit codes: 0 ok, 1 not found or operational error, 2 usage error, "
    "3 stats found keys without TTL or corrupted values, "
    "4 stats found rooms stuck on participants whose lease is lost or that restarted, "
    "5 health found an unhealthy prefill-decode pair, "
    "6 set was refused by the update rule, "
    "7 cancel found a room already fully served."
)


class NotFound(click.ClickException):
    """Something asked for does not exist (exit 1)."""

    exit_code = EXIT_FAILED


@dataclass
class CliEnv:
    """What every command shares. ``connect`` (URL -> redis-py client) is the seam tests inject a client through."""

    connect: Callable[[str], Any] = connection.connect
    url: Optional[str] = None
    namespace: Optional[str] = None
    prefix: str = DEFAULT_PREFIX
    scripts: str = "eval"
    """How the CLI's stores run their Lua (``--scripts``): "eval" (EVALSHA) or "functions" (FCALL)."""
    _backend: Optional[Backend] = field(default=None, repr=False)

    @property
    def url_or_default(self) -> str:
        return self.url or DEFAULT_URL

    @property
    def shown_url(self) -> str:
        return mask_url(self.url_or_default)

    def backend(self) -> Backend:
        """The Redis client of the URL with its connection options (the admin reads' round trips and the stores on
        it keep its ``?deadline=``); says on stderr which server it is when no URL was given (set one to silence it)."""
        if self._backend is None:
            if not self.url:
                click.echo(
                    f"kvstatus: no --url or KVSTATUS_URL given, using {DEFAULT_URL} (set KVSTATUS_URL to silence this)",
                    err=True,
                )
            self._backend = Backend(self.connect(self.url_or_default), self.options)
        return self._backend

    @property
    def options(self) -> ConnectionOptions:
        """The connection options of the URL (its ``?deadline=``, ``?retries=`` ...), for stores on its client."""
        return options_for(self.url_or_default)

    def schema(self) -> KeySchema:
        if not self.namespace:
            raise click.UsageError("no namespace: pass --namespace NAME or set KVSTATUS_NAMESPACE")
        return KeySchema(self.namespace, self.prefix)

    def close(self) -> None:
        if self._backend is not None:
            self._backend.close()
            close = getattr(self._backend.client, "close", None)
            if close is not None:
                close()


_NEGATIVE_NUMBER = re.compile(r"-\d+(\.\d*)?")


class KvstatusCommand(click.Command):
    """A command whose argument errors print its own usage, and which reads ``-5`` as a bad value, not an option."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.NoSuchOption as exc:
            if _NEGATIVE_NUMBER.fullmatch(exc.option_name):
                raise click.UsageError(
                    f"invalid value {exc.option_name!r}: negative numbers are no room, status "
                    "or option (rooms are 0..2**63-1, statuses 0..4)",
                    ctx,
                ) from None
            raise

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except InvalidArgumentError as exc:
            raise click.UsageError(safe(exc), ctx) from None


class KvstatusGroup(click.Group):
    """Turns kvstatus and Redis errors into a one-line message and an exit code, never a traceback."""

    command_class = KvstatusCommand

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except InvalidArgumentError as exc:
            raise click.UsageError(safe(exc), ctx) from None
        except (KVStatusError, *REDIS_ERRORS) as exc:
            error = translate_error(exc)
            raise click.ClickException(f"{safe(error)}{_hint(error)}") from None
        finally:
            env = ctx.find_object(CliEnv)
            if env is not None:
                env.close()


_CHECK_URL = "\nCheck --url / KVSTATUS_URL and that Redis is running; `kvstatus doctor` checks the setup."


def _hint(error: BaseException) -> str:
    """A second line with what to check, for a message that does not say it itself."""
    if "check the" in str(error):
        return ""
    name = type(error).__name__
    return {
        "BackendUnavailableError": _CHECK_URL,
        "BackendRefusedError": _CHECK_URL,
        "AuthenticationError": "\nCheck the user name and password in --url / KVSTATUS_URL.",
        "PermissionDeniedError": "\nThe Redis user lacks a permission kvstatus needs; `kvstatus doctor` lists which.",
        "CorruptedValueError": "\nSomething other than kvstatus wrote to this namespace; the value was left as it is.",
    }.get(name, "")


@click.group(cls=KvstatusGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--url",
    envvar="KVSTATUS_URL",
    metavar="URL",
    help=f"Redis URL (env KVSTATUS_URL; default {DEFAULT_URL}): redis://, rediss://, unix:// "
    "and every other form the library accepts. Passwords are masked in all output.",
)
@click.option(
    "--namespace",
    envvar="KVSTATUS_NAMESPACE",
    metavar="NAME",
    help="The PD deployment whose rooms to work on (env KVSTATUS_NAMESPACE), e.g. prod-a.",
)
@click.option(
    "--prefix",
    default=DEFAULT_PREFIX,
    show_default=True,
    metavar="PREFIX",
    help="First part of every key: <prefix>:<namespace>:{<room>}.",
)
@click.option(
    "--scripts",
    envvar="KVSTATUS_SCRIPTS",
    type=click.Choice(["eval", "functions"]),
    default="eval",
    show_default=True,
    help="How set, clear, cancel, get and doctor run kvstatus' Lua (env KVSTATUS_SCRIPTS): eval (EVALSHA) or "
    "functions (FCALL of the library `kvstatus functions load` put on the server, as the tenant ACL recipe needs).",
)
@click.version_option(package_name="kvstatus", message="kvstatus %(version)s")
@click.pass_context
def main(ctx: click.Context, url: Optional[str], namespace: Optional[str], prefix: str, scripts: str) -> None:
    """Inspect, change, watch and audit the room statuses kvstatus keeps in Redis.

    Exit codes: 0 ok, 1 not found or operational error, 2 usage error,
    3 stats found keys without TTL or corrupted values, 4 stats found rooms
    stuck on participants whose lease is lost or that restarted, 5 health found an unhealthy
    prefill-decode pair, 6 set was refused by the update rule (nothing
    written), 7 cancel found a room already fully served (left as it is).

    Without --url / KVSTATUS_URL it uses redis://localhost:6379/0 and says so
    on stderr. Shell completion: eval "$(_KVSTATUS_COMPLETE=bash_source kvstatus)"
    (zsh_source, fish_source for other shells).
    """
    env = ctx.ensure_object(CliEnv)
    env.url, env.namespace, env.prefix, env.scripts = url, namespace, prefix, scripts
    if url:
        parse_url(url)  # a malformed URL is a usage error before anything runs
    validate_name(prefix, "prefix")
    if namespace is not None:
        validate_name(namespace, "namespace")


pass_env = click.make_pass_decorator(CliEnv)

json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")


def batch_of(help: str) -> Callable[[Any], Any]:
    """``--batch N`` (1..10000, default :data:`~kvstatus.admin.reads.DEFAULT_BATCH`), said in the command's terms."""
    return click.option(
        "--batch", type=click.IntRange(min=1, max=10_000), default=DEFAULT_BATCH, show_default=True, help=help
    )


batch_option = batch_of("Keys per SCAN step and per pipelined read.")

participant_option = click.option(
    "--participant",
    "-p",
    metavar="NAME",
    help="The participant (writer) whose entry to use, e.g. prefill-0; default: the shared 'default' entry.",
)

participant_filter_option = click.option(
    "--participant",
    "-p",
    metavar="NAME",
    help="Only entries of this participant, e.g. prefill-0; default: every participant.",
)


class TTLType(click.ParamType):
    """A TTL in seconds, checked by the library's own rule (kvstatus.keys.ttl_to_ms)."""

    name = "SECONDS"

    def convert(self, value: Any, param: Optional[click.Parameter], ctx: Optional[click.Context]) -> float:
        try:
            seconds = float(value)
            ttl_to_ms(seconds)
        except ValueError as exc:
            self.fail(
                str(exc)
                if isinstance(exc, InvalidArgumentError)
                else f"invalid ttl {value!r}: expected a number of seconds",
                param,
                ctx,
            )
        return seconds


def ttl_option(help: str) -> Callable[[Any], Any]:
    """``--ttl SECONDS``, the same check for every command that takes one."""
    return click.option("--ttl", type=TTLType(), default=DEFAULT_TTL_SECONDS, show_default=True, help=help)


_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h)?", re.IGNORECASE)
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
MAX_DURATION_SECONDS = 30 * 86400


class DurationType(click.ParamType):
    """A span of time: seconds (``45``, ``2.5``) or a number with a unit (``500ms``, ``30s``, ``5m``, ``1h``),
    above 0 and at most 30 days. Converts to seconds (float)."""

    name = "DURATION"

    def convert(self, value: Any, param: Optional[click.Parameter], ctx: Optional[click.Context]) -> float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            seconds = float(value)
        else:
            match = _DURATION.fullmatch(str(value).strip())
            if match is None:
                self.fail(
                    f"invalid duration {value!r}: expected seconds, or a number with a unit: 500ms, 30s, 5m, 1h",
                    param,
                    ctx,
                )
            seconds = float(match.group(1)) * _UNIT_SECONDS[(match.group(2) or "s").lower()]
        if not 0 < seconds <= MAX_DURATION_SECONDS:
            self.fail(f"invalid duration {value!r}: expected more than 0 and at most 30 days", param, ctx)
        return seconds


DURATION = DurationType()


older_than_option = click.option(
    "--older-than",
    type=DURATION,
    default=f"{DEFAULT_OLDER_THAN_SECONDS:g}s",
    show_default=True,
    help="A room counts as stuck when it has an open entry and none of its entries' timelines moved for this "
    "long: seconds, or a number with a unit (500ms, 30s, 5m, 1h), at most 30 days. Only rooms whose writers "
    "record timelines (timeline=True; the CLI: set --timeline) can be judged.",
)
"""``--older-than DURATION``: the one bound of :func:`kvstatus.stuck.stuck` for every command that judges stuck rooms."""


class RoomType(click.ParamType):
    """A room id: a decimal integer in [0, 2**63 - 1]."""

    name = "ROOM"

    def convert(self, value: Any, param: Optional[click.Parameter], ctx: Optional[click.Context]) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        try:
            return parse_room(str(value))
        except InvalidArgumentError as exc:
            self.fail(str(exc), param, ctx)


class StatusType(click.ParamType):
    """A status: a KVPoll name (case-insensitive) or its number 0..4."""

    name = "STATUS"

    def convert(self, value: Any, param: Optional[click.Parameter], ctx: Optional[click.Context]) -> KVPoll:
        if isinstance(value, KVPoll):
            return value
        try:
            return parse_status(str(value))
        except InvalidArgumentError as exc:
            self.fail(str(exc), param, ctx)


ROOM = RoomType()
STATUS = StatusType()


EXTRAS = {"metrics": ("prometheus_client",), "web": ("starlette", "uvicorn")}
"""The optional extras (pyproject.toml) and the modules each one brings."""


def require_extra(extra: str, what: str) -> None:
    """Raise a ClickException (exit 1) naming the missing module when ``extra`` (one of :data:`EXTRAS`), which
    ``what`` needs, is not installed: checked before the command starts anything."""
    for module in EXTRAS[extra]:
        try:
            importlib.import_module(module)
        except ImportError:
            raise click.ClickException(
                f"{what} needs the optional '{extra}' extra ({module} is not installed): "
                f"in a kvstatus checkout, pip install '.[{extra}]'"
            ) from None


def emit_json(document: Any) -> None:
    click.echo(json.dumps(document, sort_keys=False))


def status_text(status: Optional[KVPoll]) -> str:
    return "-" if status is None else f"{status.name}({status.value})"


def ttl_text(ttl_ms: Optional[int]) -> str:
    return "no TTL" if ttl_ms is None else f"{ttl_ms / 1000:.1f}s"


def note_empty_namespace(schema: KeySchema) -> None:
    """On stderr (stdout stays parseable): the namespace holds no room at all, most often a mistyped name."""
    click.echo(
        f"kvstatus: namespace {schema.namespace!r} holds no rooms (no key {schema.scan_pattern}): check "
        "--namespace / KVSTATUS_NAMESPACE if you expected some",
        err=True,
    )


def stderr_is_tty() -> bool:
    return sys.stderr.isatty()
