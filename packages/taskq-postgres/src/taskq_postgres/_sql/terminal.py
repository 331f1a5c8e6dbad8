"""Terminal writes: each one statement, one round trip.

Every write follows the same shape: ``owned`` locks the row only while it is
``running`` (and, for the guarded writes, held by ``$2`` on attempt ``$3``
when given) and keeps its pre-update values; ``updated`` applies the move;
``attempt`` and ``event`` write the history rows from the same CTEs, so the
audit trail costs no extra round trip and commits with the move or not at all.

The success writes, the worker's most frequent, have no ``owned`` pass: their
guarded UPDATE is the lock, and what the attempt row needs (attempt,
started_at) is a column the move leaves as it was, so ``updated`` returns it.
Locking the rows first (``FOR UPDATE``: a second write to each row) made a
batched success of 16 about a tenth slower (bench/README.md). Under READ COMMITTED the UPDATE re-checks its
guard on a row another transaction changed meanwhile, so the guard holds as
firmly; the rows of a list are updated in id order when the sorted input drives
the join, and should two writers still meet in opposite orders Postgres ends
one with a deadlock error, which the writers retry (transient).
"""

from __future__ import annotations

from typing import Final

from taskq.backend.statemachine import JobStatus
from taskq.models import UNRUN_OUTCOMES
from taskq_postgres._sql import TransitionSQL, job_columns

__all__ = [
    "LATE_OUTCOME",
    "MARK_ABANDONED",
    "MARK_CANCELLED",
    "MARK_FAILED_OR_RETRY",
    "MARK_RETRY_AFTER",
    "MARK_SNOOZED",
    "MARK_SNOOZED_MANY",
    "MARK_SUCCEEDED",
    "MARK_SUCCEEDED_MANY",
    "RECORD_PROGRESS",
    "RETRY_JOB",
    "RETRY_TARGET",
    "WRITE_ATTEMPT",
    "WRITE_CANCEL_ESCALATION",
]

_S = JobStatus

# The owner's lock: running, held by $2, on attempt $3 when one is given.
_OWNED: Final = """
owned AS (
    SELECT j.id, j.attempt, j.max_attempts, j.started_at, j.locked_by_worker,
           j.schedule_to_close_deadline, j.cancel_requested_at
    FROM {schema}.jobs j
    WHERE j.id = $1 AND j.status = 'running' AND j.locked_by_worker = $2
      AND ($3::int IS NULL OR j.attempt = $3::int)
    FOR UPDATE
)"""

_DURATION_MS: Final = "greatest((extract(epoch FROM n.ts - o.started_at) * 1000)::bigint, 0)"

# An attempt whose code never ran (models.UNRUN_OUTCOMES) has no duration_ms: its
# times span a hold, from dispatch to hand-back, not a run.
_UNRUN: Final = ", ".join(f"'{outcome}'" for outcome in sorted(UNRUN_OUTCOMES))

# The attempt row and event of every job ``updated`` moved to succeeded; ``updated``
# returns id, attempt, started_at, worker_id and finished_at.
_SUCCEEDED_HISTORY: Final = """
attempt AS (
    INSERT INTO {schema}.job_attempts
        (job_id, attempt, worker_id, started_at, finished_at, duration_ms, outcome)
    SELECT u.id, u.attempt, u.worker_id, u.started_at, u.finished_at,
           greatest((extract(epoch FROM u.finished_at - u.started_at) * 1000)::bigint, 0),
           'succeeded'
    FROM updated u
),
event AS (
    INSERT INTO {schema}.job_events (job_id, kind, detail)
    SELECT u.id, 'state_change', '{"from_state": "running", "to_state": "succeeded"}'
    FROM updated u
)"""

