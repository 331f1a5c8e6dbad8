"""The maintenance sweeps over the in-memory jobs table.

The maintenance leader calls these periodically; the backend's clock is the
only arbiter of "due", "late" and "expired", exactly as ``clock_timestamp()``
is inside the Postgres sweep statements.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from taskq.backend._memory_batches import FINALIZER_PARKED_AT
from taskq.backend._memory_store import JobStore, report_batch_end, wake
from taskq.backend.statemachine import CancelPhase, JobStatus
from taskq.models import DEADLINE_EXCEEDED, BatchChildEnd, ErrorInfo

__all__ = ["fail_past_deadline", "promote_due", "reclaim_expired"]

_S = JobStatus


def _crash_error(worker_id: UUID | None) -> ErrorInfo:
    return ErrorInfo(
        error_class="WorkerCrashed",
        message=f"worker {worker_id} stopped renewing the job's lock lease",
    )


def promote_due(store: JobStore, now: datetime) -> int:
    """``scheduled -> pending`` for every job whose ``scheduled_at`` has come."""
    due = [
        row for row in store.jobs.values() if row.status is _S.SCHEDULED and row.scheduled_at <= now
    ]
    for row in due:
        store.move(row, _S.PENDING, now)
    return len(due)


def fail_past_deadline(
    store: JobStore, now: datetime, batch_ends: list[BatchChildEnd] | None = None
) -> int:
    """Waiting jobs whose ``schedule_to_close`` deadline passed -> ``failed`` (the batch
    children among them reported to ``batch_ends``). Running jobs are left to their
    worker, which enforces the deadline itself."""
    late = [
        row
        for row in store.jobs.values()
        if row.status in (_S.PENDING, _S.SCHEDULED)
        and row.deadline_at is not None
        and row.deadline_at < now
        and row.scheduled_at < FINALIZER_PARKED_AT  # a parked finalizer's starts at release
    ]
    for row in late:
        store.move(
            row,
            _S.FAILED,
            now,
            detail={"reason": "deadline_exceeded"},
            finished_at=now,
            error=DEADLINE_EXCEEDED,
        )
        report_batch_end(batch_ends, row, _S.FAILED)
    return len(late)


def reclaim_expired(
    store: JobStore,
    now: datetime,
    cancel_wait: timedelta,
    alive: Collection[UUID] = (),
    batch_ends: list[BatchChildEnd] | None = None,
) -> int:
    """Reclaim running jobs whose lock lease expired: their worker is presumed dead,
    unless it is one of the ``alive`` (seen lately: another transaction held the row).

    A job with a cancel in progress may outlive its lease while the actor
    cleans up, so it is reclaimed only ``cancel_wait`` after the lease ended.
    Each reclaim writes a ``crashed`` attempt and one ``reclaimed`` event (the
    outbox ``poll_reclaim_events`` reads). The batch children it ends (``cancelled``,
    ``crashed``) are reported to ``batch_ends``.
    """
    expired = [
        row
        for row in store.jobs.values()
        if row.status is _S.RUNNING
        and row.lock_expires_at is not None
        and row.lock_expires_at < now
        and (row.cancel_phase == CancelPhase.NONE or row.lock_expires_at + cancel_wait < now)
        and row.locked_by_worker not in alive
    ]
    for row in expired:
        changes: dict[str, Any] = {}
        if row.cancel_phase >= CancelPhase.COOPERATIVE:
            # The caller asked for a cancel: honour it even with attempts left.
            to = _S.CANCELLED
        elif row.attempt < row.max_attempts and (
            # Past its deadline a retry could only fail: none is left.
            row.deadline_at is None or row.deadline_at > now
        ):
            to = _S.PENDING
            changes.update(
                scheduled_at=now,
                cancel_phase=CancelPhase.NONE,
                cancel_requested_at=None,
                error=_crash_error(row.locked_by_worker),  # its last attempt's, as a retry's
            )
        else:
            to = _S.CRASHED
            changes["error"] = _crash_error(row.locked_by_worker)
        store.end_attempt(
            row,
            to,
            now,
            worker_id=row.locked_by_worker,
            outcome="crashed",
            attempt_error=_crash_error(row.locked_by_worker),
            kind="reclaimed",
            detail={"reason": "lock_expired", "worker_id": str(row.locked_by_worker)},
            **changes,
        )
        if to is not _S.PENDING:
            report_batch_end(batch_ends, row, to)
    if expired:
        # Every reclaim wakes the workers, not only those back to pending
        # (as on Postgres, where the sweep sends one notify per call).
        wake(store.wake_subscribers)
    return len(expired)
