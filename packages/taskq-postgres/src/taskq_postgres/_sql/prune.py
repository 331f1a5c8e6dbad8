"""Sweep 5 (prune terminal jobs into the archive) and Sweep 6 (archive expiry).

Each statement moves one batch atomically: the job and its attempts land in
the archive and leave the hot tables in the same statement (the job's events
go by cascade, they are not archived). The column lists are explicit because
a column added to ``jobs`` later is appended after the archive's own columns.

A job id is free again once its job left ``jobs``, so a caller enqueueing with
explicit ids (derived from a business key, say) can archive the same id twice.
The archive keeps one row per id: the later job replaces the earlier one and
its attempts, as on the in-memory backend. (An insert that failed on the key
instead would fail every later prune of that status: the batch would never move.)
"""

from __future__ import annotations

from typing import Final

__all__ = ["EXPIRE_ARCHIVE", "PRUNE_TERMINAL_JOBS"]

_JOB_COLUMNS: Final = (
    "id, actor, queue, status, priority, payload, scheduled_at, created_at, enqueued_at, "
    "attempt, max_attempts, locked_by_worker, lock_expires_at, started_at, "
    "execution_started_at, finished_at, cancel_requested_at, cancel_reason, cancel_phase, "
    "idempotency_key, identity_key, fairness_key, schedule_to_close_deadline, result, "
    "result_ttl, result_expires_at, progress_seq, progress_state, error_class, error_message, "
    "error_traceback, trace_id, span_id, metadata, tags, timeout, updated_at, singleton"
)
_ATTEMPT_COLUMNS: Final = (
    "id, job_id, attempt, worker_id, started_at, finished_at, duration_ms, outcome, "
    "error_class, error_message, error_traceback"
)


def _qualified(alias: str, columns: str) -> str:
    return ", ".join(f"{alias}.{c.strip()}" for c in columns.split(","))


def _replace_all(columns: str) -> str:
    """``(a, b) = ROW(excluded.a, excluded.b)``: every column but the key, as inserted."""
    names = [c.strip() for c in columns.split(",") if c.strip() != "id"]
    return f"({', '.join(names)}) = ROW({_qualified('excluded', ', '.join(names))})"


_REPLACE: Final = _replace_all(_JOB_COLUMNS + ", archived_at, expire_at")


PRUNE_TERMINAL_JOBS: Final = f"""
-- arbiter: clock_timestamp() (retention cutoff finished_at < now - $2; result expiry
-- result_expires_at <= now; archived_at and expire_at = now + $4)
-- $1 terminal status, $3 batch size. The clock is read once: a job's archived_at
-- and its attempts' are the same instant, and expire_at is exactly $4 later. The
-- statements below find the victims by an array of their ids: joined to the CTE, the
-- planner read the whole jobs and job_attempts tables at every batch.
-- $5: the last finished_at the batch before moved (the caller's first batch: any time
-- earlier than every job's). The jobs kept for their results lie among the victims;
-- each batch starting from the oldest job read them all again, every batch.
WITH now AS MATERIALIZED (SELECT clock_timestamp() AS ts),
victims AS MATERIALIZED (
    SELECT j.id, j.finished_at
    FROM {{schema}}.jobs j
    WHERE j.status = $1::text::{{schema}}.job_status
      -- The predicate of jobs_terminal_finished_idx, word for word: without it the
      -- planner cannot use the index for a status bound at run time, and every batch
      -- read and sorted all the status's jobs. (A status not terminal moves nothing.)
      AND j.status IN ('succeeded', 'failed', 'cancelled', 'crashed', 'abandoned')
      AND j.finished_at < (SELECT ts FROM now) - $2::interval
      AND j.finished_at >= $5::timestamptz
      -- A result_ttl longer than the retention wins: the archive is not readable, so
      -- a job archived earlier loses its result before its time.
      AND (j.result_expires_at IS NULL OR j.result_expires_at <= (SELECT ts FROM now))
    ORDER BY j.finished_at
    LIMIT $3
    FOR UPDATE OF j SKIP LOCKED
),
archived AS (
    INSERT INTO {{schema}}.jobs_archive ({_JOB_COLUMNS}, archived_at, expire_at)
    SELECT {_qualified("j", _JOB_COLUMNS)}, n.ts, n.ts + $4::interval
    FROM {{schema}}.jobs j CROSS JOIN now n
    WHERE j.id = ANY (ARRAY(SELECT v.id FROM victims v))
    ON CONFLICT (id) DO UPDATE SET {_REPLACE}
    RETURNING 1
),
-- The attempts of an earlier job archived under the same id go with the row it
-- replaced. The statement's snapshot does not see the attempts inserted below.
replaced_attempts AS (
    DELETE FROM {{schema}}.job_attempts_archive a
    WHERE a.job_id = ANY (ARRAY(SELECT v.id FROM victims v))
),
archived_attempts AS (
    INSERT INTO {{schema}}.job_attempts_archive ({_ATTEMPT_COLUMNS}, archived_at)
    SELECT {_qualified("a", _ATTEMPT_COLUMNS)}, n.ts
    FROM {{schema}}.job_attempts a CROSS JOIN now n
    WHERE a.job_id = ANY (ARRAY(SELECT v.id FROM victims v))
    RETURNING 1
),
removed AS (
    DELETE FROM {{schema}}.jobs j WHERE j.id = ANY (ARRAY(SELECT v.id FROM victims v)) RETURNING 1
)
SELECT (SELECT count(*) FROM removed) AS moved,
       (SELECT count(*) FROM archived) AS archived,
       (SELECT count(*) FROM archived_attempts) AS attempts,
       (SELECT max(v.finished_at) FROM victims v) AS last_finished
"""

EXPIRE_ARCHIVE: Final = """
-- arbiter: clock_timestamp() (expire_at < now)
WITH doomed AS (
    SELECT a.id FROM {schema}.jobs_archive a
    WHERE a.expire_at < clock_timestamp()
    ORDER BY a.expire_at
    LIMIT $1
    FOR UPDATE OF a SKIP LOCKED
),
-- By the array of ids: joined to the CTE, the planner read the whole archive (a year
-- of jobs) at every batch.
removed AS (
    DELETE FROM {schema}.jobs_archive a
    WHERE a.id = ANY (ARRAY(SELECT d.id FROM doomed d))
    RETURNING 1
)
SELECT count(*) FROM removed
"""
