"""Hang detection: four detectors that end a wedged worker with exit code 2.

A wedged process cannot be trusted to unwind, so a trip logs, dumps what it
can, flushes and calls ``os._exit(EXIT_WATCHDOG)`` with no further awaits;
the supervisor restarts the worker and its jobs come back through the
reclaim sweep once their leases expire.

1. :class:`ShutdownWatchdog` — a shutdown still running
   ``termination_grace_period`` after the first signal (a thread: it must
   fire even when the loop is wedged).
2. :func:`stale_tick_loop` — an interval-driven loop that has not ticked
   within its budget (``LoopLiveness``), checked from inside the TaskGroup.
3. :func:`guard_sibling` — a long-lived sibling returning while the worker
   is not shutting down.
4. :class:`LoopLagWatchdog` — the event loop not scheduling a beat within
   ``watchdog_loop_lag_budget`` (a daemon thread; dumps thread stacks with
   faulthandler because a blocked loop cannot list its tasks).
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import os
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, NoReturn

import structlog

from taskq.cli._exit_codes import EXIT_WATCHDOG
from taskq.errors import ContractViolation
from taskq.worker._liveness import LoopLiveness
from taskq.worker._stacks import dump_task_stacks

__all__ = [
    "LoopLagWatchdog",
    "ShutdownWatchdog",
    "guard_sibling",
    "stale_tick_loop",
    "trip",
]

_log = structlog.get_logger("taskq.watchdog")


def _exit(code: int) -> NoReturn:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError):  # gone (a closed pipe): the exit comes all the same
            if stream is not None:  # none at all (started with it closed, `>&-`): likewise
                stream.flush()
    os._exit(code)


def trip(detector: str, reason: str, *, in_loop: bool = True) -> NoReturn:
    """Log, dump stacks, flush and exit with :data:`EXIT_WATCHDOG`. Never returns."""
    # Nothing said on the way may stand before the exit, or the wedged worker runs on:
    # stderr gone (a log shipper's pipe closed) raised BrokenPipeError, and an
    # application's logging set-up (its handlers, its processors) may raise anything.
    with contextlib.suppress(Exception):
        _log.critical("taskq.watchdog-trip", detector=detector, reason=reason)
    if in_loop:
        with contextlib.suppress(Exception):
            dump_task_stacks(f"watchdog: {reason}", detector=detector)
    with contextlib.suppress(Exception):
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    _exit(EXIT_WATCHDOG)


class ShutdownWatchdog:
    """Detector 1: trips when a shutdown overruns ``deadline`` seconds from :meth:`arm`.

    In the back half of the budget (past ``dump_after_fraction``) it asks the
    loop to log the still-running tasks every ``dump_interval`` seconds, so an
    operator sees what a slow shutdown is waiting for before it is cut short.
    """

    def __init__(
        self, deadline: float, *, dump_interval: float = 5.0, dump_after_fraction: float = 0.5
    ) -> None:
        self._deadline = deadline
        self._dump_interval = dump_interval
        self._dump_after = deadline * dump_after_fraction
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def arm(self) -> None:
        """Start counting (at the first shutdown signal, from the loop). Idempotent."""
        if self._thread is not None:
            return
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None  # armed off-loop: no straggler dumps, the deadline still holds
        _log.info(
            "taskq.shutdown-watchdog-armed",
            deadline_s=self._deadline,
            dump_after_s=self._dump_after,
        )
        self._thread = threading.Thread(
            target=self._watch, name="taskq-shutdown-watchdog", daemon=True
        )
        self._thread.start()

    def disarm(self) -> None:
        """The shutdown finished in time."""
        self._done.set()

    def _watch(self) -> None:
        started = time.monotonic()
        while True:
            elapsed = time.monotonic() - started
            if elapsed >= self._deadline:
                trip(
                    "shutdown-deadline",
                    f"shutdown still running after {self._deadline}s",
                    in_loop=False,
                )
            if elapsed >= self._dump_after and self._loop is not None:
                try:
                    self._loop.call_soon_threadsafe(dump_task_stacks, "shutdown-straggler")
                except RuntimeError:
                    return  # the loop is closed: the shutdown is over
            step = self._dump_interval if elapsed >= self._dump_after else self._dump_after
            if self._done.wait(max(min(step, self._deadline - elapsed), 0.0)):
                return


class LoopLagWatchdog:
    """Detector 4: a daemon thread that trips when the loop stops scheduling its beats."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        liveness: LoopLiveness,
        *,
        budget: float,
        startup_grace: float,
        check_interval: float,
    ) -> None:
        self._loop = loop
        self._liveness = liveness
        self._budget = budget
        self._startup_grace = startup_grace
        self._check_interval = check_interval
        self._last_beat = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="taskq-loop-lag", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _beat(self) -> None:
        self._last_beat = time.monotonic()

    def _run(self) -> None:
        started = time.monotonic()
        requested: float | None = None  # when the beat still awaited was scheduled
        try:
            while not self._stop.wait(self._check_interval):
                now = time.monotonic()
                if requested is not None and self._last_beat < requested:
                    armed = self._liveness.any_tick.is_set() or now - started >= self._startup_grace
                    if armed and now - requested > self._budget:
                        trip(
                            "loop-lag",
                            f"event loop blocked for {now - requested:.1f}s "
                            f"(budget {self._budget}s)",
                            in_loop=False,
                        )
                    continue  # that beat is still queued: do not pile up more
                requested = now
                try:
                    self._loop.call_soon_threadsafe(self._beat)
                except RuntimeError:
                    return  # the loop closed: the worker is gone
        except BaseException as exc:
            # A dead watchdog thread silently removes detector 4: say so loudly.
            _log.critical("taskq.loop-lag-watchdog-died", error=repr(exc))
            raise


async def stale_tick_loop(liveness: LoopLiveness, check_interval: float) -> None:
    """Detector 2: trip when any tracked loop's tick is older than its budget.

    A wake-up late by more than an interval means the event loop itself stood still
    (a GC pause, a blocking call): that time is not held against the loops, which
    could not tick through it. Detector 4 judges such pauses, against the loop-lag
    budget; counted here, any pause past the stale floor (10 s) ended the worker as
    the loop resumed, however large that budget."""
    clock = asyncio.get_running_loop()
    while True:
        asked = clock.time()
        await asyncio.sleep(check_interval)
        late = clock.time() - asked - check_interval
        if late > check_interval:
            liveness.excuse(late)
        stale = liveness.stale()
        if stale:
            trip("stale-tick", f"loops stopped ticking: {stale}")


def guard_sibling(
    name: str,
    run: Callable[[], Awaitable[None]],
    shutting_down: Callable[[], bool],
    *,
    exits: bool = True,
) -> Callable[[], Coroutine[Any, Any, None]]:
    """Detector 3: a sibling loop may only return once shutdown began.

    ``exits`` (the watchdogs on): trip, ending the process. Off: raise
    ``ContractViolation`` into the worker's task group instead, which ends the
    worker the ordinary way; never let it run on without the loop (a worker whose
    heartbeat stopped would let its jobs be reclaimed and run twice)."""

    async def guarded() -> None:
        await run()
        if not shutting_down():
            reason = f"worker loop {name!r} returned while the worker runs"
            if exits:
                trip("sibling-contract", reason)
            raise ContractViolation(reason)

    return guarded
