"""What the function library's shared helpers cost per call (issue 34 item 5).

``python -m benchmarks.functions [--rounds 21] [--calls 4000]`` starts its own redis-server and sends
lua/update.lua's calls, as a store sends them, three ways in interleaved rounds:

- ``library``  FCALL of :data:`kvstatus.scripts.LIBRARY`, which defines the lua/lib/ helpers once, when the
               library loads;
- ``per call`` FCALL of the same scripts in a library built as before this change: each function's body is
               the spliced script, so it re-creates every helper it includes at each call;
- ``EVALSHA``  the spliced script, the default ``scripts="eval"``, which re-creates them too.

Each round pipelines ``--calls`` calls of one phase on fresh rooms and reads Redis' own time for them from
INFO commandstats, so the client and the loopback do not count. Prints µs per call (median over rounds) and
the ratios to ``per call`` and to ``EVALSHA``, per phase: CREATED (a new entry) and ADVANCED (it moves on),
with and without the timeline field the SGLang plugin writes.
"""

from __future__ import annotations

import statistics
import sys
from typing import Any

from benchmarks.ownserver import redis_usec, run_on_own_server
from benchmarks.report import markdown_table
from kvstatus import scripts

PARTICIPANT = "decode-tp0-pp0"
TTL_MS = "600000"
EPOCH = "1764680000123"
PHASES = (("CREATED", "1"), ("ADVANCED", "2"))
WAYS = ("library", "per call", "EVALSHA")
PER_CALL_NAME = "kvstatus_bench_per_call"


def per_call_library() -> str:
    """The library as built before the helpers moved to its top level: each function's body the spliced
    script (its shebang line dropped), registered under :data:`PER_CALL_NAME`."""
    parts = ["#!lua name=" + PER_CALL_NAME + "\n"]
    for script in scripts.ALL:
        first, _, rest = script.source.partition("\n")
        body = rest if first.startswith("#!") else script.source
        flags = ", flags={'no-writes'}" if script.read_only else ""
        parts += [
            "local function " + script.name + "(KEYS, ARGV)\n" + body + "\nend\n",
            "redis.register_function{function_name='"
            + PER_CALL_NAME
            + "_"
            + script.name
            + "', callback="
            + script.name
            + flags
            + "}\n",
        ]
    return "".join(parts)


def _command(way: str) -> tuple[str, str]:
    """The command and its first argument (function name or SHA) of an update sent ``way``."""
    if way == "library":
        return "FCALL", scripts.function_name(scripts.UPDATE)
    if way == "per call":
        return "FCALL", PER_CALL_NAME + "_update"
    return "EVALSHA", scripts.UPDATE.sha


def measure(client: Any, rounds: int, calls: int) -> dict[tuple[str, bool, str], float]:
    """Median µs of Redis time per update call, per (phase, timeline on, way)."""
    client.function_load(scripts.LIBRARY, replace=True)
    client.function_load(per_call_library(), replace=True)
    client.script_load(scripts.UPDATE.source)
    per_call: dict[tuple[str, bool, str], list[float]] = {}
    next_room = iter(range(10**12))
    for number in range(rounds):
        for timeline in (False, True):
            field = f"t:{PARTICIPANT}" if timeline else ""
            head = ("seed", TTL_MS, PARTICIPANT, f"reason:{PARTICIPANT}", f"inc:{PARTICIPANT}", EPOCH, field)
            for way in WAYS if number % 2 == 0 else tuple(reversed(WAYS)):
                command, target = _command(way)
                keys = [f"kvstatus:bench:{{{next(next_room)}}}" for _ in range(calls)]
                for phase, status in PHASES:
                    with client.pipeline(transaction=False) as pipe:
                        for key in keys:
                            pipe.execute_command(command, target, 1, key, *head, status)
                        before = redis_usec(client, command)
                        pipe.execute()
                        spent = redis_usec(client, command) - before
                    per_call.setdefault((phase, timeline, way), []).append(spent / calls)
    return {case: statistics.median(values) for case, values in per_call.items()}


def main(argv: list[str]) -> int:
    args, result = run_on_own_server(argv, __doc__.split("\n\n")[0], 21, measure)
    rows = []
    for phase, _ in PHASES:
        for timeline in (False, True):
            library, per_call, evalsha = (result[phase, timeline, way] for way in WAYS)
            rows.append(
                [phase, "on" if timeline else "off", f"{library:.2f}", f"{per_call:.2f}", f"{evalsha:.2f}"]
                + [f"{library / per_call:.2f}×", f"{library / evalsha:.2f}×"]
            )
    print(f"Redis time per update (µs, median of {args.rounds} rounds of {args.calls} pipelined calls), fenced:")
    header = ["phase", "timeline", "library", "per call", "EVALSHA", "library / per call", "library / EVALSHA"]
    print(markdown_table(header, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
