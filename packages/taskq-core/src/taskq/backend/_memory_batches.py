"""Batches kept in memory: the batch rows, their children and their finalizer.

A batch's children are the jobs whose ``metadata["batch_id"]`` is the batch
id; a batch *row* exists only when the caller asked for a failure policy or
a finalizer. The finalizer is a job parked ``scheduled`` far in the future
(Postgres: ``'infinity'``) and released to ``pending`` when the batch
completes or aborts. It is never one of the children.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from uuid import UUID

from taskq.backend._memory_store import JobStore
from taskq.backend.batch_members import (
    BATCH_TAG,
    FINALIZER_TAG,
    all_ended,
    check_children,
    check_finalizer,
    replayed,
)
from taskq.backend.clock import Clock
from taskq.backend.statemachine import ACTIVE_STATUSES, JobStatus
from taskq.backend.storable import stored_json
from taskq.errors import EnqueueError
from taskq.models import (
    BatchCounts,
    BatchFilter,
    BatchRow,
    BatchStatus,
    EnqueueArgs,
    ErrorInfo,
    JobRow,
)

__all__ = ["BATCH_ABORTED_MESSAGE", "FINALIZER_PARKED_AT", "BatchTable"]

FINALIZER_PARKED_AT = datetime(9999, 1, 1, tzinfo=UTC)
"""Where a finalizer waits until its batch finishes: no sweep ever finds it due."""

BATCH_ABORTED_MESSAGE = "Batch aborted due to consecutive failures"

# Batch rows inserted here always get created_at; a caller-built row without one sorts oldest.
_UNKNOWN_TIME = datetime.min.replace(tzinfo=UTC)


def _in_utc(value: datetime | None) -> datetime | None:
    """``value`` in UTC, as a ``timestamptz`` reads back; a naive time taken as UTC."""
    if value is None:
        return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _reached_threshold(batch: BatchRow) -> bool:
    """Whether the batch's failure streak reached its threshold: it aborts."""
    threshold = batch.failure_threshold
    return threshold is not None and batch.consecutive_failures >= threshold


