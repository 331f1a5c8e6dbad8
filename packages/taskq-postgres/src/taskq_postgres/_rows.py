"""Between Python values and Postgres: records to models, values to parameters.

JSON travels as text (``::text`` in the select lists, ``$n::text::jsonb`` in
the statements), so the backend works on any caller connection whatever json
codecs it has configured; what goes in is made storable by
:mod:`taskq.backend.storable` (NULs replaced, NaN refused), as on every backend.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, cast

from taskq.backend.statemachine import JobStatus, parse_cancel_phase, parse_status
from taskq.backend.storable import load_json
from taskq.models import (
    AttemptOutcome,
    AttemptRow,
    BatchCounts,
    BatchRow,
    BatchStatus,
    CancelFlag,
    ErrorInfo,
    EventKind,
    EventRow,
    JobRow,
    ScheduleRecord,
    from_valid_values,
)

__all__ = [
    "LongRunningJobEventsWriter",
    "attempt_row",
    "batch_counts",
    "batch_row",
    "cancel_flag",
    "event_row",
    "job_row",
    "schedule_record",
    "writer_row",
]

Record = Mapping[str, Any]
"""An ``asyncpg.Record`` (read by column name)."""


def _error(record: Record) -> ErrorInfo | None:
    if record["error_class"] is None:
        return None
    return ErrorInfo(
        error_class=record["error_class"],
        message=record["error_message"] or "",
        traceback=record["error_traceback"],
    )


def job_row(record: Record) -> JobRow:
    """A ``jobs`` record (selected with ``job_columns``) as a :class:`JobRow`.

    What TaskQ writes was validated on the way in, and the columns' types, NOT
    NULLs and enums keep it so; the row is built without validating it again
    (this runs for every job dispatched).
    """
    return from_valid_values(
        JobRow,
        {
            "id": record["id"],
            "actor": record["actor"],
            "queue": record["queue"],
            "status": parse_status(record["status"]),
            "payload": load_json(record["payload"]),
            "priority": record["priority"],
            "attempt": record["attempt"],
            "max_attempts": record["max_attempts"],
            "created_at": record["created_at"],
            "scheduled_at": record["scheduled_at"],
            "started_at": record["started_at"],
            "execution_started_at": record["execution_started_at"],
            "finished_at": record["finished_at"],
            "locked_by_worker": record["locked_by_worker"],
            "lock_expires_at": record["lock_expires_at"],
            "cancel_requested_at": record["cancel_requested_at"],
            "cancel_reason": record["cancel_reason"],
            "cancel_phase": parse_cancel_phase(record["cancel_phase"]),
            "idempotency_key": record["idempotency_key"],
            "identity_key": record["identity_key"],
            "fairness_key": record["fairness_key"],
            "deadline_at": record["schedule_to_close_deadline"],
            "timeout": record["timeout"],
            "result": load_json(record["result"]),
            "result_ttl": record["result_ttl"],
            "result_expires_at": record["result_expires_at"],
            "progress_seq": record["progress_seq"],
            "progress_state": load_json(record["progress_state"]),
            "error": _error(record),
            "metadata": load_json(record["metadata"]),
            "tags": list(record["tags"]),
            "trace_id": record["trace_id"],
            "span_id": record["span_id"],
        },
    )


def attempt_row(record: Record) -> AttemptRow:
    """A ``job_attempts`` record as an :class:`AttemptRow`."""
    return AttemptRow(
        job_id=record["job_id"],
        attempt=record["attempt"],
        worker_id=record["worker_id"],
        started_at=record["started_at"],
        finished_at=record["finished_at"],
        outcome=cast(AttemptOutcome, record["outcome"]),
        error=_error(record),
    )


def event_row(record: Record) -> EventRow:
    """A ``job_events`` record as an :class:`EventRow`."""
    return EventRow(
        event_id=record["id"],
        job_id=record["job_id"],
        occurred_at=record["occurred_at"],
        kind=cast(EventKind, record["kind"]),
        detail=load_json(record["detail"]),
    )


def cancel_flag(record: Record) -> CancelFlag:
    """A flagged running job as a :class:`CancelFlag`."""
    return CancelFlag(
        job_id=record["id"],
        cancel_phase=parse_cancel_phase(record["cancel_phase"]),
        cancel_requested_at=record["cancel_requested_at"],
        reason=record["cancel_reason"],
    )


def batch_row(record: Record) -> BatchRow:
    """A ``batches`` record (selected with ``BATCH_COLUMNS``) as a :class:`BatchRow`."""
    return BatchRow(
        id=record["id"],
        queue=record["queue"],
        status=cast(BatchStatus, record["status"]),
        expected_size=record["expected_size"],
        consecutive_failures=record["consecutive_failures"],
        failure_threshold=record["failure_threshold"],
        finalizer_job_id=record["finalizer_job_id"],
        originating_actor=record["originating_actor"],
        created_at=record["created_at"],
        completed_at=record["completed_at"],
        metadata=load_json(record["metadata"]),
    )


def batch_counts(record: Record) -> BatchCounts:
    """The ``statuses`` / ``counts`` arrays of a ``LIST_BATCHES`` record."""
    statuses: list[str] = record["statuses"] or []
    counts: list[int] = record["counts"] or []
    by_status = {JobStatus(s): n for s, n in zip(statuses, counts, strict=True)}
    return BatchCounts(total=sum(by_status.values()), by_status=by_status)


def schedule_record(record: Record) -> ScheduleRecord:
    """A ``schedules`` record (selected with ``SCHEDULE_COLUMNS``) as a :class:`ScheduleRecord`."""
    return ScheduleRecord(
        id=record["id"],
        name=record["name"],
        actor=record["actor"],
        cron=record["cron"],
        payload=load_json(record["payload"]),
        queue=record["queue"],
        timezone=record["timezone"],
        enabled=record["enabled"],
        options=load_json(record["options"]),
        next_fire_at=record["next_fire_at"],
        last_fired_at=record["last_fired_at"],
        created_at=record["created_at"],
        updated_at=record["updated_at"],
    )


@dataclass(frozen=True)
class LongRunningJobEventsWriter:
    """A transaction that has held a lock on ``job_events`` longer than the reclaim
    visibility delay (``PostgresBackend.check_reclaim_visibility_delay_risk``).

    A proxy for a gap in the reclaim feed, not proof of one: it may never insert
    an event, or may be an unrelated transaction that once touched the table.
    """

    pid: int
    application_name: str
    state: str | None
    transaction_started_at: datetime
    transaction_age: timedelta
    lock_modes: str
    query: str | None


def writer_row(record: Record) -> LongRunningJobEventsWriter:
    """A ``RECLAIM_VISIBILITY_RISK`` record."""
    return LongRunningJobEventsWriter(
        pid=record["pid"],
        application_name=record["application_name"] or "",
        state=record["state"],
        transaction_started_at=record["xact_start"],
        transaction_age=record["transaction_age"],
        lock_modes=record["lock_modes"],
        query=record["query"],
    )
