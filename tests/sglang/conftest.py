"""The real-sglang tier: tests marked ``sglang`` need the real package (``./dev test-sglang`` provides it)."""

from __future__ import annotations

import os
import types
from collections.abc import Iterator

import pytest

from tests.helpers.tiers import require_redis_server
from tests.servers import RedisServer
from tests.sglang.standin import close_opened

REQUIRE = "KVSTATUS_REQUIRE_SGLANG"


@pytest.fixture(scope="session")
def sglang_conn() -> types.ModuleType:
    """``sglang.srt.disaggregation.common.conn``; skips without sglang (fails when KVSTATUS_REQUIRE_SGLANG=1)."""
    try:
        import sglang.srt.disaggregation.common.conn as conn
    except ImportError as exc:
        message = f"the real sglang is not importable ({exc}); run ./dev test-sglang for this tier"
        if os.environ.get(REQUIRE) == "1":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return conn


@pytest.fixture(scope="module")
def sg(sglang_conn: types.ModuleType) -> types.SimpleNamespace:
    """The real classes."""
    from sglang.srt.disaggregation.common.bootstrap import DeferredBootstrap
    from sglang.srt.disaggregation.pp_consensus_store import PPConsensusStore
    from sglang.srt.disaggregation.utils import DisaggregationMode

    return types.SimpleNamespace(
        conn=sglang_conn,
        Manager=sglang_conn.CommonKVManager,
        Sender=sglang_conn.CommonKVSender,
        KVPoll=sglang_conn.KVPoll,
        Mode=DisaggregationMode,
        PPConsensusStore=PPConsensusStore,
        DeferredBootstrap=DeferredBootstrap,
    )


@pytest.fixture(autouse=True)
def _close_opened_managers() -> Iterator[None]:
    """Every test's managers put in :data:`~tests.sglang.standin.OPENED` are closed after it, passed or failed:
    a manager's lease keeper, peer watch and outage probe are threads that would run on for the rest of the
    worker (the ``server`` fixture closes them earlier, before its server stops)."""
    yield
    close_opened()


@pytest.fixture
def server() -> Iterator[RedisServer]:
    """A redis-server of this test alone (the test stops, restarts or freezes it). The managers the test put in
    :data:`~tests.sglang.standin.OPENED` are closed before it stops: their lease keepers would outlive it."""
    require_redis_server()
    with RedisServer() as started:
        try:
            yield started
        finally:
            close_opened()
