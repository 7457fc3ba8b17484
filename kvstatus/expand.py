"""``python -m kvstatus.expand NAME``: a script of ``lua/`` as Redis runs it, its ``lua/lib/`` includes spliced in.

The scripts keep shared helpers in ``lua/lib/`` (``-- @include NAME`` lines, see
:mod:`kvstatus.scripts`), so a file of ``lua/`` alone is not the whole script.
This prints the whole text, whose SHA1 is the one stores send, for example::

    python -m kvstatus.expand get_many > get_many.lua
    redis-cli --eval get_many.lua 'kvstatus:prod-a:{42}' , decode-0

``--library`` prints the function library (what ``kvstatus functions load``
loads) and ``--list`` each script's name, SHA1 and whether it writes.
(A module of its own, not ``python -m kvstatus.scripts``: the package imports
that one, and runpy warns when a module it runs is already imported.)
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from kvstatus import scripts


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Print what ``argv`` asks for to stdout; a script name that does not exist exits 2 with the known names."""
    parser = argparse.ArgumentParser(
        prog="python -m kvstatus.expand",
        description="Print kvstatus' Lua as Redis runs it: a script with its lua/lib/ includes spliced in "
        "(for redis-cli --eval FILE KEY ... , ARG ...), or the function library (for FUNCTION LOAD).",
    )
    parser.add_argument("name", nargs="?", metavar="NAME", help=f"a script: {', '.join(scripts.BY_NAME)}")
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--library", action="store_true", help="the function library of every script")
    what.add_argument("--list", action="store_true", help="each script's name, SHA1 and read-only flag")
    args = parser.parse_args(argv)
    if (args.name is None) == (not args.library and not args.list):
        parser.error("give one script NAME, or --library, or --list")
    if args.library:
        sys.stdout.write(scripts.LIBRARY)
    elif args.list:
        for script in scripts.ALL:
            sys.stdout.write(f"{script.name}\t{script.sha}\t{'read-only' if script.read_only else 'writes'}\n")
    else:
        name = args.name.removesuffix(".lua")
        if name not in scripts.BY_NAME:
            parser.error(f"no script {args.name!r}: expected one of {', '.join(scripts.BY_NAME)}")
        sys.stdout.write(scripts.BY_NAME[name].source)
    return 0


if __name__ == "__main__":
    sys.exit(main())
