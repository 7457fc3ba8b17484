"""What a store tells an observer (library metrics), as a Protocol: the core imports no metrics library.

A store built with ``metrics=observer`` calls it from its send loop, and its
near cache (if on) calls the cache hooks. :class:`kvstatus.observe.metrics.StoreMetrics`
is the Prometheus observer (``kvstatus[metrics]`` extra); any object with
these methods works. With ``metrics=None`` (the default) a store call pays one
attribute check.

One hook is optional, and so not in :data:`HOOKS`: ``on_cleared(steps)``
(:class:`ClearedObserver`). When a store's ``clear`` or ``pop`` removes an
entry that carried a timeline (``timeline=True``), its send loop calls it with
that timeline if the observer has it; an observer without it (written before
timelines existed) is accepted and works as before. ``StoreMetrics`` turns it
into the stage-duration histogram.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Optional, Protocol, TypeGuard, runtime_checkable

from kvstatus.errors import InvalidArgumentError
from kvstatus.model import Step, UpdateResult


@runtime_checkable
class StoreObserver(Protocol):
    """The hooks a store calls. Every method must be cheap and must not raise."""

    def on_call(self, operation: str, seconds: float) -> None:
        """One store call sent to Redis took ``seconds`` (failed ones too); ``operation`` is the method's name."""

    def on_update(self, result: UpdateResult) -> None:
        """``update_status`` returned ``result``."""

    def on_updates(self, results: Iterable[UpdateResult]) -> None:
        """``update_many`` returned these results."""

    def on_error(self, exc: BaseException) -> None:
        """A store call sent to Redis raised ``exc`` to its caller (``check_status``'s KeyError is no error)."""

    def on_resend(self) -> None:
        """A store call was sent again: NOSCRIPT healed, or a resend while a failover moves the topology."""

    def on_cache_hit(self, count: int = 1) -> None:
        """``count`` room reads were answered by the near cache."""

    def on_cache_miss(self, count: int = 1) -> None:
        """``count`` rooms were read from Redis by the near cache."""

    def on_cache_invalidation(self, count: int = 1) -> None:
        """``count`` cached rooms were dropped by Redis invalidation messages (a null one drops every room)."""

    def set_cache_size(self, entries: int) -> None:
        """The near cache holds ``entries`` rooms now."""

    def for_participant(self, participant: Optional[str]) -> StoreObserver:
        """The observer of ``store.for_participant(participant)``."""


@runtime_checkable
class ClearedObserver(Protocol):
    """The optional hook: an observer that has it hears of each timeline a ``clear`` or ``pop`` removed."""

    def on_cleared(self, steps: tuple[Step, ...]) -> None:
        """``clear`` or ``pop`` removed an entry whose timeline was ``steps`` (never empty). Cheap, must not raise."""


HOOKS: tuple[str, ...] = (
    "on_call",
    "on_update",
    "on_updates",
    "on_error",
    "on_resend",
    "on_cache_hit",
    "on_cache_miss",
    "on_cache_invalidation",
    "set_cache_size",
    "for_participant",
)


def _missing_hooks(metrics: object) -> list[str]:
    """The hooks of :data:`HOOKS` that ``metrics`` lacks (or holds as something not callable)."""
    return [name for name in HOOKS if not callable(getattr(metrics, name, None))]


def _is_observer(metrics: object) -> TypeGuard[StoreObserver]:
    """Whether ``metrics`` has every hook of :data:`HOOKS` (the whole :class:`StoreObserver` protocol)."""
    return not _missing_hooks(metrics)


def check_observer(metrics: object) -> Optional[StoreObserver]:
    """``metrics`` if it is None or has every hook; raise :class:`InvalidArgumentError` naming what it lacks."""
    if metrics is None or _is_observer(metrics):
        return metrics
    raise InvalidArgumentError(
        f"invalid metrics {type(metrics).__name__}: an observer needs the methods {', '.join(_missing_hooks(metrics))} "
        "(kvstatus.observe.metrics.StoreMetrics is one)"
    )