class BatchTable:
    """The batch rows of one in-memory backend, and the batch operations on its jobs."""

    def __init__(self, store: JobStore, clock: Clock) -> None:
        self._store = store
        self._clock = clock
        self._rows: dict[UUID, BatchRow] = {}

    def get(self, batch_id: UUID) -> BatchRow | None:
        return self._rows.get(batch_id)

    def _require(self, batch_id: UUID) -> BatchRow:
        try:
            return self._rows[batch_id]
        except KeyError:
            raise KeyError(f"no batch with id {batch_id}") from None

    def _refuse_existing(self, batch_id: UUID) -> None:
        if batch_id in self._rows:
            raise ValueError(f"a batch with id {batch_id} already exists")

    def children(self, batch_id: UUID) -> list[JobRow]:
        """Jobs tagged with the batch id; the finalizer carries no tag, so it is never one."""
        tag = str(batch_id)
        batch = self._rows.get(batch_id)
        finalizer = batch.finalizer_job_id if batch is not None else None
        return [
            row
            for row in self._store.jobs.values()
            if row.metadata.get("batch_id") is not None
            and str(row.metadata["batch_id"]) == tag
            and row.id != finalizer
        ]

    def _quiet_since(self, batch_id: UUID, since: datetime) -> bool:
        """No child of the batch is active, nor ended after ``since``."""
        return not any(
            row.status in ACTIVE_STATUSES
            or (row.finished_at is not None and row.finished_at > since)
            for row in self.children(batch_id)
        )

    def count_non_terminal(self, batch_id: UUID) -> int:
        return sum(1 for row in self.children(batch_id) if row.status in ACTIVE_STATUSES)

    def create(
        self,
        batch_id: UUID,
        queue: str,
        expected_size: int,
        failure_threshold: int | None,
        finalizer_job_id: UUID | None,
        originating_actor: str | None,
    ) -> None:
        self._refuse_existing(batch_id)
        self._rows[batch_id] = BatchRow(
            id=batch_id,
            queue=queue,
            status="active",
            expected_size=expected_size,
            consecutive_failures=0,
            failure_threshold=failure_threshold,
            finalizer_job_id=finalizer_job_id,
            originating_actor=originating_actor,
            created_at=self._clock.now(),
        )

    def enqueue_atomic(
        self,
        items: Iterable[EnqueueArgs],
        batch_id: UUID,
        batch_row: BatchRow | None,
        finalizer_args: EnqueueArgs | None,
    ) -> list[JobRow]:
        """Children, batch row and parked finalizer, validated together, then stored; the
        same call again returns the children it stored (``replayed``)."""
        if batch_row is not None and batch_row.id != batch_id:
            raise ValueError(f"batch_row.id {batch_row.id} differs from batch_id {batch_id}")
        check_finalizer(finalizer_args, batch_row)
        tag = str(batch_id)
        children = [
            args.model_copy(update={"metadata": {**args.metadata, BATCH_TAG: tag}})
            for args in items
        ]
        try:
            return self._store_atomic(children, batch_id, batch_row, finalizer_args)
        except (ValueError, EnqueueError):  # "already exists", a singleton's collision
            store = self._store
            by_key = {
                key: row
                for args in children
                if args.idempotency_key is not None
                and (row := store.by_idempotency_key(key := (args.actor, args.idempotency_key)))
            }
            rows = replayed(
                children,
                tag,
                batch_row,
                finalizer_args,
                self._rows.get(batch_id),
                store.jobs,
                by_key,
            )
            if rows is None:
                raise
            return rows

    def _store_atomic(
        self,
        children: list[EnqueueArgs],
        batch_id: UUID,
        batch_row: BatchRow | None,
        finalizer_args: EnqueueArgs | None,
    ) -> list[JobRow]:
        now = self._clock.now()
        tag = str(batch_id)
        if batch_row is not None:
            self._refuse_existing(batch_id)
            # Stored as Postgres stores it (JSON through dump_json, times in UTC), and a
            # value it cannot hold refused before anything is written.
            batch_row = batch_row.model_copy(
                update={
                    "metadata": stored_json(batch_row.metadata),
                    "created_at": _in_utc(batch_row.created_at),
                    "completed_at": _in_utc(batch_row.completed_at),
                }
            )
        to_insert = list(children)
        if finalizer_args is not None:
            to_insert.append(
                finalizer_args.model_copy(
                    update={"metadata": {**finalizer_args.metadata, FINALIZER_TAG: tag}}
                )
            )
        plan = self._store.plan_inserts(to_insert, now, idempotent=True)
        if batch_row is not None or finalizer_args is not None:
            check_children(plan.rows[: len(children)], tag)
        finalizer_id = None
        if finalizer_args is not None:
            finalizer = plan.rows[-1]
            finalizer_id = finalizer.id
            if finalizer.id in plan.new:
                plan.new[finalizer.id] = finalizer.model_copy(
                    update={"status": JobStatus.SCHEDULED, "scheduled_at": FINALIZER_PARKED_AT}
                )
        self._store.insert(plan)
        rows = plan.rows[: len(children)]
        if batch_row is not None:
            self._rows[batch_id] = batch_row.model_copy(
                update={
                    "finalizer_job_id": finalizer_id or batch_row.finalizer_job_id,
                    "created_at": batch_row.created_at or now,
                }
            )
            if all_ended(rows):
                self.complete(batch_id)
        return rows

    def add_failures(self, batch_id: UUID, count: int) -> tuple[int, int | None, int]:
        batch = self._require(batch_id)
        if batch.status != "active":  # a finished batch's streak is over
            raise KeyError(f"batch {batch_id} is {batch.status}, not active")
        failures, threshold = batch.consecutive_failures + count, batch.failure_threshold
        if threshold is not None:  # one at a time, the failures stop at the abort
            failures = min(failures, max(threshold, batch.consecutive_failures + 1))
        self._rows[batch_id] = batch.model_copy(update={"consecutive_failures": failures})
        left = any(row.status in ACTIVE_STATUSES for row in self.children(batch_id))
        return failures, batch.failure_threshold, int(left)

    def reset_failures(self, batch_id: UUID) -> int:
        batch = self._rows.get(batch_id)
        if batch is None or batch.status != "active":
            return 0
        if _reached_threshold(batch):
            return 0  # that batch aborts (see RESET_BATCH_FAILURES)
        self._rows[batch_id] = batch.model_copy(update={"consecutive_failures": 0})
        return 1

    def abort(self, batch_id: UUID) -> int:
        """Abort an active batch: cancel its waiting children, release the finalizer.
        A finished batch is left alone (0)."""
        batch = self._rows.get(batch_id)
        if batch is not None and batch.status != "active":
            return 0
        now = self._clock.now()
        cancelled = self._cancel_waiting(batch_id, now)
        if batch is not None:
            self._finish(batch, "aborted", now)
        return cancelled

    def _cancel_waiting(self, batch_id: UUID, now: datetime) -> int:
        """Cancel the batch's pending and scheduled children; returns how many."""
        waiting = [
            row
            for row in self.children(batch_id)
            if row.status in (JobStatus.PENDING, JobStatus.SCHEDULED)
        ]
        for row in waiting:
            self._store.move(
                row,
                JobStatus.CANCELLED,
                now,
                detail={"reason": "batch_aborted"},
                finished_at=now,
                error=ErrorInfo(error_class="BatchAborted", message=BATCH_ABORTED_MESSAGE),
            )
        return len(waiting)

    def complete(self, batch_id: UUID) -> None:
        """Mark an active batch complete (or aborted: :meth:`_ending`) and release its
        finalizer; else a no-op (and for one whose failure streak reached its threshold:
        :meth:`abort` ends that one)."""
        batch = self._rows.get(batch_id)
        if batch is None or batch.status != "active":
            return
        if not _reached_threshold(batch):
            self._finish(batch, self._ending(batch), self._clock.now())

    def _ending(self, batch: BatchRow) -> BatchStatus:
        """How a batch with no child left ends: ``aborted`` when its children's failures
        since its last success, in the order they ended, reached its threshold (the
        hooks' streak lags: see COMPLETE_BATCH), else ``complete``."""
        threshold = batch.failure_threshold
        if threshold is None:
            return "complete"
        ended = [
            (row.finished_at, row.status)
            for row in self.children(batch.id)
            if row.finished_at is not None
        ]
        last_success = max(
            (at for at, status in ended if status is JobStatus.SUCCEEDED), default=_UNKNOWN_TIME
        )
        trailing = sum(
            1 for at, status in ended if status is JobStatus.FAILED and at > last_success
        )
        return "aborted" if trailing >= threshold else "complete"

    def complete_stale(self, grace: timedelta) -> int:
        """Complete (or abort: :meth:`_ending`) every active batch none of whose children
        is still active, nor ended or was created within ``grace``; abort, at once, every
        one whose failure streak reached its threshold (the hook's abort was lost: see
        COMPLETE_STALE_BATCHES); and cancel the waiting children of aborted batches."""
        now = self._clock.now()
        since = now - grace
        stale = [
            (row, _reached_threshold(row))
            for row in self._rows.values()
            if row.status == "active"
            and (
                _reached_threshold(row)
                or ((row.created_at or _UNKNOWN_TIME) <= since and self._quiet_since(row.id, since))
            )
        ]
        for batch, failed in stale:
            self._finish(batch, "aborted" if failed else self._ending(batch), now)
        # What an abort cut short left waiting (on Postgres an abort goes in turns).
        for batch_id in [row.id for row in self._rows.values() if row.status == "aborted"]:
            self._cancel_waiting(batch_id, now)
        return len(stale)

    def _finish(self, batch: BatchRow, status: BatchStatus, now: datetime) -> None:
        self._rows[batch.id] = batch.model_copy(update={"status": status, "completed_at": now})
        finalizer = (
            self._store.jobs.get(batch.finalizer_job_id)
            if batch.finalizer_job_id is not None
            else None
        )
        if finalizer is not None and finalizer.status is JobStatus.SCHEDULED:
            # Its schedule_to_close counts from here: parked, it had nothing to run.
            deadline = finalizer.deadline_at
            if deadline is not None:
                deadline = now + (deadline - finalizer.created_at)
            self._store.move(
                finalizer, JobStatus.PENDING, now, scheduled_at=now, deadline_at=deadline
            )

    def list(self, filter: BatchFilter) -> list[tuple[BatchRow, BatchCounts]]:
        """Matching batches, newest first, each with its children's counts."""
        rows = [
            row
            for row in self._rows.values()
            if (filter.queue is None or row.queue == filter.queue)
            and (filter.batch_id is None or row.id == filter.batch_id)
            and (filter.active is None or (row.status == "active") == filter.active)
        ]
        rows.sort(key=lambda row: (row.created_at or _UNKNOWN_TIME, row.id), reverse=True)
        return [(row, self._counts(row.id)) for row in rows[: filter.limit]]

    def _counts(self, batch_id: UUID) -> BatchCounts:
        children = self.children(batch_id)
        return BatchCounts(
            total=len(children), by_status=dict(Counter(row.status for row in children))
        )

    def prune(self, cutoff: datetime) -> int:
        """Delete finished batches completed before ``cutoff`` whose children and
        finalizer are gone."""
        prunable = [
            row.id
            for row in self._rows.values()
            if row.completed_at is not None
            and row.completed_at < cutoff
            and not self.children(row.id)
            # A finalizer still waiting or running would run against no batch.
            and row.finalizer_job_id not in self._store.jobs
        ]
        for batch_id in prunable:
            del self._rows[batch_id]
        return len(prunable)