MARK_SUCCEEDED: Final = TransitionSQL.of(
    _S.RUNNING,
    _S.SUCCEEDED,
    """
-- arbiter: clock_timestamp() (finished_at; result_expires_at = now + ttl)
-- $4 result (JSON text), $5 fallback result ttl, $6 progress_seq, $7 progress_state.
-- An earlier attempt's error is cleared: the job did not fail (job_attempts keep it).
-- No owned pass: the guarded UPDATE is the lock (module docstring).
WITH now AS MATERIALIZED (SELECT clock_timestamp() AS ts),
updated AS (
    UPDATE {schema}.jobs j
    SET status = 'succeeded', finished_at = n.ts, updated_at = n.ts,
        locked_by_worker = NULL, lock_expires_at = NULL,
        error_class = NULL, error_message = NULL, error_traceback = NULL,
        result = $4::text::jsonb,
        result_expires_at = n.ts + coalesce(j.result_ttl, $5::interval),
        progress_seq = greatest(j.progress_seq, $6::bigint),
        progress_state = CASE WHEN $6::bigint > j.progress_seq THEN $7::text::jsonb
                              ELSE j.progress_state END
    FROM now n
    WHERE j.id = $1 AND j.status = 'running' AND j.locked_by_worker = $2
      AND ($3::int IS NULL OR j.attempt = $3::int)
    RETURNING j.id, j.attempt, j.started_at, $2::uuid AS worker_id, n.ts AS finished_at
),"""
    + _SUCCEEDED_HISTORY
    + """
SELECT count(*) AS changed FROM updated
""",
)

MARK_SUCCEEDED_MANY: Final = TransitionSQL.of(
    _S.RUNNING,
    _S.SUCCEEDED,
    """
-- arbiter: clock_timestamp() (finished_at; result_expires_at = now + ttl)
-- MARK_SUCCEEDED for a list: $1 worker, $2 fallback result ttl, then one element per
-- job in the parallel arrays $3 ids, $4 attempts (NULL: any), $5 results (JSON text),
-- $6 progress_seq, $7 progress_state. Each row keeps its own ownership guard; the
-- positions (1-based) of the items that moved a row come back. No owned pass: the
-- guarded UPDATE is the lock, taken in id order as the sorted input drives the join
-- (module docstring). The ids are distinct (the caller writes items of one job in
-- turn); should one repeat, its first item stands.
WITH now AS MATERIALIZED (SELECT clock_timestamp() AS ts),
input AS (
    SELECT DISTINCT ON (i.id) i.*
    FROM unnest($3::uuid[], $4::int[], $5::text[], $6::bigint[], $7::text[])
        WITH ORDINALITY AS i (id, attempt, result, progress_seq, progress_state, position)
    ORDER BY i.id, i.position
),
updated AS (
    UPDATE {schema}.jobs j
    SET status = 'succeeded', finished_at = n.ts, updated_at = n.ts,
        locked_by_worker = NULL, lock_expires_at = NULL,
        error_class = NULL, error_message = NULL, error_traceback = NULL,
        result = i.result::jsonb,
        result_expires_at = n.ts + coalesce(j.result_ttl, $2::interval),
        progress_seq = greatest(j.progress_seq, i.progress_seq),
        progress_state = CASE WHEN i.progress_seq > j.progress_seq THEN i.progress_state::jsonb
                              ELSE j.progress_state END
    FROM input i CROSS JOIN now n
    WHERE j.id = i.id AND j.status = 'running' AND j.locked_by_worker = $1
      AND (i.attempt IS NULL OR j.attempt = i.attempt)
    RETURNING j.id, j.attempt, j.started_at, $1::uuid AS worker_id, n.ts AS finished_at,
        i.position
),"""
    + _SUCCEEDED_HISTORY
    + """
SELECT u.position FROM updated u
""",
)

# The rest of a decision CASE that would put a job back in the queue, over owned
# ``o``: a job whose cancel was requested is not run again, whoever missed the request
# (it can land between the worker's cancel polls, or meet a shutdown's hand-back), but
# ends cancelled; its attempt keeps the outcome it had.
_REQUEUE: Final = """WHEN o.cancel_requested_at IS NOT NULL THEN 'cancelled'
               WHEN {delay} > interval '0' THEN 'scheduled'
               ELSE 'pending'"""

