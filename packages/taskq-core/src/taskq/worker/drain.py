"""``DrainMonitor``: ends an ``--until-idle`` worker once its queues are empty."""

from __future__ import annotations

import asyncio
from typing import Final

import structlog

from taskq.backend import SupportsActorDispatch
from taskq.models import JobFilter
from taskq.worker._state import WorkerState
from taskq.worker._transient import transient_errors

_log = structlog.get_logger("taskq.worker")


async def drain_monitor_loop(state: WorkerState) -> None:
    """Stop dispatch when this worker holds nothing and ``count_active_jobs`` is 0.

    Two consecutive idle readings are required, so a job enqueued by a job
    that just finished (its sub-job) is not missed between the two reads. Jobs of
    actors the application does not know count as none (with an error log): the
    worker would leave them pending, or hand them back every few seconds, forever.
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
        # Jobs of actors it does not know: this worker hands them back when it meets
        # them, or (SupportsActorDispatch) never dispatches them.
        if remaining and (
            state.met_unknown_actor or isinstance(state.backend, SupportsActorDispatch)
        ):
            try:
                strangers = await _only_unknown_actors_left(state)
            except transient_errors() as exc:
                _log.warning("taskq.drain-check-transient-error", error=repr(exc))
                continue
            if strangers:
                remaining = 0  # nothing this worker can run is left
        else:
            strangers = []
        idle_readings = idle_readings + 1 if remaining == 0 else 0
        if idle_readings >= 2:
            if strangers:  # said once, at the end: each reading found them
                _log.error("taskq.idle-but-jobs-of-unknown-actors", actors=strangers)
            _log.info("taskq.idle", processed=state.processed)
            state.stopping.set()


_SAMPLE: Final = 1_000


async def _only_unknown_actors_left(state: WorkerState) -> list[str]:
    """The actors of the active jobs left in the worker's queues when the application knows
    none of them, else []. More than ``_SAMPLE`` jobs in a queue: [] (not looked at)."""
    strangers: set[str] = set()
    for queue in state.settings.queues:
        rows = await state.backend.list_jobs(JobFilter(active=True, queue=queue, limit=_SAMPLE))
        if len(rows) == _SAMPLE:
            return []
        for row in rows:
            if row.actor in state.actors:
                return []
            strangers.add(row.actor)
    return sorted(strangers)
