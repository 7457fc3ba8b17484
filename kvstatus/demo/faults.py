"""``kvstatus demo --faults``: what a peer's death, restart, pause or a cancel does to a room, in separate processes.

One *trial* of a fault: a survivor store in this process, built as the SGLang plugin builds it (a lease,
shared fate, near cache off unless asked), holds an open entry in a fresh room of a fresh namespace and
polls ``get`` every 5 ms; its *peer* is a child process holding its own lease and an open entry there.

- ``kill``: SIGKILL the peer, a prefill mid-transfer (the survivor is the decode waiting for it);
- ``kill-decode``: SIGKILL the peer, a decode waiting (the survivor is the prefill mid-transfer);
- ``kill-unwritten``: SIGKILL the peer, a prefill that holds a lease carrying its address but never wrote the
  room (a request sent to it as it died); the survivor, a decode, waits on that address (``store.awaits``);
- ``kill-done``: SIGKILL the peer, a prefill whose entry reached Success but which died before it told the decode
  (SGLang's completion message); the survivor, a decode still open, waits on its address;
- ``restart``: SIGKILL the peer and start it again under the same name; timed from the new incarnation's
  acquire;
- ``restart-done``: as ``kill-done``, but the prefill is started again under the same name and address; timed
  from the new incarnation's acquire;
- ``cancel``: a third process cancels the room (``cancel-near``: the survivor reads through a near cache);
- ``pause``: SIGSTOP the peer for 2/3 of its lease TTL, then SIGCONT: it must fail nothing.

:func:`run_trial` times one; benchmarks/peerfaults.py runs 20 of each for BENCHMARKS.md.
"""

from __future__ import annotations

import signal
import time
from typing import NamedTuple, Optional

from kvstatus._sync.store import StatusStore
from kvstatus.demo.server import Child
from kvstatus.model import KVPoll

FAULTS = (
    "kill",
    "kill-decode",
    "kill-unwritten",
    "kill-done",
    "restart",
    "restart-done",
    "cancel",
    "cancel-near",
    "pause",
)
PEER_ADDRESS = "10.0.0.7:8998"
"""The address the peer's lease carries (nothing listens there: the survivor of ``kill-unwritten``, ``kill-done``
and ``restart-done`` waits on it)."""
POLL_SECONDS = 0.005
LIMIT_SECONDS = 60.0

UPSTREAM = {
    "kill": "the decode waits out its 300 s waiting timeout",
    "kill-decode": "the prefill waits out its 300 s bootstrap timeout",
    "kill-unwritten": "the decode's heartbeat of the prefill (5 s, 2 misses), else its 300 s waiting timeout",
    "kill-done": "the decode waits out its 300 s waiting timeout (the completion message never comes)",
    "restart": "the new prefill knows none of the old rooms: 300 s timeouts",
    "restart-done": "the decode waits out its 300 s waiting timeout (the completion message never comes)",
    "cancel": "no cancel: a router's abort reaches only the server it calls",
    "cancel-near": "(as above)",
    "pause": "nothing fails",
}
"""What SGLang alone does for the same fault (its dicts, its 300 s bootstrap and waiting timeouts)."""

_PEER = """
import sys, time
from kvstatus import KVPoll, StatusStore
url, namespace, participant, room, status, ttl, address = sys.argv[1:8]
store = StatusStore.from_url(
    url, namespace=namespace, participant=participant, lease_ttl=float(ttl), address=address or None
)
if status == "-":
    store.acquire_lease()  # holds its lease, writes nothing to the room
else:
    store.update_status(int(room), KVPoll.Bootstrapping)
    store.update_status(int(room), KVPoll(int(status)))
print("ready", flush=True)
time.sleep(3600)
"""

_CANCEL = """
import sys
from kvstatus import StatusStore
url, namespace, room = sys.argv[1:4]
store = StatusStore.from_url(url, namespace=namespace, participant="router-0")
print("ready", flush=True)
sys.stdin.readline()
store.cancel(int(room), "the client went away")
"""


class Trial(NamedTuple):
    """One trial: seconds until the survivor's poll answered Failed (None: it never did, within 60 s; for
    ``pause``, None is the right answer), and the cause the survivor saw ("-": no failure recorded)."""

    fault: str
    seconds: Optional[float]
    cause: str


def _until_failed(store: StatusStore, room: int, started: float) -> Optional[float]:
    while time.monotonic() - started < LIMIT_SECONDS:
        if store.get(room) is KVPoll.Failed:
            return time.monotonic() - started
        time.sleep(POLL_SECONDS)
    return None


def run_trial(url: str, namespace: str, room: int, fault: str, lease_ttl: float) -> Trial:
    """Run one trial of ``fault`` (one of :data:`FAULTS`) in ``namespace`` (fresh: the names repeat)."""
    survivor_name, peer_name = ("prefill-0", "decode-0") if fault == "kill-decode" else ("decode-0", "prefill-0")
    own, theirs = KVPoll.WaitingForInput, KVPoll.Transferring
    if fault == "kill-decode":
        own, theirs = theirs, own
    unwritten = fault == "kill-unwritten"
    done = fault.endswith("-done")
    if done:
        theirs = KVPoll.Success
    survivor = StatusStore.from_url(
        url, namespace=namespace, participant=survivor_name, lease_ttl=lease_ttl, near_cache=fault == "cancel-near"
    )
    children: list[Child] = []
    try:
        survivor.update_status(room, KVPoll.Bootstrapping)
        if unwritten or done:
            survivor.awaits(room, PEER_ADDRESS)
        if not unwritten:
            survivor.update_status(room, own)
        args = (url, namespace, peer_name, str(room))
        peer = Child(_PEER, *args, "-" if unwritten else str(int(theirs)), str(lease_ttl), PEER_ADDRESS)
        children.append(peer)
        time.sleep(1.2)  # the survivor's watch has seen the peer's lease
        seconds: Optional[float]
        if fault.startswith("kill"):
            started = time.monotonic()
            peer.signal(signal.SIGKILL)
            seconds = _until_failed(survivor, room, started)
        elif fault.startswith("restart"):
            peer.stop()
            # The new process knows none of the old rooms (its dict is empty): it opens a room of its own.
            fresh = (url, namespace, peer_name, str(room + 1), str(int(KVPoll.Bootstrapping)), str(lease_ttl))
            children.append(Child(_PEER, *fresh, PEER_ADDRESS if done else ""))
            seconds = _until_failed(survivor, room, time.monotonic())
        elif fault.startswith("cancel"):
            survivor.get(room)  # a near cache holds the room from here on
            canceller = Child(_CANCEL, url, namespace, str(room))
            children.append(canceller)
            started = time.monotonic()
            canceller.go()
            seconds = _until_failed(survivor, room, started)
        else:
            peer.signal(signal.SIGSTOP)
            time.sleep(lease_ttl * 2 / 3)
            peer.signal(signal.SIGCONT)
            time.sleep(1.5)  # two looks of the survivor's watch after the pause
            seconds = 0.0 if survivor.get(room) is KVPoll.Failed else None
        failure = survivor.failure(room)
        return Trial(fault, seconds, "-" if failure is None else failure.describe())
    finally:
        for child in children:
            child.stop()
        survivor.clear(room)
        survivor.close()
