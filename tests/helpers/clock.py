"""Moving the peer watch's clock forward, instead of waiting a lease TTL out; stepping Redis' clock."""

from __future__ import annotations

import hashlib
import time
import types

import pytest

import kvstatus.peerwatch


def shift_watch_clock(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """From now on, the peer watch's monotonic clock reads ``seconds`` ahead of the real one."""
    fake = types.SimpleNamespace(monotonic=lambda: time.monotonic() + seconds)
    monkeypatch.setattr(kvstatus.peerwatch, "time", fake)


def hold_background_watch(monkeypatch: pytest.MonkeyPatch) -> None:
    """From now on, no lease keeper's background looks at its peers or counts their presences: a test that calls
    ``look_at_peers()`` itself then sees every look's result (the background would otherwise carry out a restart
    or a loss first, whenever the box is slow). Renewals go on."""
    monkeypatch.setattr(kvstatus.peerwatch.PeerWatch, "next_delay", lambda self: 3600.0)
    monkeypatch.setattr(kvstatus.peerwatch.PeerWatch, "next_count_delay", lambda self: 3600.0)


def step_redis_clock(monkeypatch: pytest.MonkeyPatch, ms: int) -> None:
    """From now on, the scripts that judge leases (lua/lease.lua, lua/room_statuses.lua, lua/sweep.lua) read Redis'
    ``TIME`` ``ms`` off, as after a step of the server's clock (an NTP step, an operator's ``date -s``), without
    root. Only the test's copies change: each is the shipped script with one line of lua/lib/time.lua amended."""
    from kvstatus import scripts

    now = "return tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)"
    lib = scripts.read_lib("time")
    assert lib is not None and now in lib, "lua/lib/time.lua's now_ms() changed: amend this helper"
    stepped = lib.replace(now, now + " + (" + str(int(ms)) + ")")
    for attribute in ("LEASE", "ROOM_STATUSES", "SWEEP"):
        shipped = getattr(scripts, attribute)
        text = scripts._lua_dir().joinpath(f"{shipped.name}.lua").read_text(encoding="utf-8")
        source = scripts.splice(shipped.name, text, lambda name: stepped if name == "time" else scripts.read_lib(name))
        sha = hashlib.sha1(source.encode("utf-8")).hexdigest()
        monkeypatch.setattr(scripts, attribute, scripts.LuaScript(shipped.name, source, sha, shipped.read_only))
