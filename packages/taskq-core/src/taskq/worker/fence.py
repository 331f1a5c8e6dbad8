"""The lease fence (``lease_fence``): stop a job before its lease can lapse.

A worker cut off from the database (a partition, a stalled connection) cannot
renew its jobs' leases. Past ``lock_lease`` the leader reclaims them and
another worker runs them, while this one, not knowing, runs them on: the
attempt fence keeps the outcomes right, but the job's code ran twice at once.

With the fence on, this worker stops a job itself once ``lock_lease - heartbeat_interval``
has passed since the last statement that locked or renewed it was *sent* (the
database set the lease at or after that moment, so it cannot lapse sooner). A
job still waiting for a slot is let go unstarted; a running one is cancelled
(``ctx.cancel_event`` set for sync actors, which cannot be stopped otherwise) and,
once the database answers, its attempt is written failed with :class:`LeaseLost`
and retried as any failure is (handed back, if a shutdown had asked it to stop).
Where the leader reclaimed it first, that write is a no-op. The price: a
database outage longer than the lease stops running jobs on every worker, hence
off by default. What no cancellation stops runs on: a sync actor that does not
look at its cancel event, and threads an async actor started
(``asyncio.to_thread``).
"""

from __future__ import annotations

import asyncio

import structlog

from taskq.backend import CancelPhase
from taskq.logs import job_fields
from taskq.worker._state import ActiveJob, WorkerState

__all__ = ["lease_fence_loop"]

_log = structlog.get_logger("taskq.worker")


def _fenceable(active: ActiveJob) -> bool:
    """Not already let go, nor down to its outcome write (no code of the job runs), nor
    with its task cancelled already (a second cancel would cut that write short). A job
    a shutdown asked to stop (``interrupted``) runs on until its task is cancelled: it
    is fenced as any other, and handed back."""
    if active.lost or active.fenced or active.returned:
        return False
    task = active.task
    if task is None:
        return True
    return (
        not task.done()
        and task.cancelling() == 0
        and active.cancel_phase < CancelPhase.ABANDON_PENDING
    )


def fence_lapsing(state: WorkerState, now: float, window: float) -> float | None:
    """Stop every job whose lease may lapse within ``window`` of ``now`` (loop times);
    returns the loop time the next one falls due, if any."""
    lease = state.settings.lock_lease.total_seconds()
    due: float | None = None
    for job_id, active in list(state.active.items()):
        if not _fenceable(active):
            continue
        fence_at = active.lease_from + lease - window
        if fence_at > now:
            due = fence_at if due is None else min(due, fence_at)
            continue
        since = round(now - active.lease_from, 3)
        if active.task is None:
            _log.warning("taskq.lease-fenced", **job_fields(active.row), started=False, since=since)
            active.lost = True  # the consumer skips it
            state.release(job_id, active)
            # Still locked for this worker if no reclaim came first: the producer asks
            # the backend, once it answers, and hands it back unstarted.
            state.unheard_suspected = True
            continue
        _log.warning("taskq.lease-fenced", **job_fields(active.row), started=True, since=since)
        active.fenced = True
        if active.ctx is not None:
            active.ctx.cancel_event.set()
        active.task.cancel()
    return due


async def lease_fence_loop(state: WorkerState) -> None:
    """Fence lapsing jobs, waking at the next one's time or every half heartbeat."""
    interval = state.settings.heartbeat_interval.total_seconds()
    period = interval / 2
    clock = asyncio.get_running_loop()
    while True:
        now = clock.time()
        due = fence_lapsing(state, now, interval)
        state.liveness.tick("lease-fence", period)
        await asyncio.sleep(period if due is None else min(period, max(due - now, 0.0)))
