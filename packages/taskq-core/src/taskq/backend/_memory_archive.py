"""The in-memory job archive: Sweep 5 moves terminal jobs into it, Sweep 6 expires them.

:class:`JobArchive` plays ``jobs_archive`` and ``job_attempts_archive``. A pruned
job leaves the store with its attempts, which are kept beside it here and so
expire with it (Postgres: by cascade), and its events, which are deleted, not
archived. Both sweeps work in batches of ``batch_size`` rows, like the Postgres
statements, and each batch reads the clock once, as one statement reads
``clock_timestamp()``.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from taskq.backend._memory_store import JobStore
from taskq.backend._protocol import check_batch_size, check_retention
from taskq.backend.clock import Clock
from taskq.backend.statemachine import TERMINAL_STATUSES, JobStatus
from taskq.models import AttemptRow, JobId, JobRow

__all__ = ["ArchivedJob", "JobArchive"]


@dataclass(frozen=True)
class ArchivedJob:
    """One row of ``jobs_archive`` with its rows of ``job_attempts_archive``."""

    job: JobRow
    attempts: tuple[AttemptRow, ...]
    archived_at: datetime
    expire_at: datetime


class JobArchive:
    """The archived jobs of one in-memory backend, by job id."""

    def __init__(self, store: JobStore, clock: Clock) -> None:
        self._store = store
        self._clock = clock
        self.rows: dict[JobId, ArchivedJob] = {}

    def prune(
        self, retention: Mapping[str, timedelta], archive_retention: timedelta, batch_size: int
    ) -> int:
        """Move terminal jobs of each status in ``retention`` that finished longer than
        its retention ago, and whose result has expired (or has no ``result_expires_at``),
        into the archive, oldest first; returns how many moved.

        A job without ``finished_at`` is never old enough (in SQL the comparison is
        NULL), and a non-terminal status in ``retention`` moves nothing.
        """
        check_batch_size(batch_size)
        check_retention(retention)
        moved = 0
        for name, keep in retention.items():
            status = JobStatus(name)
            if status not in TERMINAL_STATUSES:
                continue
            while True:
                count = self._prune_batch(status, keep, archive_retention, batch_size)
                moved += count
                if count < batch_size:
                    break
        return moved

    def _prune_batch(
        self, status: JobStatus, keep: timedelta, archive_retention: timedelta, batch_size: int
    ) -> int:
        now = self._clock.now()
        cutoff = now - keep
        victims = heapq.nsmallest(
            batch_size,
            (
                (row.finished_at, row)
                for row in self._store.jobs.values()
                if row.status is status
                and row.finished_at is not None
                and row.finished_at < cutoff
                # A result_ttl longer than the retention wins: the archive is not
                # readable, so a job pruned earlier loses its result before its time.
                and (row.result_expires_at is None or row.result_expires_at <= now)
            ),
            key=lambda pair: pair[0],
        )
        attempts = self._store.delete([row.id for _, row in victims])
        for _, row in victims:
            self.rows[row.id] = ArchivedJob(
                job=row,
                attempts=tuple(attempts[row.id]),
                archived_at=now,
                expire_at=now + archive_retention,
            )
        return len(victims)

    def expire(self, batch_size: int) -> int:
        """Delete archived jobs (their attempts with them) whose ``expire_at`` has
        passed, oldest first; returns how many."""
        check_batch_size(batch_size)
        deleted = 0
        while True:
            now = self._clock.now()
            doomed = heapq.nsmallest(
                batch_size,
                (archived for archived in self.rows.values() if archived.expire_at < now),
                key=lambda archived: archived.expire_at,
            )
            for archived in doomed:
                del self.rows[archived.job.id]
            deleted += len(doomed)
            if len(doomed) < batch_size:
                return deleted
