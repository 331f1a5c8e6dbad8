"""``DrainMonitor``: ends an ``--until-idle`` worker once its queues are empty."""

from __future__ import annotations

import asyncio

import structlog

from taskq.worker._state import WorkerState
from taskq.worker._transient import transient_errors

_log = structlog.get_logger("taskq.worker")


async def drain_monitor_loop(state: WorkerState) -> None:
    """Stop dispatch when this worker holds nothing and ``count_active_jobs`` is 0.

    Two consecutive idle readings are required, so a job enqueued by a job
    that just finished (its sub-job) is not missed between the two reads.
    """
    interval = state.settings.poll_interval.total_seconds()
    idle_readings = 0
    while not state.stopping.is_set():
        await asyncio.sleep(min(interval, 0.2))
        if state.active or not state.queue.empty():
            idle_readings = 0
            continue
        try:
            remaining = await state.backend.count_active_jobs(state.settings.queues)
        except transient_errors() as exc:
            _log.warning("taskq.drain-check-transient-error", error=repr(exc))
            continue
        idle_readings = idle_readings + 1 if remaining == 0 else 0
        if idle_readings >= 2:
            _log.info("taskq.idle", processed=state.processed)
            state.stopping.set()
