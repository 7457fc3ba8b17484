"""SGLang integration: a KV manager's ``request_status`` on kvstatus (sglang is imported only by the plugin hook).
:class:`RoomStatusMap` is the mapping assigned to ``request_status``; :func:`install` / :func:`uninstall` put one KV
manager onto a store, or back; :mod:`kvstatus.sglang.plugin` is the process-wide switch, an sglang plugin enabled by
``KVSTATUS_SGLANG_URL``; :class:`SettingError` is a setting that stops the start, naming it."""

from kvstatus.sglang.manager import install, is_installed, open_store, participant_name, pp_participants, uninstall
from kvstatus.sglang.mapping import RoomStatusMap
from kvstatus.sglang.startup import MIN_SGLANG_VERSION, SettingError

__all__ = [
    "MIN_SGLANG_VERSION",
    "RoomStatusMap",
    "SettingError",
    "install",
    "is_installed",
    "open_store",
    "participant_name",
    "pp_participants",
    "uninstall",
]
