"""A minimal stand-in for sglang 0.5.23's KV manager, sender and PPConsensusStore (no sglang needed).

Same attribute names, and the bodies of the status methods of
``sglang/srt/disaggregation/common/conn.py`` (``update_status``,
``check_status``, ``check_status_pp_consensus``, ``_notify_bootstrap``,
``record_failure``, ``CommonKVSender._poll_with_status``, ``clear`` and ``failure_exception``,
``CommonKVReceiver._poll``, ``_clear`` and ``failure_exception``), reduced to what touches
``request_status``. ``KVPoll`` is a plain class of ints, as upstream.
The real-sglang tier (tests/sglang/test_real_sglang.py) runs the same
operation sequences through this stand-in and the real classes and requires
identical observations: that is what makes it a faithful stand-in.
"""

from __future__ import annotations

import enum
import threading
from collections import defaultdict
from typing import Any, Optional


class KVPoll:
    Failed = 0
    Bootstrapping = 1
    WaitingForInput = 2
    Transferring = 3
    Success = 4


class DisaggregationMode(enum.Enum):
    NULL = "null"
    PREFILL = "prefill"
    DECODE = "decode"


class KVArgs:
    def __init__(self, engine_rank: int = 0) -> None:
        self.engine_rank = engine_rank


class DeferredBootstrap:
    """Stand-in of ``common/bootstrap.py``'s DeferredBootstrap: ``fail(room)`` answers a registered room once."""

    def __init__(self) -> None:
        self.endpoints: dict[int, tuple[str, int]] = {}
        self.failed: list[int] = []

    def register(self, room: int, endpoint: tuple[str, int]) -> None:
        self.endpoints[room] = endpoint

    def fail(self, room: int) -> Optional[tuple[tuple[str, int], bool]]:
        self.failed.append(room)
        endpoint = self.endpoints.pop(room, None)
        return None if endpoint is None else (endpoint, True)


class CommonKVManager:
    deferred_bootstrap: Optional[DeferredBootstrap] = None

    def check_status(self, bootstrap_room: int) -> int:
        return self.request_status[bootstrap_room]

    def check_status_pp_consensus(self, bootstrap_room: int) -> int:
        statuses = self.request_status.collect(bootstrap_room)
        if any(status is None for status in statuses):
            return KVPoll.Bootstrapping
        return min(statuses)

    def update_status(self, bootstrap_room: int, status: int) -> None:
        current = self.request_status.get(bootstrap_room)
        if current is None:
            if status in (KVPoll.Bootstrapping, KVPoll.WaitingForInput):
                self._deferred_ack_targets.pop(bootstrap_room, None)
                self._deferred_ack_poisoned_rooms.discard(bootstrap_room)
                self._staging_outstanding.pop(bootstrap_room, None)
                self.request_status[bootstrap_room] = status
            return
        if status == KVPoll.Failed:
            self.request_status[bootstrap_room] = KVPoll.Failed
            if self.deferred_bootstrap is not None:
                self._notify_bootstrap(bootstrap_room, self.deferred_bootstrap.fail(bootstrap_room))
            return
        if current == KVPoll.Failed:
            return
        self.request_status[bootstrap_room] = max(current, status)

    def record_failure(self, bootstrap_room: int, failure_reason: str) -> None:
        with self.failure_lock:
            self.failure_records[bootstrap_room] = failure_reason

    def _notify_bootstrap(self, room: int, notification: Any) -> None:
        if notification is None:
            return
        endpoint, failed = notification
        self.send_kv_status_message(
            targets=[endpoint],
            bootstrap_room=room,
            status=KVPoll.Failed if failed else KVPoll.WaitingForInput,
            failure_reason="Prefill bootstrap failed" if failed else None,
        )

    def send_kv_status_message(self, **message: Any) -> None:
        self.sent_messages.append(message)


class NixlKVManager(CommonKVManager):
    """nixl overrides check_status (nixl/conn.py:1084); install() must keep the override."""

    def check_status(self, bootstrap_room: int) -> int:
        return self.request_status.get(bootstrap_room, KVPoll.WaitingForInput)


OPENED: list[Any] = []
"""Managers a test installed: closed after the test (tests/sglang/conftest.py), before its ``server`` stops."""


def close_opened() -> None:
    """Close the status map of every manager in :data:`OPENED` (one whose install failed has a dict: skipped)."""
    while OPENED:
        status_map = OPENED.pop().request_status
        if hasattr(status_map, "close"):
            status_map.close()


def make_manager(
    cls: type = CommonKVManager,
    *,
    mode: DisaggregationMode = DisaggregationMode.PREFILL,
    tp_rank: int = 0,
    pp_rank: int = 0,
    pp_size: int = 1,
    request_status: Any = None,
) -> Any:
    """``object.__new__`` plus the attributes the status methods use, as the real tier builds the real class."""
    m = object.__new__(cls)
    m.request_status = {} if request_status is None else request_status
    m._deferred_ack_targets = {}
    m._deferred_ack_poisoned_rooms = set()
    m._staging_outstanding = defaultdict(int)
    m.sent_messages = []
    m.failure_records, m.failure_lock = {}, threading.Lock()
    m.disaggregation_mode = mode
    m.kv_args = KVArgs(tp_rank)
    m.pp_rank, m.pp_size = pp_rank, pp_size
    m.attn_tp_rank, m.attn_tp_size = tp_rank, 1
    m.attn_cp_rank, m.attn_cp_size = 0, 1
    m.attn_dp_rank, m.attn_dp_size = 0, 1
    m.system_dp_rank, m.system_dp_size = 0, 1
    return m


