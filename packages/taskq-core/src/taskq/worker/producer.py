"""The producer loop: locks due jobs into the local queue while there is room.

It sleeps on the backend's wake subscription (NOTIFY on Postgres) and falls
back to polling every ``poll_interval``; when the process is full it waits
for a consumer to free a slot instead.
"""

from __future__ import annotations

import asyncio

import structlog

from taskq.worker._state import WorkerState
from taskq.worker._transient import UnexpectedLoopErrorGuard, transient_errors

_log = structlog.get_logger("taskq.worker")


async def _wait(event: asyncio.Event, stopping: asyncio.Event, seconds: float) -> None:
    """Until ``event`` or ``stopping`` is set, or ``seconds`` pass."""
    waiters = [asyncio.ensure_future(event.wait()), asyncio.ensure_future(stopping.wait())]
    try:
        await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()


async def producer_loop(state: WorkerState) -> None:
    """Dispatch until ``state.stopping`` is set."""
    settings = state.settings
    poll = settings.poll_interval.total_seconds()
    guard = UnexpectedLoopErrorGuard("producer")
    transient = transient_errors()
    async with state.backend.subscribe_wake() as wake:
        while not state.stopping.is_set():
            state.liveness.tick("producer", poll)
            free = state.free_slots()
            if free <= 0:
                state.slot_freed.clear()
                if state.free_slots() <= 0:
                    await _wait(state.slot_freed, state.stopping, poll)
                continue
            wanted = min(free, settings.dispatch_batch_size)
            # Cleared before dispatching: a NOTIFY arriving meanwhile sets it again.
            wake.clear()
            try:
                jobs = await state.backend.dispatch_batch(
                    state.worker_id, settings.queues, wanted, settings.lock_lease
                )
            except transient as exc:
                _log.warning("taskq.dispatch-transient-error", error=repr(exc))
                await _wait(state.stopping, state.stopping, poll)
                continue
            except Exception as exc:  # noqa: BLE001 - the guard decides
                guard.failed(exc)
                await _wait(state.stopping, state.stopping, poll)
                continue
            guard.succeeded()
            for row in jobs:
                state.hold(row)
            if len(jobs) < wanted:
                await _wait(wake, state.stopping, poll)
