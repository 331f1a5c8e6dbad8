"""The maintenance leader's sweeps: what one leader tick does, per loop.

Each function is one iteration of a leader loop (see :mod:`taskq.worker.leader`);
every sweep is a guarded, idempotent statement, so an overlap with a leader
that has not yet noticed it was deposed moves nothing twice.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from taskq.backend._protocol import SupportsCron, SupportsPrune
from taskq.worker.cron import SlotJobBuilder

if TYPE_CHECKING:
    from taskq.worker._state import WorkerState

__all__ = ["archive_expiry_once", "cron_once", "prune_once", "sweep_once"]


async def sweep_once(state: WorkerState, *, reclaim: bool) -> dict[str, int]:
    """Promote due scheduled jobs, fail those past their deadline (Sweep 2) and, when
    ``reclaim``, reclaim expired locks (Sweep 1); returns how many jobs each moved."""
    backend, settings = state.backend, state.settings
    moved = {
        "scheduled_to_pending": await backend.scheduled_to_pending(),
        "deadline": await backend.deadline_sweep(),
    }
    if reclaim:
        moved["reclaimed"] = await backend.reclaim_expired_locks(
            settings.cancellation_grace_period, settings.cleanup_grace_period
        )
    return moved


async def cron_once(state: WorkerState, backend: SupportsCron) -> dict[str, int]:
    """Fire every due cron slot (within the catch-up window)."""
    build = SlotJobBuilder(state.client, state.actors.keys())
    return {
        "cron_fired": await backend.fire_due_schedules(build, catch_up=state.settings.cron_catch_up)
    }


async def prune_once(state: WorkerState, backend: SupportsPrune) -> dict[str, int]:
    """Sweep 5: terminal jobs past their retention -> the archive."""
    settings = state.settings
    moved = await backend.prune_terminal_jobs(
        settings.prune_retention,
        archive_retention=settings.archive_retention,
        batch_size=settings.prune_batch_size,
    )
    return {"pruned": moved}


async def archive_expiry_once(state: WorkerState, backend: SupportsPrune) -> dict[str, int]:
    """Sweep 6: archived jobs past ``expire_at`` are deleted."""
    return {
        "archive_expired": await backend.expire_archive(batch_size=state.settings.prune_batch_size)
    }
