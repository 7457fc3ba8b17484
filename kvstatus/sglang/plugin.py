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
server's start with a clear message instead of being skipped):

- ``KVSTATUS_SGLANG_URL``        the Redis URL (any scheme of :mod:`kvstatus.connection`); the switch.
- ``KVSTATUS_SGLANG_NAMESPACE``  the PD deployment's namespace, the same on every node [default ``sglang``].
- ``KVSTATUS_SGLANG_INSTANCE``   a tag for this server, when two servers of one role share the namespace.
- ``KVSTATUS_SGLANG_POLICY``     ``strict`` (sglang 0.5.23's rule) or ``seed`` [default ``strict``].
- ``KVSTATUS_SGLANG_TTL``        seconds [default: the store's, 600].
- ``KVSTATUS_SGLANG_NEAR_CACHE`` ``1`` to read through the store's near cache [default ``0``].

sglang loads this module in every process, enabled or not: it imports sglang
only when enabled, and kvstatus' store only when a manager is installed
(loading it does import the ``kvstatus`` package, i.e. redis-py).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Optional

ENV_URL = "KVSTATUS_SGLANG_URL"
ENV_NAMESPACE = "KVSTATUS_SGLANG_NAMESPACE"
ENV_INSTANCE = "KVSTATUS_SGLANG_INSTANCE"
ENV_POLICY = "KVSTATUS_SGLANG_POLICY"
ENV_TTL = "KVSTATUS_SGLANG_TTL"
ENV_NEAR_CACHE = "KVSTATUS_SGLANG_NEAR_CACHE"
DEFAULT_NAMESPACE = "sglang"
HOOK_TARGET = "sglang.srt.disaggregation.common.conn.CommonKVManager.__init__"


def enabled(environ: Optional[Mapping[str, str]] = None) -> bool:
    """True when ``KVSTATUS_SGLANG_URL`` is set and not empty."""
    return bool((os.environ if environ is None else environ).get(ENV_URL, "").strip())


def install_options(environ: Optional[Mapping[str, str]] = None) -> dict[str, Any]:
    """The keyword arguments of :func:`kvstatus.sglang.install` that the environment asks for (validated)."""
    from kvstatus.errors import InvalidArgumentError

    env = os.environ if environ is None else environ
    url = env.get(ENV_URL, "").strip()
    if not url:
        raise InvalidArgumentError(f"{ENV_URL} is not set")
    options: dict[str, Any] = {
        "store_or_url": url,
        "namespace": env.get(ENV_NAMESPACE, "").strip() or DEFAULT_NAMESPACE,
        "policy": env.get(ENV_POLICY, "").strip() or "strict",
        "instance": env.get(ENV_INSTANCE, "").strip() or None,
    }
    ttl = env.get(ENV_TTL, "").strip()
    if ttl:
        try:
            options["ttl"] = float(ttl)
        except ValueError:
            raise InvalidArgumentError(f"invalid {ENV_TTL} {ttl!r}: expected a number of seconds") from None
    near = env.get(ENV_NEAR_CACHE, "").strip().lower()
    if near not in ("", "0", "1", "true", "false", "yes", "no"):
        raise InvalidArgumentError(f"invalid {ENV_NEAR_CACHE} {near!r}: expected 1 or 0")
    options["near_cache"] = near in ("1", "true", "yes")
    return options


def install_from_env(kv_manager: Any, environ: Optional[Mapping[str, str]] = None) -> Any:
    """:func:`kvstatus.sglang.install` on ``kv_manager`` with the environment's settings; returns the map."""
    from kvstatus.sglang.manager import install

    options = install_options(environ)
    return install(kv_manager, options.pop("store_or_url"), **options)


def _after_init(result: Any, kv_manager: Any, *args: Any, **kwargs: Any) -> None:
    """sglang AFTER hook of ``CommonKVManager.__init__``: the manager is built, no transfer thread runs yet."""
    install_from_env(kv_manager)


def register() -> None:
    """The ``sglang.srt.plugins`` entry point: hook ``CommonKVManager.__init__`` when ``KVSTATUS_SGLANG_URL`` is set.

    Settings are read and checked when a manager is built, not here: sglang
    logs and skips a plugin whose function raises, which would leave the
    server on its in-process dicts without anyone noticing.
    """
    if not enabled():
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(HOOK_TARGET, _after_init, HookType.AFTER)
