"""The ``kvstatus`` command line: a thin click layer over the library (see ``kvstatus --help``)."""

# Importing the modules registers their commands on main.
from kvstatus.cli import demo, leases, namespace, observe, rooms, security  # noqa: F401
from kvstatus.cli.app import CliEnv, main

__all__ = ["CliEnv", "main"]
