"""The maintenance sweeps, the reclaim outbox and its visibility diagnostic.

Each sweep is one statement: ``FOR UPDATE SKIP LOCKED`` picks the rows (so a
row a worker is writing right now waits for the next sweep instead of
blocking it), the UPDATE moves them, and the history rows and at most one
``pg_notify`` ride along in the same statement.

The UPDATE finds each picked row by its id alone. Its status was checked as the row
was locked (on the row's latest version), and the lock keeps it so. Checked again,
it let the planner drive the join from a partial status index: with statistics
that say no row has that status (a burst since the last ANALYZE), it read every
such row once per picked row, and a turn of 5,000 took tens of seconds, past the
leader's bound, every time.
"""

from __future__ import annotations

from typing import Final

from taskq.backend.statemachine import JobStatus
from taskq_postgres._sql import FINALIZER_PARKED_AT, TransitionSQL

__all__ = [
    "DEADLINE_SWEEP",
    "EXPIRE_RESULTS",
    "POLL_RECLAIM_EVENTS",
    "RECLAIM_EXPIRED_LOCKS",
    "RECLAIM_VISIBILITY_RISK",
    "SCHEDULED_TO_PENDING",
]

_S = JobStatus

SCHEDULED_TO_PENDING: Final = TransitionSQL.of(
    _S.SCHEDULED,
    _S.PENDING,
    """
-- arbiter: clock_timestamp() (due check scheduled_at <= now)
-- $1 wake channel: one notify per statement, only when a job moved; $2 the most jobs
-- moved per statement (a backlog is moved in turns, each committed: in one statement
-- it outlasted the leader's bound and rolled back, every time).
WITH now AS MATERIALIZED (SELECT clock_timestamp() AS ts),
due AS (
    SELECT j.id
    FROM {schema}.jobs j CROSS JOIN now n
    WHERE j.status = 'scheduled' AND j.scheduled_at <= n.ts
    LIMIT $2
    FOR UPDATE OF j SKIP LOCKED
),
-- By the array of ids: joined to the CTE (estimated a full turn), the planner hashed
-- the whole jobs table, history and all, at every turn.
promoted AS (
    UPDATE {schema}.jobs j
    SET status = 'pending', updated_at = n.ts
    FROM now n
    WHERE j.id = ANY (ARRAY(SELECT d.id FROM due d))
    RETURNING j.id
),
events AS (
    INSERT INTO {schema}.job_events (job_id, kind, detail)
    SELECT p.id, 'state_change', '{"from_state": "scheduled", "to_state": "pending"}'
    FROM promoted p
    ORDER BY p.id
),
notified AS (
    SELECT pg_notify($1::text, '')
    WHERE $1::text IS NOT NULL AND EXISTS (SELECT 1 FROM promoted)
)
SELECT (SELECT count(*) FROM promoted) AS changed, (SELECT count(*) FROM notified) AS notified
""",
)

DEADLINE_SWEEP: Final = (
    """
-- arbiter: clock_timestamp() (deadline check schedule_to_close_deadline < now)
-- Waiting jobs only: a running job's worker enforces its deadline itself. Moves
-- pending -> failed and scheduled -> failed (guarded by status as locked), at most
-- $1 per statement. batch_tags: the metadata.batch_id of the batch children failed,
-- for the caller to apply to their batches.
WITH now AS MATERIALIZED (SELECT clock_timestamp() AS ts),
late AS (
    SELECT j.id, j.status
    FROM {schema}.jobs j CROSS JOIN now n
    WHERE j.schedule_to_close_deadline IS NOT NULL AND j.schedule_to_close_deadline < n.ts
      AND j.status IN ('pending', 'scheduled')
      -- Not a batch finalizer parked until its batch ends: its deadline starts then.
      AND j.scheduled_at < """
    + FINALIZER_PARKED_AT
    + """
    LIMIT $1
    FOR UPDATE OF j SKIP LOCKED
),
-- By arrays of the turn's ids and statuses, in the same order: joined to the CTE
-- (estimated at a full turn), the update hashed the whole jobs table, finished
-- history and all, at every turn. Unnested, they are a few rows to the planner, each
-- found by the primary key.
failed AS (
    UPDATE {schema}.jobs j
    SET status = 'failed', finished_at = n.ts, updated_at = n.ts,
        error_class = 'DeadlineExceeded',
        error_message = 'the job''s schedule_to_close deadline passed',
        error_traceback = NULL
    FROM unnest(ARRAY(SELECT l.id FROM late l ORDER BY l.id),
                ARRAY(SELECT l.status FROM late l ORDER BY l.id)) AS l (id, status)
         CROSS JOIN now n
    WHERE j.id = l.id
    RETURNING j.id, l.status AS from_status, j.metadata ->> 'batch_id' AS batch_tag
),
events AS (
    INSERT INTO {schema}.job_events (job_id, kind, detail)
    SELECT f.id, 'state_change',
           jsonb_build_object('from_state', f.from_status, 'to_state', 'failed',
                              'reason', 'deadline_exceeded')
    FROM failed f
    ORDER BY f.id
)
SELECT count(*) AS changed,
       array_agg(f.batch_tag ORDER BY f.id) FILTER (WHERE f.batch_tag IS NOT NULL)
           AS batch_tags
FROM failed f
"""
)

