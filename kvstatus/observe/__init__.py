"""Observing kvstatus from outside: Prometheus metrics of the library, the exporter, and the web board.

Each part needs an optional extra and is imported only on use:

- :mod:`kvstatus.observe.metrics`  library metrics (``kvstatus[metrics]``: prometheus_client)
- :mod:`kvstatus.observe.exporter`  ``kvstatus exporter`` (``kvstatus[metrics]``)
- :mod:`kvstatus.observe.board`  ``kvstatus serve``, the read-only web board (``kvstatus[web]``)
- :mod:`kvstatus.observe.scanner`  the bounded, incremental namespace pass both servers share, and the JSON of a
  room's first failure the CLI shares with the board (no extra)
"""