MARK_FAILED_OR_RETRY: Final = TransitionSQL.of(
    _S.RUNNING,
    (_S.FAILED, _S.SCHEDULED, _S.PENDING, _S.CANCELLED),
    """
-- arbiter: clock_timestamp() (retry at now + delay; the retry must not pass the deadline)
-- $4..$6 the error, $7 retry delay (NULL: no retry), $8 progress_seq, $9 progress_state.
-- A retry of a job whose cancel was requested ends it cancelled instead. A failed
-- job's event says why it was not retried (its error is the actor's own).
WITH now AS MATERIALIZED (SELECT clock_timestamp() AS ts),"""
    + _OWNED
    + """,
decision AS (
    SELECT o.*, n.ts,
           CASE
               WHEN $7::interval IS NULL OR o.attempt >= o.max_attempts
                    OR n.ts + $7::interval > o.schedule_to_close_deadline THEN 'failed'
               """
    + _REQUEUE.format(delay="$7::interval")
    + """
           END::{schema}.job_status AS to_status,
           CASE
               WHEN $7::interval IS NULL AND $4 = 'DeadlineExceeded' THEN 'deadline_exceeded'
               WHEN $7::interval IS NULL THEN 'no_retry'
               WHEN o.attempt >= o.max_attempts THEN 'attempts_exhausted'
               WHEN n.ts + $7::interval > o.schedule_to_close_deadline
                   THEN 'retry_past_deadline'
           END AS fail_reason
    FROM owned o CROSS JOIN now n
),
updated AS (
    UPDATE {schema}.jobs j
    SET status = d.to_status, updated_at = d.ts,
        locked_by_worker = NULL, lock_expires_at = NULL,
        scheduled_at = CASE WHEN d.to_status IN ('failed', 'cancelled') THEN j.scheduled_at
                            ELSE d.ts + $7::interval END,
        finished_at = CASE WHEN d.to_status IN ('failed', 'cancelled') THEN d.ts END,
        error_class = $4, error_message = $5, error_traceback = $6,
        progress_seq = greatest(j.progress_seq, $8::bigint),
        progress_state = CASE WHEN $8::bigint > j.progress_seq THEN $9::text::jsonb
                              ELSE j.progress_state END
    FROM decision d
    WHERE j.id = d.id AND j.status = 'running'
    RETURNING """
    + job_columns("j")
    + """
),
attempt AS (
    INSERT INTO {schema}.job_attempts (job_id, attempt, worker_id, started_at, finished_at,
        duration_ms, outcome, error_class, error_message, error_traceback)
    SELECT o.id, o.attempt, o.locked_by_worker, o.started_at, n.ts, """
    + _DURATION_MS
    + """,
           'failed', $4, $5, $6
    FROM decision o JOIN updated u ON u.id = o.id CROSS JOIN now n
),
event AS (
    INSERT INTO {schema}.job_events (job_id, kind, detail)
    SELECT u.id, 'state_change',
           jsonb_build_object('from_state', 'running', 'to_state', u.status, 'reason',
               CASE u.status WHEN 'failed' THEN d.fail_reason
                             WHEN 'cancelled' THEN 'cancel_requested' ELSE 'retry' END)
    FROM updated u JOIN decision d ON d.id = u.id
)
SELECT * FROM updated
""",
)

MARK_CANCELLED: Final = TransitionSQL.of(
    _S.RUNNING,
    _S.CANCELLED,
    """
-- arbiter: clock_timestamp() (finished_at)
-- $4 progress_seq, $5 progress_state.
WITH now AS MATERIALIZED (SELECT clock_timestamp() AS ts),"""
    + _OWNED
    + """,
updated AS (
    UPDATE {schema}.jobs j
    SET status = 'cancelled', finished_at = n.ts, updated_at = n.ts,
        locked_by_worker = NULL, lock_expires_at = NULL,
        progress_seq = greatest(j.progress_seq, $4::bigint),
        progress_state = CASE WHEN $4::bigint > j.progress_seq THEN $5::text::jsonb
                              ELSE j.progress_state END
    FROM owned o CROSS JOIN now n
    WHERE j.id = o.id AND j.status = 'running'
    RETURNING j.id, j.cancel_reason
),
attempt AS (
    INSERT INTO {schema}.job_attempts
        (job_id, attempt, worker_id, started_at, finished_at, duration_ms, outcome)
    SELECT o.id, o.attempt, o.locked_by_worker, o.started_at, n.ts, """
    + _DURATION_MS
    + """, 'cancelled'
    FROM owned o JOIN updated u ON u.id = o.id CROSS JOIN now n
),
event AS (
    -- The cancel's reason, as a pending job's cancel event gives it.
    INSERT INTO {schema}.job_events (job_id, kind, detail)
    SELECT u.id, 'state_change',
           '{"from_state": "running", "to_state": "cancelled"}'::jsonb
           || CASE WHEN u.cancel_reason IS NULL THEN '{}'::jsonb
                   ELSE jsonb_build_object('reason', u.cancel_reason) END
    FROM updated u
)
SELECT count(*) AS changed FROM updated
""",
)

