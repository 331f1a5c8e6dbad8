"""Retry policy: the backoff before the next attempt of a job whose actor raised.

Every exception an actor raises (other than ``Snooze`` and ``RetryAfter``, alone or
in an exception group of nothing but them: see :mod:`taskq.signals`) is retried,
as API.md says: an error that looks permanent (a ``ValueError``, a
pydantic ``ValidationError`` of a reply the actor parsed) may come from
something outside the job that changes. :class:`RetryPolicy` gives the delay
only. It takes no clock and no deadline: the backend decides whether the retry
still fits the ``schedule_to_close`` deadline and the attempt budget, from its
own clock, in the same statement that writes the outcome (one arbiter per
predicate).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol

from taskq.models import MAX_DURATION

__all__ = [
    "Backoff",
    "ExponentialBackoff",
    "FixedBackoff",
    "RetryPolicy",
]


class Backoff(Protocol):
    """Delay before the retry that follows failed attempt number ``attempt`` (1-based):
    a ``timedelta``, or a number of seconds."""

    def __call__(self, attempt: int) -> timedelta | float: ...


def _duration(value: object, what: str) -> timedelta:
    """``value`` as a timedelta: one as it is, a number as seconds; else ``TypeError``."""
    if isinstance(value, timedelta):
        return value
    # An int is finite however large (math.isfinite raised past a float's range).
    if (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and (isinstance(value, int) or math.isfinite(value))
    ):
        return timedelta(seconds=min(value, MAX_DURATION.total_seconds()))
    raise TypeError(f"{what} must be a timedelta or a number of seconds, not {value!r}")


@dataclass(frozen=True)
class ExponentialBackoff:
    """``base * factor ** (attempt - 1)``, capped at ``maximum``, with +/- ``jitter``.

    Jitter spreads retries of jobs that failed together (a flapping upstream)
    so they do not come back as one thundering herd.
    """

    base: timedelta = timedelta(seconds=1)
    factor: float = 2.0
    maximum: timedelta = timedelta(hours=1)
    jitter: float = 0.1

    def __post_init__(self) -> None:
        for name in ("base", "maximum"):
            object.__setattr__(self, name, _duration(getattr(self, name), f"{name}"))
        # Written so that a NaN fails each test.
        if not (
            self.base >= timedelta(0)
            and math.isfinite(self.factor)
            and self.factor >= 1
            and self.maximum >= self.base
            and 0 <= self.jitter < 1
        ):
            raise ValueError(
                "ExponentialBackoff needs base >= 0, a finite factor >= 1, maximum >= base "
                "and 0 <= jitter < 1"
            )

    def __call__(self, attempt: int) -> timedelta:
        # No job is put off by more than a century: a cap past it (``timedelta.max``
        # for no cap) gave, in float seconds, a delay past timedelta's own range.
        maximum = min(self.maximum, MAX_DURATION).total_seconds()
        try:
            raw = self.base.total_seconds() * self.factor ** max(attempt - 1, 0)
        except OverflowError:  # a high attempt number (snoozes count too)
            raw = maximum
        capped = min(raw, maximum)
        spread = capped * self.jitter
        return timedelta(seconds=min(max(capped + random.uniform(-spread, spread), 0.0), maximum))


@dataclass(frozen=True)
class FixedBackoff:
    """The same delay before every retry."""

    delay: timedelta = timedelta(seconds=5)

    def __post_init__(self) -> None:
        object.__setattr__(self, "delay", _duration(self.delay, "FixedBackoff delay"))

    def __call__(self, attempt: int) -> timedelta:
        return self.delay


class RetryPolicy:
    """The delay before retrying a job whose actor raised. Itself a backoff (an actor's
    ``retry_backoff`` may be one)."""

    def __init__(self, backoff: Backoff | Callable[[int], timedelta | float] | None = None) -> None:
        self._backoff = backoff if backoff is not None else ExponentialBackoff()

    def delay(self, attempt: int) -> timedelta:
        """The backoff after the failure of attempt ``attempt`` (1-based), kept between 0
        and :data:`~taskq.models.MAX_DURATION` (a custom one may say anything; a job
        cannot be put off by more than a century); a number is seconds."""
        given = _duration(self._backoff(attempt), "a retry_backoff's delay")
        return min(max(given, timedelta(0)), MAX_DURATION)

    __call__ = delay
