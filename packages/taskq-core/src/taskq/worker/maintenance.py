"""Maintenance sweeps: scheduled -> pending, deadlines, expired locks.

Every sweep is a guarded, idempotent statement that is safe to run from
several workers at once (row locks with SKIP LOCKED on Postgres), so until
leader election gates them each worker runs them on its own cadence.
"""

from __future__ import annotations

import asyncio

import structlog

from taskq.worker._state import WorkerState
from taskq.worker._transient import UnexpectedLoopErrorGuard, transient_errors

_log = structlog.get_logger("taskq.worker")


async def sweep_once(state: WorkerState) -> dict[str, int]:
    """Run each sweep once; returns how many jobs each one moved."""
    backend, settings = state.backend, state.settings
    return {
        "scheduled_to_pending": await backend.scheduled_to_pending(),
        "deadline": await backend.deadline_sweep(),
        "reclaimed": await backend.reclaim_expired_locks(
            settings.cancellation_grace_period, settings.cleanup_grace_period
        ),
    }


async def maintenance_loop(state: WorkerState) -> None:
    """Sweep every ``maintenance_interval`` until cancelled."""
    guard = UnexpectedLoopErrorGuard("maintenance")
    transient = transient_errors()
    interval = state.settings.maintenance_interval.total_seconds()
    while True:
        try:
            moved = await sweep_once(state)
        except transient as exc:
            _log.warning("taskq.sweep-transient-error", error=repr(exc))
        except Exception as exc:  # noqa: BLE001 - the guard decides
            guard.failed(exc)
        else:
            guard.succeeded()
            if any(moved.values()):
                _log.debug("taskq.swept", **moved)
        await asyncio.sleep(interval)