MARK_ABANDONED: Final = TransitionSQL.of(
    _S.RUNNING,
    _S.ABANDONED,
    """
-- arbiter: clock_timestamp() (finished_at)
-- The owner's heartbeat writes it once a forced cancel (phase 2) overran its grace.
-- $4 progress_seq, $5 progress_state.
WITH now AS MATERIALIZED (SELECT clock_timestamp() AS ts),"""
    + _OWNED
    + """,
updated AS (
    UPDATE {schema}.jobs j
    SET status = 'abandoned', finished_at = n.ts, updated_at = n.ts,
        locked_by_worker = NULL, lock_expires_at = NULL,
        progress_seq = greatest(j.progress_seq, $4::bigint),
        progress_state = CASE WHEN $4::bigint > j.progress_seq THEN $5::text::jsonb
                              ELSE j.progress_state END
    FROM owned o CROSS JOIN now n
    WHERE j.id = o.id AND j.status = 'running' AND j.cancel_phase = 2
    RETURNING j.id
),
attempt AS (
    INSERT INTO {schema}.job_attempts
        (job_id, attempt, worker_id, started_at, finished_at, duration_ms, outcome)
    SELECT o.id, o.attempt, o.locked_by_worker, o.started_at, n.ts, """
    + _DURATION_MS
    + """, 'abandoned'
    FROM owned o JOIN updated u ON u.id = o.id CROSS JOIN now n
),
event AS (
    INSERT INTO {schema}.job_events (job_id, kind, detail)
    SELECT u.id, 'state_change', '{"from_state": "running", "to_state": "abandoned"}'
    FROM updated u
)
SELECT count(*) AS changed FROM updated
""",
)

# The error class and message of a job failed because its deadline passed.
_DEADLINE_ERROR: Final = "'DeadlineExceeded', 'the job''s schedule_to_close deadline passed'"

# The snooze after the owned CTE: $4 delay, $5 metadata update (JSON text or NULL),
# $6 the attempt's outcome, $7 progress_seq, $8 progress_state.
_SNOOZE: Final = (
    """
decision AS (
    SELECT o.*, n.ts, e.error_class, e.error_message,
           CASE
               WHEN e.error_class IS NOT NULL THEN 'failed'
               """
    + _REQUEUE.format(delay="$4::interval")
    + """
           END::{schema}.job_status AS to_status
    FROM owned o CROSS JOIN now n
    LEFT JOIN (VALUES ("""
    + _DEADLINE_ERROR
    + """)) AS e (error_class, error_message)
        ON n.ts + $4::interval > o.schedule_to_close_deadline
),
updated AS (
    UPDATE {schema}.jobs j
    SET status = d.to_status, updated_at = d.ts,
        locked_by_worker = NULL, lock_expires_at = NULL,
        -- Given back only to a job that runs again (int4 max): a job that ends here
        -- showed attempts it could never use.
        max_attempts = CASE WHEN d.to_status IN ('failed', 'cancelled') THEN j.max_attempts
                            ELSE j.max_attempts + (j.max_attempts < 2147483647)::int END,
        metadata = CASE WHEN $5::text IS NULL THEN j.metadata
                        ELSE j.metadata || $5::text::jsonb END,
        scheduled_at = CASE WHEN d.to_status IN ('failed', 'cancelled') THEN j.scheduled_at
                            ELSE d.ts + $4::interval END,
        finished_at = CASE WHEN d.to_status IN ('failed', 'cancelled') THEN d.ts END,
        error_class = coalesce(d.error_class, j.error_class),
        error_message = coalesce(d.error_message, j.error_message),
        error_traceback = CASE WHEN d.error_class IS NULL THEN j.error_traceback END,
        progress_seq = greatest(j.progress_seq, $7::bigint),
        progress_state = CASE WHEN $7::bigint > j.progress_seq THEN $8::text::jsonb
                              ELSE j.progress_state END
    FROM decision d
    WHERE j.id = d.id AND j.status = 'running'
    RETURNING j.id, j.status, j.metadata ->> 'batch_id' AS batch_tag
),
attempt AS (
    INSERT INTO {schema}.job_attempts (job_id, attempt, worker_id, started_at, finished_at,
        duration_ms, outcome, error_class, error_message)
    SELECT o.id, o.attempt, o.locked_by_worker, o.started_at, n.ts,
           CASE WHEN $6::text NOT IN ("""
    + _UNRUN
    + ") THEN "
    + _DURATION_MS
    + """ END,
           $6::text, o.error_class, o.error_message
    FROM decision o JOIN updated u ON u.id = o.id CROSS JOIN now n
),
event AS (
    INSERT INTO {schema}.job_events (job_id, kind, detail)
    SELECT u.id, 'state_change',
           jsonb_build_object('from_state', 'running', 'to_state', u.status, 'reason',
               CASE u.status WHEN 'failed' THEN 'deadline_exceeded'
                             WHEN 'cancelled' THEN 'cancel_requested' ELSE $6::text END)
    FROM updated u
)
SELECT u.status::text AS to_status, u.batch_tag FROM updated u
"""
)

