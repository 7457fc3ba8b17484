"""The rooms a RoomStatusMap failed on its own (issue 36, Low): none is forgotten while the engine has not removed
it, and the rooms of one outage share its reason, so the memory the module claims is what they take."""

from __future__ import annotations

import tracemalloc

from kvstatus.errors import BackendUnavailableError
from kvstatus.sglang.outage import FailedHere, Outage

ROOMS = 65_536


def test_no_room_is_forgotten_before_the_engine_removes_it() -> None:
    kept = FailedHere()
    for room in range(ROOMS + 4_464):  # past the old limit of 65,536
        kept.add(room, "down")
    assert kept.reason(0) == "down" and kept.reason(ROOMS + 4_463) == "down"
    kept.discard(0)
    assert kept.reason(0) is None and len(kept.rooms) == ROOMS + 4_463


def test_the_rooms_of_one_outage_take_about_a_hundred_bytes_each() -> None:
    outage = Outage("decode-tp0-pp0", seconds=3600.0)
    outage.failed(BackendUnavailableError("Redis unavailable: Timeout reading from socket " + "x" * 200))
    kept = FailedHere()
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        for room in range(10**12, 10**12 + ROOMS):  # room ids as SGLang draws them: large ints
            reason = outage.reason()
            assert reason is not None
            kept.add(room, reason)
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    grown = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    per_room = grown / ROOMS
    print(f"failed-here: {grown / 2**20:.1f} MiB for {ROOMS} rooms, {per_room:.0f} B a room")
    assert per_room < 150, per_room
