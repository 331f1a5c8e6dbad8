"""``JobFilter`` evaluated over in-memory rows: matching, keyset order, paging."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from uuid import UUID

from taskq.backend.statemachine import JobStatus
from taskq.models import JobFilter, JobRow

__all__ = ["select_jobs"]


def _order_key(job: JobRow) -> tuple[datetime, UUID]:
    return (job.created_at, job.id)


def _matches(filters: JobFilter, statuses: frozenset[JobStatus] | None, row: JobRow) -> bool:
    if statuses is not None and row.status not in statuses:
        return False
    if filters.actor is not None and row.actor != filters.actor:
        return False
    if filters.queue is not None and row.queue != filters.queue:
        return False
    if filters.identity_key is not None and row.identity_key != filters.identity_key:
        return False
    if filters.idempotency_key is not None and row.idempotency_key != filters.idempotency_key:
        return False
    if filters.batch_id is not None and str(row.metadata.get("batch_id")) != str(filters.batch_id):
        return False
    return all(tag in row.tags for tag in filters.tags)


def select_jobs(rows: Iterable[JobRow], filters: JobFilter, *, paged: bool = True) -> list[JobRow]:
    """Rows matching every field of ``filters``, ordered by ``(created_at, id)`` in
    ``filters.order``, strictly after ``filters.cursor``; at most ``filters.limit``
    rows when ``paged``."""
    statuses = filters.statuses()
    descending = filters.order == "desc"
    selected = sorted(
        (row for row in rows if _matches(filters, statuses, row)),
        key=_order_key,
        reverse=descending,
    )
    if filters.cursor is not None:
        cursor = filters.cursor
        selected = [
            row
            for row in selected
            if (_order_key(row) < cursor if descending else _order_key(row) > cursor)
        ]
    return selected[: filters.limit] if paged else selected