MARK_SNOOZED: Final = TransitionSQL.of(
    _S.RUNNING,
    (_S.SCHEDULED, _S.PENDING, _S.FAILED, _S.CANCELLED),
    """
-- arbiter: clock_timestamp() (run again at now + delay; the new time must not pass the deadline)
-- The snooze gives back the attempt it does not use (max_attempts + 1), so attempt
-- numbers stay unique.
WITH now AS MATERIALIZED (SELECT clock_timestamp() AS ts),"""
    + _OWNED
    + ","
    + _SNOOZE,
)

# Every job of the parallel arrays $1 ids / $3 attempts (NULL: any) that is running
# and held by $2, matched by any of its entries (an id given twice counts once: a
# stale attempt's entry beside the current one's does not hide it). Locked in id
# order (no deadlock with another list).
_OWNED_MANY: Final = """
owned AS (
    SELECT j.id, j.attempt, j.max_attempts, j.started_at, j.locked_by_worker,
           j.schedule_to_close_deadline, j.cancel_requested_at
    FROM {schema}.jobs j
    WHERE j.id = ANY($1::uuid[]) AND j.status = 'running' AND j.locked_by_worker = $2
      AND EXISTS (
          SELECT 1 FROM unnest($1::uuid[], $3::int[]) AS i (id, attempt)
          WHERE i.id = j.id AND (i.attempt IS NULL OR i.attempt = j.attempt)
      )
    ORDER BY j.id
    FOR UPDATE OF j
)"""

MARK_SNOOZED_MANY: Final = TransitionSQL.of(
    _S.RUNNING,
    (_S.SCHEDULED, _S.PENDING, _S.FAILED, _S.CANCELLED),
    """
-- arbiter: clock_timestamp() (run again at now + delay; the new time must not pass the deadline)
-- MARK_SNOOZED for a list, each job on its own guard: the shutdown's hand-back of the
-- jobs a worker locked but never started, in one statement (architecture.md, "Drain
-- phase"). One row per job that moved.
WITH now AS MATERIALIZED (SELECT clock_timestamp() AS ts),"""
    + _OWNED_MANY
    + ","
    + _SNOOZE,
)

