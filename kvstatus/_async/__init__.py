"""The I/O of kvstatus, written once with awaits; kvstatus/_sync/ is generated from it (tools/unasync.py)."""
