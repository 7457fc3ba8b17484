"""``kvstatus demo --stuck``: a deployment with one slow decode and one dead prefill, for ``health`` and ``ls --stuck``.

Two prefill and two decode instances, each one participant as the SGLang plugin names it (a lease, timelines
on), share a fresh namespace:

- ``prefill-a`` × ``decode-a`` serve: every room walks to Success and both sides clear it;
- ``decode-b`` is slow: its rooms with ``prefill-a`` sit in Bootstrapping (it never finishes the handshake)
  while the prefill waits in WaitingForInput;
- ``prefill-b`` dies: a child process holding its lease bootstraps rooms with ``decode-a``, then is SIGKILLed.
  ``decode-a``'s peer watch fails them when the lease runs out (the lease TTL plus about a second). One more
  request sent to it after its death has only the decode's entry.

:func:`run_stuck_scenario` builds that and returns the namespace with the stores still open (their leases and
entries stay live until :meth:`StuckScenario.close`), so ``health`` and ``ls --stuck`` can be run on it.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field
from typing import Optional

from kvstatus._sync.store import StatusStore
from kvstatus.demo.server import Child
from kvstatus.model import KVPoll

LEASE_TTL = 3.0
"""Seconds: the dead prefill's rooms fail about 4 s after its kill (the plugin's default, 10 s, would take 11)."""
SERVED, SLOW, DEAD = 4, 3, 2
"""Rooms of the serving pair, of the slow decode, and of the dead prefill (plus one sent after its death)."""
FIRST_ROOM = 8_000

_PREFILL = """
import sys, time
from kvstatus._sync.store import StatusStore
from kvstatus.model import KVPoll
url, namespace, participant, ttl, *rooms = sys.argv[1:]
store = StatusStore.from_url(url, namespace=namespace, participant=participant, lease_ttl=float(ttl), timeline=True)
for room in rooms:
    store.update_status(int(room), KVPoll.Bootstrapping)
print("ready", flush=True)
time.sleep(3600)
"""


def participant(instance: str) -> str:
    """The participant the SGLang plugin names for TP rank 0, PP rank 0 of ``instance`` (e.g. ``prefill-a``)."""
    return f"{instance}-tp0-pp0"


@dataclass
class StuckScenario:
    """The namespace the scenario wrote, the rooms of each case, and the stores that keep it live."""

    namespace: str
    served: list[int]
    slow: list[int]
    dead: list[int]
    after_death: int
    stores: list[StatusStore] = field(default_factory=list)

    def close(self) -> None:
        """Close every store (their leases are released: the rooms left open then fail, as at a shutdown)."""
        for store in self.stores:
            store.close()


def run_stuck_scenario(url: str, namespace: Optional[str] = None, wait: float = LEASE_TTL + 2.5) -> StuckScenario:
    """Write the scenario into ``namespace`` (default a fresh one) and wait ``wait`` seconds: the dead prefill's
    rooms have failed by then, and every open room has sat still that long."""
    namespace = namespace or f"stuck-demo-{os.getpid()}-{int(time.time())}"
    rooms = iter(range(FIRST_ROOM, FIRST_ROOM + 100))
    scenario = StuckScenario(
        namespace,
        served=[next(rooms) for _ in range(SERVED)],
        slow=[next(rooms) for _ in range(SLOW)],
        dead=[next(rooms) for _ in range(DEAD)],
        after_death=next(rooms),
    )

    def store(instance: str) -> StatusStore:
        made = StatusStore.from_url(
            url, namespace=namespace, participant=participant(instance), lease_ttl=LEASE_TTL, timeline=True
        )
        scenario.stores.append(made)
        return made

    prefill_a, decode_a, decode_b = store("prefill-a"), store("decode-a"), store("decode-b")
    for room in scenario.served:
        decode_a.update_status(room, KVPoll.Bootstrapping)
        for status in (KVPoll.Bootstrapping, KVPoll.WaitingForInput, KVPoll.Transferring, KVPoll.Success):
            prefill_a.update_status(room, status)
        decode_a.update_status(room, KVPoll.WaitingForInput)
        decode_a.update_status(room, KVPoll.Success)
        prefill_a.pop(room)
        decode_a.pop(room)
    for room in scenario.slow:
        decode_b.update_status(room, KVPoll.Bootstrapping)
        prefill_a.update_status(room, KVPoll.Bootstrapping)
        prefill_a.update_status(room, KVPoll.WaitingForInput)
    dead = Child(_PREFILL, url, namespace, participant("prefill-b"), str(LEASE_TTL), *map(str, scenario.dead))
    try:
        for room in scenario.dead:
            decode_a.update_status(room, KVPoll.Bootstrapping)
            decode_a.update_status(room, KVPoll.WaitingForInput)
        decode_a.look_at_peers()  # the decode's watch has seen the prefill's lease
        dead.signal(signal.SIGKILL)
    finally:
        dead.stop()
    decode_a.update_status(scenario.after_death, KVPoll.Bootstrapping)  # a request sent to the dead prefill
    decode_a.update_status(scenario.after_death, KVPoll.WaitingForInput)
    time.sleep(wait)
    return scenario
