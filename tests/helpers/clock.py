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
