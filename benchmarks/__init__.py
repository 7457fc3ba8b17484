"""kvstatus benchmarks: each operation against the floor of its data model (not part of the test suite).

Run ``./dev bench`` (``--help`` for options). The run starts its own
redis-server processes, interleaves every variant with its baseline in one
run, and refreshes the results section of ``BENCHMARKS.md``.
"""