MARK_RETRY_AFTER: Final = TransitionSQL.of(
    _S.RUNNING,
    (_S.SCHEDULED, _S.PENDING, _S.FAILED, _S.CANCELLED),
    """
-- arbiter: clock_timestamp() (run again at now + delay; the new time must not pass the deadline)
-- $4 delay, $5 consume_budget (false: a rate-limit denial that gives the attempt
-- back), $6 progress_seq, $7 progress_state. The deadline is checked first.
WITH now AS MATERIALIZED (SELECT clock_timestamp() AS ts),"""
    + _OWNED
    + """,
decision AS (
    SELECT o.*, n.ts, r.result,
           CASE
               WHEN r.result <> 'scheduled' THEN 'failed'
               """
    + _REQUEUE.format(delay="$4::interval")
    + """
           END::{schema}.job_status AS to_status,
           CASE r.result
               WHEN 'failed:DeadlineExceeded' THEN 'DeadlineExceeded'
               WHEN 'failed:MaxAttemptsExceeded' THEN 'MaxAttemptsExceeded'
           END AS error_class,
           CASE r.result
               WHEN 'failed:DeadlineExceeded' THEN 'the job''s schedule_to_close deadline passed'
               WHEN 'failed:MaxAttemptsExceeded'
                   THEN 'attempt ' || o.attempt || ' of ' || o.max_attempts || ' asked to retry'
           END AS error_message
    FROM owned o CROSS JOIN now n
    CROSS JOIN LATERAL (
        SELECT CASE
                   WHEN n.ts + $4::interval > o.schedule_to_close_deadline
                       THEN 'failed:DeadlineExceeded'
                   WHEN $5::bool AND o.attempt >= o.max_attempts THEN 'failed:MaxAttemptsExceeded'
                   ELSE 'scheduled'
               END AS result
    ) r
),
updated AS (
    UPDATE {schema}.jobs j
    SET status = d.to_status, updated_at = d.ts,
        locked_by_worker = NULL, lock_expires_at = NULL,
        max_attempts = CASE WHEN $5::bool OR d.to_status IN ('failed', 'cancelled')
                                THEN j.max_attempts
                            ELSE j.max_attempts + (j.max_attempts < 2147483647)::int END,
        scheduled_at = CASE WHEN d.to_status IN ('failed', 'cancelled') THEN j.scheduled_at
                            ELSE d.ts + $4::interval END,
        finished_at = CASE WHEN d.to_status IN ('failed', 'cancelled') THEN d.ts END,
        error_class = coalesce(d.error_class, j.error_class),
        error_message = coalesce(d.error_message, j.error_message),
        error_traceback = CASE WHEN d.error_class IS NULL THEN j.error_traceback END,
        progress_seq = greatest(j.progress_seq, $6::bigint),
        progress_state = CASE WHEN $6::bigint > j.progress_seq THEN $7::text::jsonb
                              ELSE j.progress_state END
    FROM decision d
    WHERE j.id = d.id AND j.status = 'running'
    RETURNING j.id, j.status
),
attempt AS (
    INSERT INTO {schema}.job_attempts (job_id, attempt, worker_id, started_at, finished_at,
        duration_ms, outcome, error_class, error_message)
    SELECT o.id, o.attempt, o.locked_by_worker, o.started_at, n.ts, """
    + _DURATION_MS
    + """,
           CASE WHEN $5::bool THEN 'retry_after' ELSE 'rate_limit_denied' END,
           o.error_class, o.error_message
    FROM decision o JOIN updated u ON u.id = o.id CROSS JOIN now n
),
event AS (
    INSERT INTO {schema}.job_events (job_id, kind, detail)
    SELECT u.id, 'state_change',
           jsonb_build_object('from_state', 'running', 'to_state', u.status, 'reason',
               CASE WHEN u.status = 'cancelled' THEN 'cancel_requested'
                    WHEN u.status <> 'failed' AND $5::bool THEN 'retry_after'
                    WHEN u.status <> 'failed' THEN 'rate_limit_denied'
                    WHEN d.error_class = 'DeadlineExceeded' THEN 'deadline_exceeded'
                    ELSE 'attempts_exhausted' END)
    FROM updated u JOIN decision d ON d.id = u.id
)
SELECT CASE WHEN u.status = 'cancelled' THEN 'cancelled' ELSE d.result END AS result
FROM decision d JOIN updated u ON u.id = d.id
""",
)

