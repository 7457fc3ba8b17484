"""The broken stores the demo (and the tests' race and history checks) compare kvstatus against.

Each has the :class:`~kvstatus.StatusStore` methods a worker uses
(``update_status``, ``update_many``, ``get``, ``clear``, ``record_failure``)
and keeps the same keys (:class:`~kvstatus.keys.KeySchema`), so one workload
runs unchanged on kvstatus and on a baseline:

- :class:`ClientSideStore`: the *fixed* rule decided in the client between a
  read and a write (HGET, :func:`~kvstatus.rule.apply_rule`, HSET + PTTL/PEXPIRE),
  as many result backends do. Used alone it gives the same answers as
  kvstatus; used concurrently a write can act on a status that changed since
  it was read, so a late abort can resurrect a cleared room.
- :class:`PreFixStore`: the rule before the upstream fix: an abort writes
  Failed whether or not the entry still exists (HSET, no TTL, as the upstream
  dict had none); every other call goes through kvstatus.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Mapping, Optional

from kvstatus.keys import DEFAULT_PARTICIPANT, FATE_FIELD, KeySchema, reason_field
from kvstatus.model import KVPoll, Outcome, Policy, Stage, UpdateResult, to_status
from kvstatus.replies import parse_fate
from kvstatus.rule import STAGE_OF_STATUS, apply_rule, shared_status

if TYPE_CHECKING:  # a pre-fix store is handed its kvstatus store: the baselines stay below the store
    from kvstatus._sync.store import StatusStore

BASELINES = ("client-side", "pre-fix")


class ClientSideStore:
    """The store's API as a client-side read-decide-write: right when alone, not atomic.

    ``shared_fate`` as StatusStore's. ``race_window`` (seconds) is slept between the read and the write: 0 is an
    honest client; tests widen it so that a race shows up in few operations.
    """

    def __init__(
        self,
        client: Any,
        namespace: str,
        *,
        participant: str = DEFAULT_PARTICIPANT,
        ttl: float = 600.0,
        policy: Policy | str = Policy.SEED,
        race_window: float = 0.0,
        shared_fate: bool = True,
    ) -> None:
        self.client = client
        self.shared_fate = shared_fate
        self.schema = KeySchema(namespace)
        self.participant = participant
        self.policy = Policy(policy)
        self._ttl_ms = round(ttl * 1000)
        self._reason = reason_field(participant)
        self._race_window = race_window

    def _key(self, room: int) -> str:
        return self.schema.room_key(room)

    def _pause(self) -> None:
        if self._race_window > 0:
            time.sleep(self._race_window)

    def get(self, room: int) -> Optional[KVPoll]:
        """As kvstatus: the entry, judged with the room's first failure unless ``shared_fate`` is off."""
        key = self._key(room)
        value, fate = self.client.hmget(key, self.participant, FATE_FIELD)
        own = None if value is None else KVPoll(int(value))
        return shared_status(own, parse_fate(fate, key), self.participant) if self.shared_fate else own

    def update_status(self, room: int, status: KVPoll | int) -> UpdateResult:
        """Read, decide with the reference rule, write: the outcome is the rule's, CREATED from HSET's reply."""
        status = to_status(status)
        key = self._key(room)
        value, reason = self.client.hmget(key, self.participant, self._reason)
        current = None if value is None else KVPoll(int(value))
        result = apply_rule(current, status, self.policy)
        self._pause()
        if result.outcome in (Outcome.CREATED, Outcome.ADVANCED, Outcome.FAILED):
            created = self.client.hset(key, self.participant, str(int(status))) == 1
            if result.outcome is Outcome.ADVANCED and current is KVPoll.Failed:
                self.client.hdel(key, self._reason)  # as kvstatus: leaving Failed drops the old reason
            if result.outcome is Outcome.FAILED and current is not None:  # as kvstatus: the room's first failure
                stage = STAGE_OF_STATUS[current].value
                record = f"{round(time.time() * 1000)}:{stage}:{self.participant}:{(reason or b'').decode()}"
                self.client.hsetnx(key, FATE_FIELD, record)
            self._extend_ttl(key)
            if created:
                return UpdateResult(Outcome.CREATED, status)
        elif result.outcome is Outcome.UNCHANGED:
            self._extend_ttl(key)
        return result

    def _extend_ttl(self, key: str) -> None:
        """As kvstatus: the key's TTL becomes at least this store's, never shorter (read, then write)."""
        if self.client.pttl(key) < self._ttl_ms:
            self.client.pexpire(key, self._ttl_ms)

    def update_many(self, updates: Mapping[int, KVPoll | int]) -> dict[int, UpdateResult]:
        return {room: self.update_status(room, status) for room, status in updates.items()}

    def clear(self, room: int) -> bool:
        """As kvstatus: a failed room's record goes with its last entry (a cancel's stays)."""
        key = self._key(room)
        removed = self.client.hdel(key, self.participant, self._reason)
        if removed:
            fate = parse_fate(self.client.hget(key, FATE_FIELD), key)
            if fate is not None and fate.stage is not Stage.CANCELLED and self.client.hlen(key) == 1:
                self.client.hdel(key, FATE_FIELD)
        return bool(removed)

    def record_failure(self, room: int, reason: str) -> bool:
        """Record ``reason`` if the entry exists and has none yet (read, then write)."""
        key = self._key(room)
        exists, earlier = self.client.hmget(key, self.participant, self._reason)
        if exists is None or earlier is not None:
            return False
        self._pause()
        self.client.hset(key, self._reason, reason)
        fate = parse_fate(self.client.hget(key, FATE_FIELD), key)
        if fate is not None and fate.origin == self.participant and not fate.reason:
            self.client.hset(key, FATE_FIELD, f"{fate.at_ms}:{fate.stage.value}:{fate.origin}:{reason}")
        self._extend_ttl(key)
        return True


class PreFixStore:
    """kvstatus, except that an abort writes Failed unconditionally (HSET, no TTL), as before the upstream fix.

    Every other call goes to ``store``, the kvstatus store of the same namespace and participant."""

    def __init__(self, store: StatusStore) -> None:
        self.client = store.client
        self.schema = store.schema
        self.participant = store.participant
        self._store = store

    def update_status(self, room: int, status: KVPoll | int) -> UpdateResult:
        """A Failed update is CREATED when its HSET made the field (a resurrection), else FAILED."""
        if to_status(status) is not KVPoll.Failed:
            return self._store.update_status(room, status)
        created = self.client.hset(self.schema.room_key(room), self.participant, str(int(KVPoll.Failed))) == 1
        return UpdateResult(Outcome.CREATED if created else Outcome.FAILED, KVPoll.Failed)

    def update_many(self, updates: Mapping[int, KVPoll | int]) -> dict[int, UpdateResult]:
        return {room: self.update_status(room, status) for room, status in updates.items()}

    def get(self, room: int) -> Optional[KVPoll]:
        return self._store.get(room)

    def clear(self, room: int) -> bool:
        return self._store.clear(room)

    def record_failure(self, room: int, reason: str) -> bool:
        return self._store.record_failure(room, reason)