RECLAIM_EXPIRED_LOCKS: Final = TransitionSQL.of(
    _S.RUNNING,
    (_S.CANCELLED, _S.PENDING, _S.CRASHED),
    """
-- arbiter: clock_timestamp() (lease expiry lock_expires_at < now; the cancel wait past it;
-- the worker's silence last_seen_at <= now - $3; a retry's room deadline > now)
-- $1 the wait a job with a cancel in progress gets past its lease (cancel grace +
-- cleanup grace + headroom), $2 wake channel, $3 the worker silence (or NULL): a job
-- whose worker touched its row within it is alive, its lease lapsed only while another
-- transaction held the row or the table. A cancel requested -> cancelled; attempts
-- left before the deadline -> pending; else crashed. Each reclaim writes a crashed
-- attempt and one reclaimed event (the outbox poll_reclaim_events reads), and the statement
-- sends one notify when anything was reclaimed. $4: the most jobs per statement.
-- batch_ends: [metadata.batch_id, status] of each batch child ended (cancelled or
-- crashed, not one put back to pending), for the caller to apply to its batch.
WITH now AS MATERIALIZED (SELECT clock_timestamp() AS ts),
expired AS (
    SELECT j.id, j.attempt, j.max_attempts, j.locked_by_worker, j.cancel_phase,
           j.schedule_to_close_deadline AS deadline
    FROM {schema}.jobs j CROSS JOIN now n
    WHERE j.status = 'running' AND j.lock_expires_at < n.ts
      AND (j.cancel_phase = 0 OR j.lock_expires_at + $1::interval < n.ts)
      AND ($3::interval IS NULL OR NOT EXISTS (
          SELECT 1 FROM {schema}.workers w
          WHERE w.id = j.locked_by_worker AND w.last_seen_at > n.ts - $3::interval))
    LIMIT $4
    FOR UPDATE OF j SKIP LOCKED
),
decision AS (
    SELECT e.id, e.locked_by_worker,
           CASE
               WHEN e.cancel_phase >= 1 THEN 'cancelled'
               -- Past its deadline a retry could only fail: none is left.
               WHEN e.attempt < e.max_attempts
                    AND (e.deadline IS NULL OR e.deadline > n.ts) THEN 'pending'
               ELSE 'crashed'
           END::{schema}.job_status AS to_status,
           'worker ' || coalesce(e.locked_by_worker::text, 'None')
               || ' stopped renewing the job''s lock lease' AS crash_message
    FROM expired e CROSS JOIN now n
),
-- By arrays of the turn's decisions, in the same order, as the deadline sweep's.
-- Attempt and started_at are the job's own: the update leaves them as they were.
reclaimed AS (
    UPDATE {schema}.jobs j
    SET status = d.to_status, updated_at = n.ts,
        locked_by_worker = NULL, lock_expires_at = NULL,
        scheduled_at = CASE WHEN d.to_status = 'pending' THEN n.ts ELSE j.scheduled_at END,
        cancel_phase = CASE WHEN d.to_status = 'pending' THEN 0 ELSE j.cancel_phase END,
        cancel_requested_at = CASE WHEN d.to_status = 'pending' THEN NULL
                                   ELSE j.cancel_requested_at END,
        finished_at = CASE WHEN d.to_status = 'pending' THEN NULL ELSE n.ts END,
        -- The job's error is its last attempt's, as a retry's is: back to pending too
        -- (it showed an earlier attempt's error, or none).
        error_class = CASE WHEN d.to_status <> 'cancelled' THEN 'WorkerCrashed'
                           ELSE j.error_class END,
        error_message = CASE WHEN d.to_status <> 'cancelled' THEN d.crash_message
                             ELSE j.error_message END,
        error_traceback = CASE WHEN d.to_status <> 'cancelled' THEN NULL
                               ELSE j.error_traceback END
    FROM unnest(ARRAY(SELECT d.id FROM decision d ORDER BY d.id),
                ARRAY(SELECT d.to_status FROM decision d ORDER BY d.id),
                ARRAY(SELECT d.locked_by_worker FROM decision d ORDER BY d.id),
                ARRAY(SELECT d.crash_message FROM decision d ORDER BY d.id))
             AS d (id, to_status, locked_by_worker, crash_message)
         CROSS JOIN now n
    WHERE j.id = d.id
    -- What the history rows need, carried out: joined back to decision, two CTEs
    -- the planner sizes from the same statistics, a turn compared every pair.
    RETURNING j.id, j.attempt, d.locked_by_worker, j.started_at, n.ts, d.to_status,
              d.crash_message, j.metadata ->> 'batch_id' AS batch_tag
),
attempts AS (
    INSERT INTO {schema}.job_attempts (job_id, attempt, worker_id, started_at, finished_at,
        duration_ms, outcome, error_class, error_message)
    -- No duration: when its worker stopped is not known (finished_at is the reclaim's
    -- time, a lease or more after the last renewal).
    SELECT r.id, r.attempt, r.locked_by_worker, r.started_at, r.ts, NULL::bigint,
           'crashed', 'WorkerCrashed', r.crash_message
    FROM reclaimed r
),
events AS (
    INSERT INTO {schema}.job_events (job_id, kind, detail)
    SELECT r.id, 'reclaimed',
           jsonb_build_object('from_state', 'running', 'to_state', r.to_status,
                              'reason', 'lock_expired', 'worker_id', r.locked_by_worker::text)
    FROM reclaimed r
    ORDER BY r.id
),
notified AS (
    SELECT pg_notify($2::text, '')
    WHERE $2::text IS NOT NULL AND EXISTS (SELECT 1 FROM reclaimed)
)
SELECT (SELECT count(*) FROM reclaimed) AS changed, (SELECT count(*) FROM notified) AS notified,
       (SELECT array_agg(ARRAY[r.batch_tag, r.to_status::text] ORDER BY r.id)
        FROM reclaimed r
        WHERE r.batch_tag IS NOT NULL AND r.to_status <> 'pending') AS batch_ends
""",
)

