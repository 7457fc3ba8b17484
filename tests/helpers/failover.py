"""A PD-like workload that runs while Redis fails over, and the audit of what it left behind."""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from kvstatus import KVPoll, Policy, apply_rule
from kvstatus.errors import KVStatusError

State = Optional[KVPoll]
Change = Union[KVPoll, str]  # a status update, or "clear"
CLEAR = "clear"


def after(state: State, change: Change, policy: Policy) -> State:
    """The state of one participant's entry after ``change``, by the reference rule."""
    return None if change == CLEAR else apply_rule(state, change, policy).status


@dataclass
class Workload:
    """Rooms updated in batches, singly and cleared, every acknowledged step recorded per room.

    An asynchronous-replication failover may drop the last writes the old master
    acknowledged, once. :meth:`audit` therefore accepts, per room, exactly the
    states "the writes before some point k, then the writes from some later
    point j on" (k <= j), and nothing else: never a state the rule could not
    have produced from the room's own history, never a key without TTL.
    """

    store: Any
    rooms: int = 400
    seed: int = 7
    history: dict[int, list[tuple[Change, bool]]] = field(default_factory=dict)  # (change, surely applied)
    errors: list[str] = field(default_factory=list)
    steps: int = 0
    slowest_call: float = 0.0  # seconds; how long a caller was held up while the store resent

    def __post_init__(self) -> None:
        self._random = random.Random(self.seed)
        self.history = {room: [] for room in range(self.rooms)}

    def step(self) -> None:
        """One update_many of 40 rooms, one update_status and one clear."""
        chosen = self._random.sample(range(self.rooms), 42)
        updates = {room: KVPoll(self._random.randrange(5)) for room in chosen[:40]}
        single, cleared = chosen[40], chosen[41]
        single_status = KVPoll(self._random.randrange(5))
        self._record(lambda: self.store.update_many(updates), updates)
        self._record(lambda: self.store.update_status(single, single_status), {single: single_status})
        self._record(lambda: self.store.clear(cleared), {cleared: CLEAR})
        self.steps += 1

    def run_until(self, stop: threading.Event, pause: float = 0.01) -> None:
        """Step every ``pause`` seconds until ``stop`` is set (the pause bounds the history to audit)."""
        while not stop.wait(pause):
            self.step()

    def _record(self, send: Any, changes: dict[int, Change]) -> None:
        started = time.monotonic()
        try:
            send()
            applied = True
        except KVStatusError as exc:
            self.errors.append(f"{time.monotonic():.2f} {type(exc).__name__}: {exc}")
            applied = False  # unknown: it may or may not have reached Redis
        self.slowest_call = max(self.slowest_call, time.monotonic() - started)
        for room, change in changes.items():
            self.history[room].append((change, applied))

    def possible_states(self, room: int) -> set[State]:
        ops = self.history[room]
        policy = self.store.policy

        def run(states: set[State], segment: list[tuple[Change, bool]]) -> set[State]:
            for change, applied in segment:
                moved = {after(s, change, policy) for s in states}
                states = moved if applied else moved | states
            return states

        # The rule maps sets element-wise, so the k <= j choice folds into "any prefix up to j".
        possible: set[State] = set()
        reached: set[State] = {None}
        prefix: set[State] = {None}
        for j in range(len(ops) + 1):
            possible |= run(reached, ops[j:])
            if j < len(ops):
                prefix = run(prefix, [ops[j]])
                reached = reached | prefix
        return possible

    def audit(self, raw: Any) -> list[str]:
        """Problems in Redis: a state the room's history cannot explain, or a key without TTL."""
        problems = []
        found = self.store.get_many(range(self.rooms))
        for room, status in found.items():
            possible = self.possible_states(room)
            if status not in possible:
                problems.append(f"room {room} is {status!r}; its history allows only {sorted(map(repr, possible))}")
            key = self.store.schema.room_key(room)
            if raw.exists(key) and raw.pttl(key) < 0:
                problems.append(f"{key} has no TTL")
        return problems
