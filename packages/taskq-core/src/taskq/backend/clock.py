"""Wall time for in-process backends: the only core module that reads it.

TaskQ keeps one arbiter per time predicate. On Postgres that arbiter is the
server clock (``clock_timestamp()`` inside the statement that owns the
predicate), and Python never compares times against rows. The in-memory
backend is a single process, so its arbiter is the :class:`Clock` it was
given — :class:`SystemClock` in production code, :class:`FakeClock` in tests
that need to let time pass without sleeping. Lint (ruff ``TID251``) bans
``datetime.now`` and ``time.time`` everywhere else.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Protocol, runtime_checkable

__all__ = ["Clock", "FakeClock", "SystemClock"]


@runtime_checkable
class Clock(Protocol):
    """A source of timezone-aware UTC wall time."""

    def now(self) -> datetime:
        """The current time (UTC, timezone-aware)."""
        ...


class SystemClock:
    """The process's wall clock."""

    def now(self) -> datetime:
        return datetime.now(UTC)


class FakeClock:
    """A clock that moves only when told to; for deterministic tests."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start if start is not None else datetime(2030, 1, 1, tzinfo=UTC)
        if self._now.tzinfo is None:
            raise ValueError("FakeClock needs a timezone-aware start time")

    def now(self) -> datetime:
        return self._now

    def advance(self, delta: timedelta | float) -> datetime:
        """Move time forward by ``delta`` (seconds or a timedelta); returns the new now."""
        step = delta if isinstance(delta, timedelta) else timedelta(seconds=delta)
        if step < timedelta(0):
            raise ValueError("time only moves forward")
        self._now += step
        return self._now

    def set(self, when: datetime) -> None:
        """Jump to ``when`` (must not be in the past)."""
        if when < self._now:
            raise ValueError("time only moves forward")
        self._now = when
