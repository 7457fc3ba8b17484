"""Moving the peer watch's clock forward, instead of waiting a lease TTL out."""

from __future__ import annotations

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