class PPGroupStore:
    """Stand-in of PPConsensusStore without ZMQ: every rank's local map, visible to rank 0's ``collect`` at once."""

    def __init__(self, pp_size: int) -> None:
        self.maps: list[dict] = [{} for _ in range(pp_size)]
        self.lock = threading.Lock()

    def rank(self, pp_rank: int) -> PPRankStore:
        return PPRankStore(self, pp_rank)


class PPRankStore:
    def __init__(self, group: PPGroupStore, pp_rank: int) -> None:
        self._group, self._pp_rank = group, pp_rank
        self._local_map = group.maps[pp_rank]

    def get(self, key: Any, default: Any = None) -> Any:
        return self._local_map.get(key, default)

    def pop(self, key: Any, default: Any = None) -> Any:
        return self._local_map.pop(key, default)

    def __contains__(self, key: Any) -> bool:
        return key in self._local_map

    def __getitem__(self, key: Any) -> Any:
        return self._local_map[key]

    def __setitem__(self, key: Any, value: Any) -> None:
        self._local_map[key] = value

    def __delitem__(self, key: Any) -> None:
        del self._local_map[key]

    def collect(self, key: Any) -> list[Any]:
        assert self._pp_rank == 0, "collect can only be used on PP rank 0"
        with self._group.lock:
            return [m.get(key) for m in self._group.maps]


class KVTransferError(Exception):
    def __init__(self, bootstrap_room: int, failure_reason: str, is_from_another_rank: bool = False) -> None:
        super().__init__(failure_reason)
        self.bootstrap_room, self.failure_reason = bootstrap_room, failure_reason
        self.is_from_another_rank = is_from_another_rank

    def __str__(self) -> str:
        return f"KVTransferError(bootstrap_room={self.bootstrap_room}): {self.failure_reason}"


class CommonKVSender:
    """The sender's poll, clear and failure_exception, as far as they touch the manager's statuses."""

    def __init__(self, kv_mgr: Any, bootstrap_room: int) -> None:
        self.kv_mgr, self.bootstrap_room, self.conclude_state = kv_mgr, bootstrap_room, None

    def poll(self) -> int:
        return self._poll_with_status(self.kv_mgr.check_status)

    def poll_pp_consensus(self) -> int:
        return self._poll_with_status(self.kv_mgr.check_status_pp_consensus)

    def _poll_with_status(self, check_status: Any) -> int:
        if self.conclude_state is not None:
            return self.conclude_state
        if self.bootstrap_room in self.kv_mgr.request_status:
            status = check_status(self.bootstrap_room)
        else:
            status = KVPoll.Failed
        if status in (KVPoll.Success, KVPoll.Failed):
            self.conclude_state = status
        return status

    def clear(self) -> None:
        if self.conclude_state is None:
            status = self.kv_mgr.request_status.get(self.bootstrap_room)
            if status in (KVPoll.Success, KVPoll.Failed):
                self.conclude_state = status
        self.kv_mgr.request_status.pop(self.bootstrap_room, None)

    def failure_exception(self) -> None:
        self.conclude_state = KVPoll.Failed
        self.clear()
        raise_failure(self.kv_mgr, self.bootstrap_room)


def raise_failure(kv_mgr: Any, bootstrap_room: int) -> None:
    """The end of both failure_exception()s: pop this manager's record of the room and raise it."""
    with kv_mgr.failure_lock:
        failure_reason = kv_mgr.failure_records.pop(bootstrap_room, None)
    raise KVTransferError(
        bootstrap_room,
        failure_reason or "Failed due to an unknown reason from another rank",
        is_from_another_rank=failure_reason is None,
    )


class CommonKVReceiver:
    """The receiver's poll (``CommonKVReceiver._poll``, without its timeouts): ``check_status``, no ``in``."""

    def __init__(self, kv_mgr: Any, bootstrap_room: int) -> None:
        self.kv_mgr, self.bootstrap_room, self.conclude_state = kv_mgr, bootstrap_room, None
        kv_mgr.update_status(bootstrap_room, KVPoll.Bootstrapping)

    def poll(self) -> int:
        if self.conclude_state is not None:
            return self.conclude_state
        status = self.kv_mgr.check_status(self.bootstrap_room)
        if status in (KVPoll.Success, KVPoll.Failed):
            self.conclude_state = status
        return status

    def clear(self) -> None:
        if self.conclude_state is None:
            status = self.kv_mgr.request_status.get(self.bootstrap_room)
            self.conclude_state = status if status in (KVPoll.Success, KVPoll.Failed) else KVPoll.Failed
        self.kv_mgr.request_status.pop(self.bootstrap_room, None)

    def failure_exception(self) -> None:
        self.conclude_state = KVPoll.Failed
        self.clear()
        raise_failure(self.kv_mgr, self.bootstrap_room)
