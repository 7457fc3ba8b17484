"""What a timeline costs inside Redis, per phase of a room (issue 20 item 1).

``python -m benchmarks.timeline [--rounds 41] [--calls 4000]`` starts its own redis-server and runs
lua/update.lua and lua/clear.lua as a store with a lease sends them, with and without the timeline field,
in interleaved rounds. Each round pipelines ``--calls`` calls of one phase on fresh rooms and reads
Redis' own time for them from INFO commandstats, so the client and the loopback do not count. Prints
µs per call (median over rounds) and the ratio, per phase:

- CREATED      a new entry (Bootstrapping): the timeline's first step, one TIME;
- ADVANCED     an entry moving on (Bootstrapping -> WaitingForInput): the step appended;
- UNCHANGED    the same status again: no step, but the timeline is read with the entry;
- clear        the entry removed with its timeline, which the script returns.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable
from typing import Any

from benchmarks.ownserver import redis_usec, run_on_own_server
from benchmarks.report import markdown_table
from kvstatus import scripts

PARTICIPANT = "decode-tp0-pp0"
TTL_MS = "600000"
EPOCH = "1764680000123"
PHASES = ("CREATED", "ADVANCED", "UNCHANGED", "clear")


def _update(sha: str, timeline: bool, status: str) -> Callable[[Any, str], None]:
    head = ("seed", TTL_MS, PARTICIPANT, f"reason:{PARTICIPANT}", f"inc:{PARTICIPANT}", EPOCH)
    field = f"t:{PARTICIPANT}" if timeline else ""
    return lambda pipe, key: pipe.execute_command("EVALSHA", sha, 1, key, *head, field, status)


def _clear(pipe: Any, key: str) -> None:
    args = (PARTICIPANT, f"reason:{PARTICIPANT}", f"late:{PARTICIPANT}", "60000", f"inc:{PARTICIPANT}", EPOCH)
    pipe.execute_command("EVALSHA", scripts.CLEAR.sha, 2, key, key + ":t", *args, f"t:{PARTICIPANT}")


def measure(client: Any, rounds: int, calls: int) -> dict[tuple[str, bool], float]:
    """Median µs of Redis time per call, per (phase, timeline on)."""
    sha = client.script_load(scripts.UPDATE.source)
    client.script_load(scripts.CLEAR.source)
    per_call: dict[tuple[str, bool], list[float]] = {}
    next_room = iter(range(10**12))
    for _ in range(rounds):
        for timeline in (False, True):
            keys = [f"kvstatus:bench:{{{next(next_room)}}}" for _ in range(calls)]
            steps = {
                "CREATED": _update(sha, timeline, "1"),
                "ADVANCED": _update(sha, timeline, "2"),
                "UNCHANGED": _update(sha, timeline, "2"),
                "clear": _clear,
            }
            for phase in PHASES:
                with client.pipeline(transaction=False) as pipe:
                    for key in keys:
                        steps[phase](pipe, key)
                    before = redis_usec(client, "evalsha")
                    pipe.execute()
                    per_call.setdefault((phase, timeline), []).append((redis_usec(client, "evalsha") - before) / calls)
    return {case: statistics.median(values) for case, values in per_call.items()}


def main(argv: list[str]) -> int:
    args, result = run_on_own_server(argv, __doc__.split("\n\n")[0], 41, measure)
    rows = []
    for phase in PHASES:
        off, on = result[phase, False], result[phase, True]
        rows.append([phase, f"{off:.2f}", f"{on:.2f}", f"{on - off:+.2f}", f"{on / off:.2f}×"])
    print(f"Redis time per call (µs, median of {args.rounds} rounds of {args.calls} pipelined calls), fenced:")
    print(markdown_table(["phase", "without timeline", "with timeline", "difference", "ratio"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
