"""Coalescing the wake NOTIFYs one backend sends for its enqueues.

Every transaction that notifies takes one cluster-wide lock at commit, so a
process enqueueing in bursts would serialize its commits on it for wakes the
workers do not need one by one. The first enqueue notifies as usual and opens
a window; the enqueues that start inside it skip their NOTIFY, and when the
window ends one trailing NOTIFY covers them all. An isolated enqueue therefore
wakes the workers exactly as soon as before, and a burst costs about one
NOTIFY per window.

No wake is lost: the trailing NOTIFY is sent only for skipped enqueues that
have finished (so committed), on a statement started after that, so a worker
it wakes sees their jobs. A skipped enqueue still running when a window
closes owes its own trailing NOTIFY, in the next window. Only enqueues whose
commit the backend sees take part (its own statements and transactions); one
inside a caller's transaction notifies in that transaction, as before.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager

import structlog

__all__ = ["WakeCoalescer"]

_log = structlog.get_logger("taskq.notify")


class WakeCoalescer:
    """Decides which enqueue notifies; sends the trailing NOTIFYs.

    ``send`` issues one NOTIFY on its own statement; ``window`` is in seconds
    (0 turns coalescing off: every enqueue notifies).
    """

    def __init__(self, send: Callable[[], Awaitable[object]], window: float) -> None:
        self._send = send
        self._window = window
        self._quiet_until = float("-inf")
        self._owed = False
        self._flusher: asyncio.Task[None] | None = None
        self._waiting = False  # the flusher is sleeping out the window (not yet sending)

    @contextmanager
    def around(self, channel: str) -> Iterator[str | None]:
        """Around one enqueue whose commit the backend awaits: yields the channel its
        statement notifies, or None when a trailing NOTIFY is to cover it."""
        leading = self._claim()
        try:
            yield channel if leading else None
        except BaseException:
            # A failed leading enqueue sent no NOTIFY, yet its claim cleared what
            # was owed; a failed skipped one may have committed all the same.
            self.owe()
            raise
        if not leading:
            self.owe()

    def _claim(self) -> bool:
        now = time.monotonic()
        if now < self._quiet_until:
            return False
        self._quiet_until = now + self._window
        # This enqueue's NOTIFY commits after every skipped enqueue that has
        # finished so far: it covers them.
        self._owed = False
        return True

    def owe(self) -> None:
        """A trailing NOTIFY is owed (a skipped enqueue finished): send it at the window's end."""
        self._owed = True
        if not self._waiting:
            self._waiting = True
            self._flusher = asyncio.get_running_loop().create_task(
                self._flush_at_window_end(), name="taskq-wake-flush"
            )

    async def _flush_at_window_end(self) -> None:
        try:
            # A claim cannot move the window's end while it lasts: one sleep will do.
            await asyncio.sleep(max(self._quiet_until - time.monotonic(), 0.0))
        finally:
            # From here on, a newly skipped enqueue needs a flusher of its own: this
            # one's NOTIFY may commit before that enqueue does.
            self._waiting = False
        await self._flush()

    async def _flush(self) -> None:
        if not self._owed:
            return  # a leading enqueue's NOTIFY covered the skipped ones
        self._owed = False
        # The trailing NOTIFY opens a window of its own: under a steady stream of
        # enqueues, about one NOTIFY per window goes out.
        self._quiet_until = time.monotonic() + self._window
        try:
            await self._send()
        except Exception as exc:  # noqa: BLE001 - workers fall back to polling
            _log.warning("taskq.wake-flush-failed", error=repr(exc))

    async def close(self) -> None:
        """Send an owed wake now rather than at the window's end (before the pool closes)."""
        flusher = self._flusher
        if flusher is not None:
            if self._waiting:
                flusher.cancel()
            await asyncio.wait([flusher])
            self._waiting = False  # a flusher cancelled before it ran did not clear it
        await self._flush()
