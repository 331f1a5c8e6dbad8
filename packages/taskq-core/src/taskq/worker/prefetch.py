"""How many jobs a worker locks ahead of the ones its consumers run (``prefetch``).

A fixed number, or ``auto`` (the default): as many as the worker expects to
start within ``prefetch_horizon``, judged from how long its consumers held
their recent jobs and how long the running ones have run so far, at most
``MAX_AHEAD_PER_CONSUMER`` times ``concurrency`` (and ``MAX_PREFETCH``). Short jobs
then have their next dispatch in flight (and dispatched in bigger batches) while the
current ones run: one worker drains no-op jobs about twice as fast (bench/README.md,
run AV). Long jobs get none locked ahead, so that a job does not wait here behind
running ones, while another worker may be idle, for much longer than the horizon;
and when running jobs turn long while jobs are locked ahead, those that have waited
ten horizons are handed back, unstarted, for any worker to take.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Final

from taskq.settings import MAX_PREFETCH

__all__ = ["MAX_AHEAD_PER_CONSUMER", "STALE_AFTER_HORIZONS", "Prefetch"]

MAX_AHEAD_PER_CONSUMER: Final = 32
"""``auto`` locks at most this many jobs ahead per consumer; only jobs shorter than
``horizon / 32`` (0.6 ms by default) reach it. While both cores are busy a
dispatch's round trip stretches over several scheduler time slices, and the jobs
locked ahead must last that long: two workers at concurrency 16 drained no-op jobs
at about 11,900 jobs/s with 64 ahead each, 13,300-15,000 with 256, 15,300-16,000
with 512 and no faster with 1,024 (bench/README.md, run AV); at concurrency 64,
256 to 1,024 ahead came out even."""

STALE_AFTER_HORIZONS: Final = 10
"""With ``auto``, a job locked ahead that has waited here this many horizons (the
consumers turned out busy with long jobs) is handed back, unstarted, for any worker."""

_WEIGHT: Final = 0.2
"""The weight of each newly held time in the running average (a change of job
length shows within a few dozen jobs)."""


class Prefetch:
    """The number of jobs to lock beyond ``concurrency``: ``fixed``, or (``fixed`` None)
    ``auto``'s estimate over ``horizon`` seconds."""

    __slots__ = ("_cap", "_concurrency", "_fixed", "_held", "_horizon")

    def __init__(self, concurrency: int, fixed: int | None, horizon: float) -> None:
        self._concurrency = concurrency
        self._fixed = fixed
        self._horizon = horizon
        self._cap = min(MAX_AHEAD_PER_CONSUMER * concurrency, MAX_PREFETCH)
        self._held: float | None = None  # no job held yet: lock nothing ahead

    @property
    def adaptive(self) -> bool:
        """Whether the number follows the jobs (``auto``)."""
        return self._fixed is None

    @property
    def stale_after(self) -> float | None:
        """Seconds after which a job locked ahead and still waiting is handed back
        (``auto`` only; a fixed number's jobs wait their turn)."""
        return None if self._fixed is not None else STALE_AFTER_HORIZONS * self._horizon

    def held(self, seconds: float) -> None:
        """A consumer held a job ``seconds`` (from taking it to its actor's return)."""
        if self._fixed is not None:
            return
        last = self._held
        self._held = seconds if last is None else last + _WEIGHT * (seconds - last)

    def ahead(self, running_for: Sequence[float] = ()) -> int:
        """Jobs to lock ahead now; ``running_for``: how long each job a consumer runs has
        run so far (a lower bound on its length: jobs that turned long show at once,
        before the first of them ends)."""
        if self._fixed is not None:
            return self._fixed
        held = self._held
        if held is None or self._horizon <= 0.0:
            # A horizon of 0 allows no wait, even behind jobs held no measurable time (a
            # coarse clock reads 0 for them), which would otherwise lock the cap ahead.
            return 0
        if running_for:
            held = max(held, sum(running_for) / len(running_for))
        if held <= 0.0:
            return self._cap
        # Consumers free up about concurrency / held times a second.
        expected = self._concurrency * self._horizon / held
        return self._cap if expected >= self._cap else math.floor(expected)