POLL_RECLAIM_EVENTS: Final = """
-- arbiter: clock_timestamp() (visibility watermark occurred_at <= now - delay)
-- Only events older than the delay: by then any transaction holding a lower id has
-- committed or aborted (architecture.md, the trailing watermark). $1 cursor,
-- $2 delay, $3 limit.
SELECT e.id, e.job_id, e.occurred_at, e.kind, e.detail::text AS detail
FROM {schema}.job_events e
WHERE e.kind = 'reclaimed' AND e.id > $1 AND e.occurred_at <= clock_timestamp() - $2::interval
ORDER BY e.id
LIMIT $3
"""

RECLAIM_VISIBILITY_RISK: Final = """
-- arbiter: clock_timestamp() (transaction age compared with the visibility delay)
-- Transactions that hold a lock on job_events and began longer ago than the
-- visibility delay ($1): an event they insert may surface below a cursor that
-- already moved past it. A proxy signal: it cannot see whether they will insert.
SELECT a.pid, a.application_name, a.state, a.xact_start,
       clock_timestamp() - a.xact_start AS transaction_age,
       string_agg(DISTINCT l.mode, ', ' ORDER BY l.mode) AS lock_modes, a.query
FROM pg_locks l
JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'relation' AND l.granted
  AND l.relation = to_regclass('{schema}.job_events')
  AND l.pid <> pg_backend_pid()
  AND a.xact_start < clock_timestamp() - $1::interval
GROUP BY a.pid, a.application_name, a.state, a.xact_start, a.query
ORDER BY a.xact_start
"""

# Not a transition: the job keeps its status and result_expires_at (so a reader
# can tell an expired result from a job that returned nothing). ``result IS NOT
# NULL`` keeps the partial index scan from rewriting rows already cleared.
EXPIRE_RESULTS: Final = """
-- arbiter: clock_timestamp() (expiry check result_expires_at <= now)
-- At most $1 results per statement (a turn, as the sweeps above).
WITH now AS MATERIALIZED (SELECT clock_timestamp() AS ts),
due AS (
    SELECT j.id
    FROM {schema}.jobs j CROSS JOIN now n
    WHERE j.result_expires_at IS NOT NULL AND j.result_expires_at <= n.ts
      AND j.result IS NOT NULL
    LIMIT $1
    FOR UPDATE OF j SKIP LOCKED
),
-- By the array of ids, as the promotion's.
cleared AS (
    UPDATE {schema}.jobs j
    SET result = NULL, updated_at = n.ts
    FROM now n
    WHERE j.id = ANY (ARRAY(SELECT d.id FROM due d))
    RETURNING j.id
)
SELECT count(*) AS changed FROM cleared
"""
