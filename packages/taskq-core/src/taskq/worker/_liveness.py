"""``LoopLiveness``: when each interval-driven worker loop last ticked.

Interval-driven loops call :meth:`LoopLiveness.tick` once per iteration
with their period; the stale-tick watchdog (detector 2) reads the ages from
its own task and the loop-lag watchdog (detector 4) from a daemon thread,
hence the lock. Gated loops call :meth:`forget` when their gate closes (a
follower's leader loops), so a loop that is legitimately parked never looks
stale; its next tick registers it again.
"""

from __future__ import annotations

import threading
import time

__all__ = ["LoopLiveness"]


class LoopLiveness:
    """Monotonic last-tick times and periods of the worker's periodic loops."""

    def __init__(self, grace_factor: float = 5.0, stale_floor: float = 10.0) -> None:
        self.grace_factor = grace_factor
        self.stale_floor = stale_floor
        self._lock = threading.Lock()
        self._ticks: dict[str, tuple[float, float]] = {}
        self.any_tick = threading.Event()
        """Set by the first tick: the loop-lag watchdog arms on it (or its grace)."""

    def tick(self, name: str, period: float) -> None:
        """Loop ``name`` finished an iteration; it runs every ``period`` seconds."""
        with self._lock:
            self._ticks[name] = (time.monotonic(), period)
        self.any_tick.set()

    def forget(self, name: str) -> None:
        """Stop tracking ``name`` (its gate closed); the next tick tracks it again."""
        with self._lock:
            self._ticks.pop(name, None)

    def excuse(self, seconds: float) -> None:
        """Do not count ``seconds`` the event loop itself stood still against any loop:
        none could tick meanwhile, and a paused loop is detector 4's to judge."""
        now = time.monotonic()
        with self._lock:
            self._ticks = {
                name: (min(at + seconds, now), period) for name, (at, period) in self._ticks.items()
            }

    def budget(self, period: float) -> float:
        """Seconds a loop of ``period`` may go without ticking before it is stale."""
        return max(period * self.grace_factor, self.stale_floor)

    def ages(self) -> dict[str, float]:
        """Seconds since each tracked loop last ticked."""
        now = time.monotonic()
        with self._lock:
            return {name: now - at for name, (at, _) in self._ticks.items()}

    def stale(self) -> dict[str, float]:
        """Loops whose age exceeds their budget, with their ages."""
        now = time.monotonic()
        with self._lock:
            return {
                name: now - at
                for name, (at, period) in self._ticks.items()
                if now - at > self.budget(period)
            }