WRITE_CANCEL_ESCALATION: Final = """
-- arbiter: none (no time predicate)
-- Cancel phase 1 -> 2 for the owner; the status does not change, so this is not a
-- state-machine transition. $1 job, $2 worker, $3 attempt or NULL.
WITH escalated AS (
    UPDATE {schema}.jobs j
    SET cancel_phase = 2, updated_at = clock_timestamp()
    WHERE j.id = $1 AND j.status = 'running' AND j.locked_by_worker = $2
      AND ($3::int IS NULL OR j.attempt = $3::int) AND j.cancel_phase = 1
    RETURNING j.id
),
event AS (
    INSERT INTO {schema}.job_events (job_id, kind, detail)
    SELECT e.id, 'cancel_escalated', '{"from_phase": 1, "to_phase": 2}' FROM escalated e
)
SELECT count(*) AS changed FROM escalated
"""

RETRY_JOB: Final = """
-- arbiter: clock_timestamp() (scheduled_at = now; the deadline check deadline <= now)
-- An operator reset of a finished job, not a state-machine transition (terminal
-- statuses have none). A job that spent its budget gets one more attempt. A singleton
-- comes back only while no other active job holds its identity (holder: the one that
-- does); the caller holds the singleton's lock (SINGLETON_LOCKS), taken in an earlier
-- statement of the transaction so that this one's snapshot sees a competing enqueue.
-- A job past its schedule_to_close deadline is not retried (late: its deadline): it
-- could only fail again at once. Nor is a child of an aborted batch (aborted: its
-- batch): the leader's sweep cancels an aborted batch's waiting children again.
-- $1 job, $2 wake channel.
WITH now AS MATERIALIZED (SELECT clock_timestamp() AS ts),
target AS (
    SELECT j.id, j.status, j.actor, j.identity_key, j.singleton, j.schedule_to_close_deadline,
           j.metadata ->> 'batch_id' AS batch_id
    FROM {schema}.jobs j
    WHERE j.id = $1 AND j.status IN ('failed', 'crashed', 'cancelled', 'abandoned')
    FOR UPDATE
),
late AS (
    SELECT t.schedule_to_close_deadline AS deadline
    FROM target t CROSS JOIN now n
    WHERE t.schedule_to_close_deadline <= n.ts
),
aborted AS (
    SELECT b.id
    FROM target t JOIN {schema}.batches b ON b.id = t.batch_id::uuid
    WHERE b.status = 'aborted'
),
holder AS (
    SELECT o.id
    FROM target t
    JOIN {schema}.jobs o ON o.actor = t.actor AND o.identity_key = t.identity_key
    WHERE t.singleton AND o.id <> t.id AND o.status IN ('pending', 'scheduled', 'running')
    LIMIT 1
),
retried AS (
    UPDATE {schema}.jobs j
    SET status = 'pending', scheduled_at = n.ts, enqueued_at = n.ts, updated_at = n.ts,
        max_attempts = greatest(j.max_attempts, j.attempt + 1),
        locked_by_worker = NULL, lock_expires_at = NULL,
        cancel_phase = 0, cancel_requested_at = NULL, cancel_reason = NULL,
        finished_at = NULL, result = NULL, result_expires_at = NULL,
        error_class = NULL, error_message = NULL, error_traceback = NULL
    FROM target t CROSS JOIN now n
    WHERE j.id = t.id AND NOT EXISTS (SELECT 1 FROM holder) AND NOT EXISTS (SELECT 1 FROM late)
      AND NOT EXISTS (SELECT 1 FROM aborted)
    RETURNING j.id, t.status AS from_status
),
event AS (
    INSERT INTO {schema}.job_events (job_id, kind, detail)
    SELECT r.id, 'state_change',
           jsonb_build_object('from_state', r.from_status, 'to_state', 'pending',
                              'reason', 'retried')
    FROM retried r
),
notified AS (
    SELECT pg_notify($2::text, '')
    WHERE $2::text IS NOT NULL AND EXISTS (SELECT 1 FROM retried)
)
SELECT (SELECT count(*) FROM retried) AS changed, (SELECT count(*) FROM notified) AS notified,
       (SELECT h.id FROM holder h) AS holder, (SELECT l.deadline FROM late l) AS late,
       (SELECT a.id FROM aborted a) AS aborted
"""

