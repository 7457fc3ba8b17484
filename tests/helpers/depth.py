"""How hard a property test searches: a quick pass in ``./dev test``, the full search in the slow run.

A test takes the ``deep`` parameter from :data:`DEPTHS` and sizes its search with
:func:`examples`: the ``quick`` case runs in the default run, the ``deep`` one is
marked ``slow`` (``./dev test-slow``, which CI runs too). Both assert the same things.
"""

from __future__ import annotations

import pytest

QUICK_SHARE = 4
"""The quick case runs 1/QUICK_SHARE of the full example count."""

DEPTHS = pytest.mark.parametrize("deep", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["quick", "deep"])


def examples(deep: bool, full: int) -> int:
    """Hypothesis ``max_examples``: ``full`` for the deep case, a quarter of it (at least 5) for the quick one."""
    return full if deep else max(5, full // QUICK_SHARE)
