"""Control-flow signals an actor raises to steer its own job.

They derive from :class:`TaskQSignal`, not from ``TaskQError``, so a user's
``except TaskQError`` (or a broad handler around library calls) never
swallows them by accident. Delays are durations; the backend turns them
into times with its own clock.

Raised inside an exception group (an ``asyncio.TaskGroup`` whose children
raised them, or an ``ExceptionGroup`` of the actor's own, nested or not),
they still steer the job when every leaf of the group is one of them:

* all ``Snooze``: the job snoozes by the longest delay;
* ``RetryAfter`` alone, or with ``Snooze``: it retries after the longest delay
  of all (an attempt is spent, as one part of the work asked for a retry, and
  it comes back no sooner than every part asked);
* any other error among them: the attempt fails as any error does, recorded
  with the group's own class (``ExceptionGroup``), its traceback naming each.
"""

from __future__ import annotations

from collections.abc import Iterator
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
    applies: a snooze past it fails the job. In an exception group of nothing
    but snoozes (a ``TaskGroup``'s), the job snoozes by the longest delay.
    """

    def __init__(self, delay: timedelta | float) -> None:
        self.delay = _as_delay(delay)
        super().__init__(f"snooze for {self.delay}")


class RetryAfter(TaskQSignal):
    """Retry this job after ``delay`` (for example an upstream's Retry-After).

    Effect: uses an attempt, like an error would, but with this exact delay
    instead of the actor's backoff. When no attempts are left the job fails
    (``MaxAttemptsExceeded``); past the deadline it fails (``DeadlineExceeded``).
    In an exception group of nothing but ``RetryAfter`` and ``Snooze`` (a
    ``TaskGroup``'s), the job retries after the longest delay of them all.
    """

    def __init__(self, delay: timedelta | float) -> None:
        self.delay = _as_delay(delay)
        super().__init__(f"retry after {self.delay}")


def signal_of_group(raised: BaseException) -> Snooze | RetryAfter | None:
    """The signal an exception group amounts to (see this module's docstring), or None
    when ``raised`` is no group or holds an error that is no signal."""
    if not isinstance(raised, BaseExceptionGroup):
        return None
    leaves = list(_leaves(raised))
    signals = [leaf for leaf in leaves if isinstance(leaf, Snooze | RetryAfter)]
    if len(signals) != len(leaves):
        return None
    delay = max(signal.delay for signal in signals)
    kind = RetryAfter if any(isinstance(signal, RetryAfter) for signal in signals) else Snooze
    asked = kind(delay)
    asked.__cause__ = raised
    return asked


def _leaves(group: BaseExceptionGroup[BaseException]) -> Iterator[BaseException]:
    for inner in group.exceptions:
        if isinstance(inner, BaseExceptionGroup):
            yield from _leaves(inner)
        else:
            yield inner
