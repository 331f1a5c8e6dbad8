"""The maintenance leader's sweeps: what one leader tick does, per loop.

Each function is one iteration of a leader loop (see :mod:`taskq.worker.leader`);
every sweep is a guarded, idempotent statement, so an overlap with a leader
that has not yet noticed it was deposed moves nothing twice.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Final

import structlog

from taskq.backend._protocol import (
    SupportsCron,
    SupportsFleetStats,
    SupportsPrune,
    SupportsResultExpiry,
    SupportsStaleBatchSweep,
    SupportsWorkerRegistry,
)
from taskq.batch_outcomes import applied_batch_ends
from taskq.worker.cron import SlotJobBuilder

if TYPE_CHECKING:
    from taskq.worker._state import WorkerState

__all__ = [
    "MOST_LOGGED",
    "archive_expiry_once",
    "cron_once",
    "expire_results_once",
    "prune_once",
    "queue_depth_once",
    "stale_batches_once",
    "stranded_jobs_once",
    "sweep_once",
]

_log = structlog.get_logger("taskq.leader")


async def sweep_once(state: WorkerState, *, reclaim: bool) -> dict[str, int]:
    """When ``reclaim`` reclaim expired locks (Sweep 1), then promote due scheduled
    jobs, fail those past their deadline (Sweep 2) and, with a worker registry,
    delete the rows of workers unseen for ``worker_row_ttl``; returns how many
    rows each moved. Reclaim first: the iteration is bounded as a whole, and crashed
    workers' jobs must not wait behind a promotion backlog. The batch children that
    the reclaim and the deadline sweep end count for their batches (a failure toward
    its batch's threshold), as the ends the worker writes do: also when the
    iteration's bound cuts it short, then within a quarter of that bound more (a sweep
    cut short lost the ends it had committed, and their failures never counted)."""
    backend, settings = state.backend, state.settings
    grace = settings.batch_ends_grace.total_seconds()
    moved: dict[str, int] = {}
    if reclaim:
        async with applied_batch_ends(backend, grace=grace) as ends:
            moved["reclaimed"] = await backend.reclaim_expired_locks(
                settings.cancellation_grace_period,
                settings.cleanup_grace_period,
                # A worker that touched its row within a lease is alive (it touches each
                # heartbeat, before renewing): a lock held past the lease kept it from
                # renewing, and its jobs run on.
                worker_silence=settings.lock_lease
                if isinstance(backend, SupportsWorkerRegistry)
                else None,
                batch_ends=ends,
            )
    moved["scheduled_to_pending"] = await backend.scheduled_to_pending()
    async with applied_batch_ends(backend, grace=grace) as ends:
        moved["deadline"] = await backend.deadline_sweep(batch_ends=ends)
    if isinstance(backend, SupportsWorkerRegistry):
        moved["stale_workers"] = await backend.cleanup_stale_workers(settings.worker_row_ttl)
    return moved


async def cron_once(state: WorkerState, backend: SupportsCron) -> dict[str, int]:
    """Fire every due cron slot (within the catch-up window)."""
    # Read each time (a small table, on the leader only): a worker of a new actor
    # may have registered its queue since.
    build = SlotJobBuilder(
        state.client,
        state.actors.keys(),
        await backend.get_actor_queues(),
        await backend.get_actor_job_defaults(),
    )
    return {
        "cron_fired": await backend.fire_due_schedules(build, catch_up=state.settings.cron_catch_up)
    }


async def expire_results_once(backend: SupportsResultExpiry) -> dict[str, int]:
    """Clear stored results past their ``result_expires_at``."""
    return {"results_expired": await backend.sweep_expired_results()}


async def stale_batches_once(backend: SupportsStaleBatchSweep) -> dict[str, int]:
    """Complete active batches whose children all finished (a lost terminal hook)."""
    return {"stale_batches_completed": await backend.complete_stale_batches()}


MOST_LOGGED: Final = 50
"""The queues (and actors) a log record names at most (a fleet-stats record the busiest
first): one per queue, 20,000 queues made each record 6 MB."""


def _busiest(counts: Mapping[str, int]) -> list[str]:
    return sorted(counts, key=lambda name: (-counts[name], name))[:MOST_LOGGED]


async def queue_depth_once(backend: SupportsFleetStats) -> dict[str, int]:
    """Log one ``taskq.queue-depth`` record: pending/scheduled/running per queue, for the
    50 busiest queues (``queues_not_shown`` counts the others)."""
    depths = await backend.queue_depths()
    shown = _busiest({queue: sum(states.values()) for queue, states in depths.items()})
    _log.info(
        "taskq.queue-depth",
        queues={queue: depths[queue] for queue in shown},
        queues_not_shown=len(depths) - len(shown),
    )
    # A sample moves nothing: the record above is the loop's whole output.
    return {}


async def stranded_jobs_once(backend: SupportsFleetStats) -> dict[str, int]:
    """Warn (``taskq.stranded-jobs``) about waiting jobs no live worker will dispatch:
    of an actor none runs (removed or renamed since they were enqueued, or never
    deployed), or on a queue none of the workers running their actor works (a misspelt
    or undeployed ``queue=``). They wait until such a worker starts, or until someone
    cancels them (to enqueue them again where they run). ``actors``: actor -> queue ->
    waiting jobs, for the 50 actors with the most (and 50 queues each); ``queues``:
    the queues named; ``jobs``: all of them."""
    stranded = await backend.stranded_jobs()
    if stranded:
        shown = _busiest({actor: sum(queues.values()) for actor, queues in stranded.items()})
        named = {
            actor: {queue: stranded[actor][queue] for queue in _busiest(stranded[actor])}
            for actor in shown
        }
        _log.warning(
            "taskq.stranded-jobs",
            actors=named,
            actors_not_shown=len(stranded) - len(shown),
            queues=sorted({queue for queues in named.values() for queue in queues}),
            jobs=sum(jobs for queues in stranded.values() for jobs in queues.values()),
            hint="no live worker both runs these actors and works these queues: deploy a "
            "worker working the queue (TASKQ_QUEUES, --queues) whose application defines "
            "the actor, or cancel their waiting jobs (JobsClient.cancel_where(actor=..., "
            "queue=..., status=['pending', 'scheduled'])) and enqueue them again on a "
            "queue a worker running the actor works; `taskq jobs list --actor NAME "
            "--queue QUEUE --active` lists them",
        )
    return {}


async def prune_once(state: WorkerState, backend: SupportsPrune) -> dict[str, int]:
    """Sweep 5: terminal jobs past their retention -> the archive; then the batch rows
    finished before the shortest retention whose children and finalizer are all gone."""
    settings = state.settings
    moved = await backend.prune_terminal_jobs(
        settings.prune_retention,
        archive_retention=settings.archive_retention,
        batch_size=settings.prune_batch_size,
    )
    # After the jobs, so a batch row never goes while its children are still visible
    # (the backend also keeps any batch with a child left). The cutoff comes from the
    # backend's clock, the one that wrote completed_at, not from this host's.
    cutoff = await backend.now() - min(settings.prune_retention.values())
    return {"pruned": moved, "batches_pruned": await state.backend.prune_old_batches(cutoff)}


async def archive_expiry_once(state: WorkerState, backend: SupportsPrune) -> dict[str, int]:
    """Sweep 6: archived jobs past ``expire_at`` are deleted."""
    return {
        "archive_expired": await backend.expire_archive(batch_size=state.settings.prune_batch_size)
    }
