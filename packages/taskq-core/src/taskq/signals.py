"""Control-flow signals an actor raises to steer its own job.

They derive from :class:`TaskQSignal`, not from ``TaskQError``, so a user's
``except TaskQError`` (or a broad handler around library calls) never
swallows them by accident. Delays are durations; the backend turns them
into times with its own clock.
"""

from __future__ import annotations

from datetime import timedelta

from taskq.models import MAX_DURATION

__all__ = ["RetryAfter", "Snooze", "TaskQSignal"]


def _as_delay(delay: timedelta | float) -> timedelta:
    if isinstance(delay, bool) or not isinstance(delay, timedelta | int | float):
        raise TypeError(
            f"delay must be a timedelta or a number of seconds, not {type(delay).__name__}"
        )
    try:
        value = delay if isinstance(delay, timedelta) else timedelta(seconds=delay)
    except (OverflowError, ValueError) as exc:  # a NaN, or seconds past timedelta's range
        raise ValueError(f"delay must be a duration of at most a century, got {delay!r}") from exc
    if not timedelta(0) <= value <= MAX_DURATION:
        raise ValueError(
            f"delay must be between 0 and {MAX_DURATION.days} days, got {value.total_seconds():g} s"
        )
    return value


class TaskQSignal(Exception):
    """Base of the signals an actor raises to reschedule its own job."""


class Snooze(TaskQSignal):
    """Run this job again after ``delay`` without using an attempt.

    Effect: the job goes back to ``scheduled`` (``pending`` for a zero delay);
    its ``attempt`` counter still advances but ``max_attempts`` grows by one,
    so the retry budget is untouched. The ``schedule_to_close`` deadline still
    applies: a snooze past it fails the job.
    """

    def __init__(self, delay: timedelta | float) -> None:
        self.delay = _as_delay(delay)
        super().__init__(f"snooze for {self.delay}")


class RetryAfter(TaskQSignal):
    """Retry this job after ``delay`` (for example an upstream's Retry-After).

    Effect: uses an attempt, like an error would, but with this exact delay
    instead of the actor's backoff. When no attempts are left the job fails
    (``MaxAttemptsExceeded``); past the deadline it fails (``DeadlineExceeded``).
    """

    def __init__(self, delay: timedelta | float) -> None:
        self.delay = _as_delay(delay)
        super().__init__(f"retry after {self.delay}")
