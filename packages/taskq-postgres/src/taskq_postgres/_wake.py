"""Coalescing the wake NOTIFYs one backend sends for its enqueues.

Every transaction that notifies takes one cluster-wide lock at commit, so a
process running many enqueues at once would serialize their commits on it for
wakes the workers do not need one by one. An enqueue that starts while none
of the backend's other enqueues runs notifies as usual; so does the first one
of a window (``window`` seconds from the last that notified). The enqueues
that start inside a window while another runs skip their NOTIFY, and when the
window ends one trailing NOTIFY covers them all. An isolated enqueue, or a
loop of one enqueue after another, therefore wakes the workers exactly as
soon as without coalescing and arms no timer: on a virtual machine a timer
armed and cancelled per window cost a one-at-a-time producer more CPU than
the NOTIFY in each of its statements costs the server, and its commits never
contend with each other for the lock.

No wake is lost: the trailing NOTIFY is sent only for skipped enqueues that
have finished (so committed), on a statement started after that, so a worker
it wakes sees their jobs. A skipped enqueue still running when a window
closes owes its own trailing NOTIFY, in the next window. While one runs, the
trailing NOTIFY for those finished waits one more window at most, as the
next window's first enqueue, whose NOTIFY covers them all, may come first.
Only enqueues whose commit the backend sees take part (its own statements and
transactions); one inside a caller's transaction notifies in that
transaction, as before.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import structlog

__all__ = ["EnqueueWake", "WakeCoalescer"]

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
        self._running = 0
        """Enqueues between :meth:`around` and their end, skipped or not."""
        self._skipped_running = 0
        # A timer for the current window, not a task sleeping it out: a task per
        # window cost more loop turns than the NOTIFYs it saved.
        self._window_end: asyncio.TimerHandle | None = None
        self._extended = False
        self._sending: set[asyncio.Task[None]] = set()

    def around(self, channel: str) -> EnqueueWake:
        """Around one enqueue whose commit the backend awaits: yields the channel its
        statement notifies, or None when a trailing NOTIFY is to cover it."""
        owed = self._owed
        claimed = self._claim()
        self._running += 1
        if claimed:
            return EnqueueWake(self, channel, took_over=owed)
        self._skipped_running += 1
        return EnqueueWake(self, None, took_over=False)

    def _skipped_finished(self) -> None:
        # Failed or not: a failed skipped enqueue may have committed all the same,
        # with only the reply lost.
        self._skipped_running -= 1
        self.owe()

    def _claim(self) -> bool:
        now = time.monotonic()
        if self._running and now < self._quiet_until:
            return False
        self._quiet_until = now + self._window
        # This enqueue's NOTIFY commits after every skipped enqueue that has
        # finished so far: it covers them, and the last window's timer is moot.
        self._owed = False
        self._stop_timer()
        return True

    def _stop_timer(self) -> None:
        if self._window_end is not None:
            self._window_end.cancel()
            self._window_end = None
        self._extended = False

    def owe(self) -> None:
        """A trailing NOTIFY is owed (a skipped enqueue finished): send it at the window's end."""
        self._owed = True
        if self._window_end is None:
            # A claim cannot move the window's end while it lasts: one timer will do.
            self._start_timer(max(self._quiet_until - time.monotonic(), 0.0))

    def _start_timer(self, delay: float) -> None:
        loop = asyncio.get_running_loop()
        self._window_end = loop.call_later(delay, self._at_window_end)

    def _at_window_end(self) -> None:
        self._window_end = None
        if not self._owed:
            return
        if self._skipped_running and not self._extended:
            # One enqueue follows another: the one still running is about to
            # finish, and the next one will lead a window of its own, its NOTIFY
            # covering them all. Wait one more window for that, no longer.
            self._extended = True
            self._start_timer(self._window)
            return
        self._extended = False
        self._owed = False
        # The trailing NOTIFY opens a window of its own: under a steady stream of
        # concurrent enqueues, about one NOTIFY per window goes out.
        self._quiet_until = time.monotonic() + self._window
        task = asyncio.get_running_loop().create_task(self._notify(), name="taskq-wake-flush")
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _notify(self) -> None:
        try:
            await self._send()
        except Exception as exc:  # noqa: BLE001 - workers fall back to polling
            _log.warning("taskq.wake-flush-failed", error=repr(exc))

    async def close(self) -> None:
        """Send an owed wake now rather than at the window's end (before the pool closes)."""
        self._stop_timer()
        if self._sending:
            await asyncio.wait(list(self._sending))
        if self._owed:
            self._owed = False
            await self._notify()


class EnqueueWake:
    """Around one enqueue: a class of its own rather than a generator, as one-at-a-time
    enqueues pay for every object and frame around their statement."""

    __slots__ = ("_channel", "_took_over", "_wakes")

    def __init__(self, wakes: WakeCoalescer, channel: str | None, *, took_over: bool) -> None:
        self._wakes = wakes
        self._channel = channel  # None: skipped, a trailing NOTIFY covers it
        self._took_over = took_over

    def __enter__(self) -> str | None:
        return self._channel

    def notified_nothing(self) -> None:
        """The statement inserted nothing (known keys only), so it notified nothing: the
        trailing NOTIFY its claim took over from earlier skipped enqueues is owed again."""
        if self._channel is not None and self._took_over:
            self._wakes.owe()

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        self._wakes._running -= 1
        if self._channel is None:
            self._wakes._skipped_finished()
        elif kind is not None:
            # A failed leading enqueue sent no NOTIFY, yet its claim cleared what was owed.
            self._wakes.owe()