RETRY_TARGET: Final = """
-- arbiter: none
-- What RETRY_JOB needs to know first: whether the job is a singleton, and its identity.
SELECT actor, identity_key, singleton FROM {schema}.jobs WHERE id = $1
"""

WRITE_ATTEMPT: Final = (
    """
-- arbiter: none (stores the times it is given)
-- Insert or replace by (job_id, attempt): job_attempts has a surrogate key, so
-- update the existing row if there is one, else insert. An attempt that never ran
-- has no duration_ms. Nothing is written for a job that does not exist; whether it
-- does comes back. Its row is locked (KEY SHARE, what a foreign key's check took):
-- a prune deleting the job waits, and deletes the attempt with it.
-- $1 job, $2 attempt, $3 worker, $4 started_at, $5 finished_at, $6 outcome, $7..$9 error.
WITH job AS (SELECT j.id FROM {schema}.jobs j WHERE j.id = $1 FOR KEY SHARE),
duration AS (
    SELECT CASE WHEN $6::text NOT IN ("""
    + _UNRUN
    + """) THEN greatest(
               (extract(epoch FROM $5::timestamptz - $4::timestamptz) * 1000)::bigint, 0
           ) END AS ms
),
replaced AS (
    UPDATE {schema}.job_attempts a
    SET worker_id = $3, started_at = $4::timestamptz, finished_at = $5::timestamptz,
        duration_ms = (SELECT ms FROM duration),
        outcome = $6, error_class = $7, error_message = $8, error_traceback = $9
    WHERE a.job_id = (SELECT job.id FROM job) AND a.attempt = $2
    RETURNING a.id
),
added AS (
    INSERT INTO {schema}.job_attempts (job_id, attempt, worker_id, started_at, finished_at,
        duration_ms, outcome, error_class, error_message, error_traceback)
    SELECT job.id, $2, $3, $4::timestamptz, $5::timestamptz, (SELECT ms FROM duration),
           $6, $7, $8, $9
    FROM job
    WHERE NOT EXISTS (SELECT 1 FROM replaced)
)
SELECT EXISTS (SELECT 1 FROM job)
"""
)


RECORD_PROGRESS: Final = """
-- arbiter: none (ownership and progress_seq only)
-- $1 job, $2 worker, $3 attempt or NULL, $4 progress_seq, $5 progress_state (JSON text).
-- True while the caller owns the job; the row changes only for newer progress. The
-- row is locked, as by the terminal writes: read unlocked, a reclaim committing while
-- the write waited for the row let a dead worker's progress land on a finished job.
WITH owned AS (
    SELECT j.id FROM {schema}.jobs j
    WHERE j.id = $1 AND j.status = 'running' AND j.locked_by_worker = $2
      AND ($3::int IS NULL OR j.attempt = $3::int)
    FOR UPDATE
),
updated AS (
    UPDATE {schema}.jobs j
    SET progress_seq = $4::bigint, progress_state = $5::text::jsonb, updated_at = clock_timestamp()
    FROM owned o
    WHERE j.id = o.id AND j.progress_seq < $4::bigint
    RETURNING j.id
)
SELECT EXISTS (SELECT 1 FROM owned)
"""

LATE_OUTCOME: Final = """
-- arbiter: clock_timestamp() (occurred_at, the column default)
-- A late_outcome event for job $1 (detail $2, JSON text), if the job exists and its
-- history has none that contains $3 (the attempt, worker and outcome: a retry whose
-- first try landed adds nothing); nothing else changes. Whether the job exists. Its
-- row is locked (KEY SHARE), so that a prune deleting the job deletes this event too.
WITH job AS (SELECT j.id FROM {schema}.jobs j WHERE j.id = $1 FOR KEY SHARE),
added AS (
    INSERT INTO {schema}.job_events (job_id, kind, detail)
    SELECT job.id, 'late_outcome', $2::text::jsonb FROM job
    WHERE NOT EXISTS (
        SELECT 1 FROM {schema}.job_events e
        WHERE e.job_id = $1 AND e.kind = 'late_outcome' AND e.detail @> $3::text::jsonb
    )
)
SELECT EXISTS (SELECT 1 FROM job)
"""
