"""The ``kvstatus`` command line: a thin click layer over the library (see ``kvstatus --help``)."""

from kvstatus.cli import cancel, demo, health, leases, namespace, observe, rooms  # noqa: F401  (registers the commands on main)
from kvstatus.cli.app import CliEnv, main

__all__ = ["CliEnv", "main"]
