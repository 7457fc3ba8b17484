"""The process-wide switch: an sglang general plugin, enabled by ``KVSTATUS_SGLANG_URL``.

kvstatus declares the entry point ``kvstatus = "kvstatus.sglang.plugin:register"``
in the group ``sglang.srt.plugins``. sglang's ``load_plugins()`` calls
:func:`register` early in every process it starts (the launcher, each
scheduler, the data-parallel controller, the detokenizer, ``Engine``), so an
unmodified ``python -m sglang.launch_server`` or ``sglang serve`` is enough.
Without ``KVSTATUS_SGLANG_URL`` the plugin does nothing. With it,
:func:`register` hooks ``CommonKVManager.__init__`` (an AFTER hook through
sglang's ``HookRegistry``), and every KV manager (mooncake, nixl, mori,
ascend) is put onto kvstatus by :func:`kvstatus.sglang.install` as soon as
it is built, before its transfer threads start.

Settings (environment, read when a manager is built, so a bad one fails the
server's start with a clear message instead of being skipped; every error names
its variable, the URL's password masked, and a ``KVSTATUS_SGLANG_*`` variable
the plugin does not read, a misspelt one, stops the start too):

- ``KVSTATUS_SGLANG_URL``        the Redis URL (any scheme of :mod:`kvstatus.connection`); the switch.
- ``KVSTATUS_SGLANG_NAMESPACE``  the PD deployment's namespace, the same on every node [default ``sglang``].
- ``KVSTATUS_SGLANG_INSTANCE``   a tag for this server, when two servers of one role share the namespace.
- ``KVSTATUS_SGLANG_POLICY``     ``strict`` (sglang 0.5.23's rule) or ``seed`` [default ``strict``, install()'s].
- ``KVSTATUS_SGLANG_TTL``        seconds [default: the store's, 600].
- ``KVSTATUS_SGLANG_NEAR_CACHE`` ``0`` to read every status from Redis; ``1`` or unset: the store's near cache
  (:mod:`kvstatus.cachestate`: a poll of an unchanged room makes no round trip) [default ``1``]. A server or ACL
  that refuses CLIENT TRACKING gets one warning line, and the managers run uncached.
- ``KVSTATUS_SGLANG_LEASE_TTL``  seconds of each manager's participant lease, in [3, 3600]; ``0``: no lease
  [default: install()'s, :data:`kvstatus.sglang.manager.DEFAULT_LEASE_TTL`, 10]. With a lease, a manager that dies fails its open rooms for every
  peer within the TTL plus about a second (:mod:`kvstatus.peerwatch`).
- ``KVSTATUS_SGLANG_SHARED_FATE`` ``0`` to read each manager's own entry alone, as upstream's dict does;
  ``1`` or unset: shared fate (:func:`kvstatus.rule.shared_status`: a room another participant failed, or a router
  cancelled, reads Failed, and ``failure_exception`` names its first failure) [default ``1``].
- ``KVSTATUS_SGLANG_TIMELINE``   ``0`` to record no timelines; ``1`` or unset: each entry records when it reached
  each status (:mod:`kvstatus.timeline`: ``kvstatus get`` shows where a room waited, ``ls --stuck`` and
  ``health`` name who holds it, and the stage histograms need it) [default ``1``, install()'s; its cost is
  in BENCHMARKS.md].
- ``KVSTATUS_SGLANG_SCRIPTS``    ``functions`` to run kvstatus' Lua by FCALL of the library an admin loaded
  (``kvstatus functions load``), as a user of the tenant ACL recipe must; ``eval`` or unset: EVALSHA
  [default ``eval``].

Each variable is one keyword argument of :func:`kvstatus.sglang.install`, passed only when set, so each default
is install()'s (:data:`kvstatus.sglang.manager.URL_DEFAULTS`) or the store's; the URL carries connection settings
only (:mod:`kvstatus.url`), so no setting has two sources.

Each manager's install checks the server (:func:`kvstatus.sglang.startup.check_store`):
an unreachable Redis, refused credentials, an ACL that does not fit, or a
function library that is not loaded fails the manager's construction, hence
the start. Each installed manager logs one line (``kvstatus.sglang``, INFO).
The plugin needs sglang >= 0.5.23 and refuses an older one at
:func:`register` with SystemExit: sglang logs and skips a plugin that raises
an Exception, which would leave the server on its dicts unnoticed.

sglang loads this module in every process, enabled or not: it imports sglang
only when enabled, and kvstatus' store only when a manager is installed
(loading it does import the ``kvstatus`` package, i.e. redis-py).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Callable, Optional

ENV_URL = "KVSTATUS_SGLANG_URL"
ENV_NAMESPACE = "KVSTATUS_SGLANG_NAMESPACE"
ENV_INSTANCE = "KVSTATUS_SGLANG_INSTANCE"
ENV_POLICY = "KVSTATUS_SGLANG_POLICY"
ENV_TTL = "KVSTATUS_SGLANG_TTL"
ENV_NEAR_CACHE = "KVSTATUS_SGLANG_NEAR_CACHE"
ENV_LEASE_TTL = "KVSTATUS_SGLANG_LEASE_TTL"
ENV_SHARED_FATE = "KVSTATUS_SGLANG_SHARED_FATE"
ENV_TIMELINE = "KVSTATUS_SGLANG_TIMELINE"
ENV_SCRIPTS = "KVSTATUS_SGLANG_SCRIPTS"
DEFAULT_NAMESPACE = "sglang"
HOOK_TARGET = "sglang.srt.disaggregation.common.conn.CommonKVManager.__init__"


def enabled(environ: Optional[Mapping[str, str]] = None) -> bool:
    """True when ``KVSTATUS_SGLANG_URL`` is set and not empty."""
    return bool((os.environ if environ is None else environ).get(ENV_URL, "").strip())


# install()'s setting (SettingError.setting) -> the variable that sets it.
SETTING_VARIABLES = {
    "url": ENV_URL,
    "namespace": ENV_NAMESPACE,
    "instance": ENV_INSTANCE,
    "policy": ENV_POLICY,
    "ttl": ENV_TTL,
    "near_cache": ENV_NEAR_CACHE,
    "lease_ttl": ENV_LEASE_TTL,
    "shared_fate": ENV_SHARED_FATE,
    "timeline": ENV_TIMELINE,
    "scripts": ENV_SCRIPTS,
}
# The values of a boolean setting.
_FLAGS = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}
# SGLang's bootstrap and waiting timeouts (seconds): a room TTL below them can expire a live request's room.
SGLANG_TIMEOUT_SECONDS = 300.0


VARIABLE_PREFIX = "KVSTATUS_SGLANG_"
KNOWN_VARIABLES = tuple(SETTING_VARIABLES.values())
"""Every variable the plugin reads; any other ``KVSTATUS_SGLANG_*`` variable stops the start (a typo, or a
variable of another version), its :class:`~kvstatus.sglang.startup.SettingError` naming it as its setting."""


def _setting_error(variable: str, message: str) -> Exception:
    from kvstatus.sglang.startup import SettingError

    setting = next(name for name, var in SETTING_VARIABLES.items() if var == variable)
    return SettingError(f"{variable}: {message}", setting=setting)


def _seconds(env: Mapping[str, str], variable: str, check: Callable[[float], float]) -> Optional[float]:
    """The variable's number of seconds passed through ``check``; None when unset or empty."""
    from kvstatus.errors import InvalidArgumentError

    raw = env.get(variable, "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise _setting_error(variable, f"invalid value {raw!r}: expected a number of seconds") from None
    try:
        return check(value)
    except InvalidArgumentError as exc:
        raise _setting_error(variable, f"invalid value {raw!r}: {exc}") from None


def _flag(env: Mapping[str, str], variable: str) -> Optional[bool]:
    """The variable's boolean (1/0, true/false, yes/no); None when unset or empty."""
    raw = env.get(variable, "").strip().lower()
    if not raw:
        return None
    if raw not in _FLAGS:
        raise _setting_error(variable, f"invalid value {raw!r}: expected 1 or 0")
    return _FLAGS[raw]


def _room_ttl(seconds: float) -> float:
    from kvstatus.keys import ttl_to_ms

    ttl_to_ms(seconds)
    return seconds


def _lease_ttl(seconds: float) -> float:
    """0 (no lease) or a lease TTL in [3, 3600] seconds."""
    from kvstatus.errors import InvalidArgumentError
    from kvstatus.keys import MAX_LEASE_TTL, MIN_LEASE_TTL, validate_lease_ttl

    if seconds == 0:
        return 0.0
    try:
        return validate_lease_ttl(seconds)
    except InvalidArgumentError:
        raise InvalidArgumentError(
            f"expected 0 (no lease) or seconds in [{MIN_LEASE_TTL:g}, {MAX_LEASE_TTL:g}]; "
            "a lease is renewed every ttl/3 s"
        ) from None


def install_options(environ: Optional[Mapping[str, str]] = None) -> dict[str, Any]:
    """The keyword arguments of :func:`kvstatus.sglang.install` that the environment asks for (validated).

    Every error is a :class:`~kvstatus.sglang.startup.SettingError` naming its variable.
    """
    from kvstatus.errors import InvalidArgumentError
    from kvstatus.keys import validate_name, validate_script_mode
    from kvstatus.model import to_policy
    from kvstatus.url import parse_url

    env = os.environ if environ is None else environ
    url = env.get(ENV_URL, "").strip()
    if not url:
        raise _setting_error(ENV_URL, "not set: it is the Redis URL of the plugin, e.g. redis://host:6379/0")
    try:
        parse_url(url)
    except InvalidArgumentError as exc:
        raise _setting_error(ENV_URL, str(exc)) from None
    unknown = sorted(name for name in env if name.startswith(VARIABLE_PREFIX) and name not in KNOWN_VARIABLES)
    if unknown:
        from kvstatus.sglang.startup import SettingError

        raise SettingError(
            f"{unknown[0]}: no such variable; the plugin reads {', '.join(KNOWN_VARIABLES)} (unset the variable, "
            "or correct its name: a misspelt setting would otherwise be ignored)",
            setting=unknown[0],
        )
    options: dict[str, Any] = {"store_or_url": url}
    for variable, key, default, check in (
        (ENV_NAMESPACE, "namespace", DEFAULT_NAMESPACE, lambda v: validate_name(v, "namespace")),
        (ENV_POLICY, "policy", None, lambda v: to_policy(v).value),  # install()'s default: strict
        (ENV_INSTANCE, "instance", None, lambda v: validate_name(v, "instance")),
        (ENV_SCRIPTS, "scripts", None, validate_script_mode),  # the store's default: eval
    ):
        raw = env.get(variable, "").strip()
        try:
            value = check(raw) if raw else default
        except InvalidArgumentError as exc:
            raise _setting_error(variable, str(exc)) from None
        if value is not None:
            options[key] = value
    ttl = _seconds(env, ENV_TTL, _room_ttl)
    if ttl is not None:
        options["ttl"] = ttl
    lease_ttl = _seconds(env, ENV_LEASE_TTL, _lease_ttl)
    if lease_ttl is not None:
        options["lease_ttl"] = lease_ttl or None  # 0: no lease
    for variable, key in ((ENV_NEAR_CACHE, "near_cache"), (ENV_SHARED_FATE, "shared_fate"), (ENV_TIMELINE, "timeline")):
        switch = _flag(env, variable)
        if switch is not None:
            options[key] = switch
    return options


def _shown(variable: str, env: Mapping[str, str]) -> str:
    """``VARIABLE=value`` as an error shows it: the URL's password masked, a long value cut."""
    from kvstatus.errors import mask_url

    raw = env.get(variable, "").strip()
    if not raw:
        return f"{variable} (unset: {DEFAULT_NAMESPACE!r})" if variable == ENV_NAMESPACE else f"{variable} (unset)"
    shown = mask_url(raw) if variable == ENV_URL else raw
    return f"{variable}={shown[:200]}"


def install_from_env(kv_manager: Any, environ: Optional[Mapping[str, str]] = None) -> Any:
    """:func:`kvstatus.sglang.install` on ``kv_manager`` with the environment's settings; returns the map.

    A check that fails at install (:func:`kvstatus.sglang.startup.check_store`) raises a
    :class:`~kvstatus.sglang.startup.SettingError` whose message starts with the variable at fault.
    """
    from kvstatus.sglang.manager import install
    from kvstatus.sglang.startup import SettingError, log

    env = os.environ if environ is None else environ
    options = install_options(env)
    if options.get("ttl", SGLANG_TIMEOUT_SECONDS) < SGLANG_TIMEOUT_SECONDS:
        log.warning(
            "%s=%g is below SGLang's %g s bootstrap and waiting timeouts: a slow request's room can "
            "expire while it is still in use",
            ENV_TTL,
            options["ttl"],
            SGLANG_TIMEOUT_SECONDS,
        )
    try:
        return install(kv_manager, options.pop("store_or_url"), **options)
    except SettingError as exc:
        variable = SETTING_VARIABLES.get(exc.setting)
        if variable is None:
            raise
        raise SettingError(f"{_shown(variable, env)}: {exc}", setting=exc.setting) from exc


def _after_init(result: Any, kv_manager: Any, *args: Any, **kwargs: Any) -> None:
    """sglang AFTER hook of ``CommonKVManager.__init__``: the manager is built, no transfer thread runs yet.

    An error raised here fails the manager's construction, so the server does not start.
    """
    install_from_env(kv_manager)


def register() -> None:
    """The ``sglang.srt.plugins`` entry point: hook ``CommonKVManager.__init__`` when ``KVSTATUS_SGLANG_URL`` is set.

    Settings are read and checked when a manager is built, not here: sglang
    logs and skips a plugin whose function raises an Exception, which would
    leave the server on its in-process dicts without anyone noticing. For
    the same reason an sglang older than 0.5.23 is refused with SystemExit,
    which stops the process with the message.
    """
    if not enabled():
        return
    from kvstatus.sglang.startup import SettingError, check_sglang_version

    try:
        check_sglang_version()
    except SettingError as exc:
        raise SystemExit(f"kvstatus: {ENV_URL} is set, but {exc}") from None
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(HOOK_TARGET, _after_init, HookType.AFTER)
