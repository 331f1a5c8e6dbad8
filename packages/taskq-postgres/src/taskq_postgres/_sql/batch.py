"""Batches: the batch rows and the batch operations on their jobs.

A batch's children are the jobs whose ``metadata ->> 'batch_id'`` is the
batch id (``jobs_batch_id_idx`` serves the lookup: every predicate says
``metadata ? 'batch_id'`` so the partial index applies); its finalizer, named
by ``batches.finalizer_job_id``, is never one of them.
"""

from __future__ import annotations

from typing import Final

from taskq_postgres._sql import job_columns

__all__ = [
    "ABORT_BATCH",
    "ADD_BATCH_FAILURES",
    "BATCH_COLUMNS",
    "BATCH_HAS_ACTIVE_CHILDREN",
    "BATCH_REPLAY_JOBS",
    "CANCEL_ABORTED_CHILDREN",
    "CANCEL_ABORTED_LEFTOVERS",
    "COMPLETE_BATCH",
    "COMPLETE_STALE_BATCHES",
    "COUNT_BATCH_NON_TERMINAL",
    "CREATE_BATCH",
    "GET_BATCH",
    "INSERT_BATCH_ROW",
    "LIST_BATCHES",
    "PRUNE_OLD_BATCHES",
    "RESET_BATCH_FAILURES",
]

BATCH_COLUMNS: Final = (
    "b.id, b.queue, b.status, b.expected_size, b.consecutive_failures, b.failure_threshold, "
    "b.finalizer_job_id, b.originating_actor, b.created_at, b.completed_at, "
    "b.metadata::text AS metadata"
)

# The children of batch $1 (uuid) that are not its finalizer, over alias j.
_CHILDREN_OF_B: Final = """j.metadata ? 'batch_id' AND j.metadata ->> 'batch_id' = b.id::text
      AND j.id IS DISTINCT FROM b.finalizer_job_id"""

CREATE_BATCH: Final = """
-- arbiter: clock_timestamp() (created_at, the column default)
INSERT INTO {schema}.batches
    (id, queue, expected_size, failure_threshold, finalizer_job_id, originating_actor)
VALUES ($1, $2, $3, $4, $5, $6)
"""

INSERT_BATCH_ROW: Final = """
-- arbiter: clock_timestamp() (created_at when the row brings none)
INSERT INTO {schema}.batches (id, queue, status, expected_size, consecutive_failures,
    failure_threshold, finalizer_job_id, originating_actor, created_at, completed_at, metadata)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, coalesce($9::timestamptz, clock_timestamp()), $10,
        $11::text::jsonb)
"""

# $2 failures at once (1: increment_batch_failures), no more than reach the threshold:
# one at a time, they stop there (the batch aborts, its streak over).
ADD_BATCH_FAILURES: Final = (
    """
-- arbiter: none
UPDATE {schema}.batches b
SET consecutive_failures = CASE
    WHEN b.failure_threshold IS NULL THEN b.consecutive_failures + $2::int
    ELSE least(b.consecutive_failures + $2::int,
               greatest(b.failure_threshold, b.consecutive_failures + 1))
END
WHERE b.id = $1 AND b.status = 'active'  -- a finished batch's streak is over
-- Whether a child is left, not how many: counted, each failure of a large batch
-- read all its waiting children (quadratic over a batch whose children fail).
RETURNING b.consecutive_failures, b.failure_threshold,
    EXISTS (SELECT 1 FROM {schema}.jobs j
            WHERE """
    + _CHILDREN_OF_B
    + """
              AND j.status IN ('pending', 'scheduled', 'running'))::int AS non_terminal
"""
)

# Over alias b: its failed children that ended after its last success, in the order they
# ended. Ending a batch, its hooks' streak may lag: children that ended together each
# found none left, and the hook that completed the batch came before the others' failures.
_TRAILING_FAILURES: Final = (
    """(SELECT count(*) FROM {schema}.jobs j
     WHERE """
    + _CHILDREN_OF_B
    + """ AND j.status = 'failed'
       AND j.finished_at > coalesce(
           (SELECT max(s.finished_at) FROM {schema}.jobs s
            WHERE """
    + _CHILDREN_OF_B.replace("j.", "s.")
    + """ AND s.status = 'succeeded'),
           '-infinity'))"""
)

RESET_BATCH_FAILURES: Final = """
-- arbiter: none
-- Not a streak that reached its threshold: that batch aborts (a success whose hook came
-- between a failure's and its abort reset it, then completed the batch).
UPDATE {schema}.batches SET consecutive_failures = 0
WHERE id = $1 AND status = 'active'
  AND (failure_threshold IS NULL OR consecutive_failures < failure_threshold)
"""

# Shared by abort and complete: the finalizer of a batch just finished goes to
# pending now, with its event, and the workers get one wake.
_RELEASE_FINALIZER: Final = """
released AS (
    UPDATE {schema}.jobs j
    SET status = 'pending', scheduled_at = n.ts, updated_at = n.ts,
        -- Its schedule_to_close counts from here: parked, it had nothing to run.
        schedule_to_close_deadline = n.ts + (j.schedule_to_close_deadline - j.created_at)
    FROM finished f CROSS JOIN now n
    WHERE j.id = f.finalizer_job_id AND j.status = 'scheduled'
    RETURNING j.id
),
released_events AS (
    INSERT INTO {schema}.job_events (job_id, kind, detail)
    SELECT r.id, 'state_change', '{"from_state": "scheduled", "to_state": "pending"}'
    FROM released r
),
notified AS (
    SELECT pg_notify($2::text, '')
    WHERE $2::text IS NOT NULL AND EXISTS (SELECT 1 FROM released)
)"""

# The children locked in CTE ``children`` (id, status) -> cancelled, with their events;
# ``now`` the statement's clock.
_CANCEL_CHILDREN: Final = """cancelled AS (
    UPDATE {schema}.jobs j
    SET status = 'cancelled', finished_at = n.ts, updated_at = n.ts,
        error_class = 'BatchAborted',
        error_message = 'Batch aborted due to consecutive failures',
        error_traceback = NULL
    FROM children c CROSS JOIN now n
    WHERE j.id = c.id  -- waiting as locked (see sweeps.py on joins by id)
    RETURNING j.id, c.status AS from_status
),
cancelled_events AS (
    INSERT INTO {schema}.job_events (job_id, kind, detail)
    SELECT c.id, 'state_change',
           jsonb_build_object('from_state', c.from_status, 'to_state', 'cancelled',
                              'reason', 'batch_aborted')
    FROM cancelled c
    ORDER BY c.id
)"""

ABORT_BATCH: Final = (
    """
-- arbiter: clock_timestamp() (completed_at; finished_at of the cancelled children)
-- An active batch (or none with that id: its children are still cancelled) ->
-- aborted; its waiting children -> cancelled, at most $3 of them (CANCEL_ABORTED_CHILDREN
-- takes the rest in turns: all in one statement, 200,000 took longer than the
-- worker's command timeout, so the batch was never aborted); its finalizer -> pending.
-- A finished batch is left alone. $1 batch id, $2 wake channel.
WITH now AS MATERIALIZED (SELECT clock_timestamp() AS ts),
batch AS (
    SELECT b.id, b.status, b.finalizer_job_id FROM {schema}.batches b WHERE b.id = $1 FOR UPDATE
),
proceed AS (SELECT WHERE NOT EXISTS (SELECT 1 FROM batch WHERE status <> 'active')),
children AS (
    SELECT j.id, j.status
    FROM {schema}.jobs j CROSS JOIN proceed
    WHERE j.metadata ? 'batch_id' AND j.metadata ->> 'batch_id' = $1::uuid::text
      AND j.id IS DISTINCT FROM (SELECT finalizer_job_id FROM batch)
      AND j.status IN ('pending', 'scheduled')
    LIMIT $3
    FOR UPDATE OF j
),
"""
    + _CANCEL_CHILDREN
    + """,
finished AS (
    UPDATE {schema}.batches b
    SET status = 'aborted', completed_at = n.ts
    FROM now n
    WHERE b.id = $1 AND b.status = 'active'
    RETURNING b.finalizer_job_id
),"""
    + _RELEASE_FINALIZER
    + """
SELECT (SELECT count(*) FROM cancelled) AS cancelled, (SELECT count(*) FROM notified) AS notified
"""
)

CANCEL_ABORTED_CHILDREN: Final = (
    """
-- arbiter: clock_timestamp() (finished_at of the cancelled children)
-- A turn of an abort: at most $2 waiting children of batch $1 -> cancelled, when the
-- batch is aborted (or has no row); its finalizer is none of them. Returns how many.
WITH now AS MATERIALIZED (SELECT clock_timestamp() AS ts),
batch AS (SELECT b.status, b.finalizer_job_id FROM {schema}.batches b WHERE b.id = $1),
children AS (
    SELECT j.id, j.status
    FROM {schema}.jobs j
    WHERE j.metadata ? 'batch_id' AND j.metadata ->> 'batch_id' = $1::uuid::text
      AND j.id IS DISTINCT FROM (SELECT finalizer_job_id FROM batch)
      AND j.status IN ('pending', 'scheduled')
      AND NOT EXISTS (SELECT 1 FROM batch WHERE status <> 'aborted')
    LIMIT $2
    FOR UPDATE OF j
),
"""
    + _CANCEL_CHILDREN
    + """
SELECT count(*) FROM cancelled
"""
)

# A batch id as the batches' own ids print (uuid::text): only such a tag names a batch,
# and only such a tag may be cast (a tag set by hand may be any text).
_BATCH_ID_TEXT: Final = "'^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'"

# The next batch id after {after} among the jobs pending, scheduled or running: one
# descent of jobs_batch_active_idx (its predicate word for word, so that it applies).
_NEXT_ACTIVE_TAG: Final = """(SELECT j.metadata ->> 'batch_id'
     FROM {schema}.jobs j
     WHERE j.metadata ? 'batch_id' AND j.status IN ('pending', 'scheduled', 'running')
       AND j.metadata ->> 'batch_id' > {after}
     ORDER BY j.metadata ->> 'batch_id'
     LIMIT 1)"""

CANCEL_ABORTED_LEFTOVERS: Final = (
    """
-- arbiter: clock_timestamp() (finished_at of the cancelled children)
-- The stale-batch sweep's turn for the waiting children of aborted batches: those an
-- abort cut short left (the worker died between its turns), and a child running at the
-- abort that was retried or reclaimed after it. Only a batch with a child pending,
-- scheduled or running can have one, so the turn walks those batches' ids, not the
-- aborted batches (all of them, each probed for a child, grew with the history at every
-- call): one window of at most $2 ids after $1 (the last of the window before; '' at
-- first), an index descent each; at most $3 waiting children of the aborted batches
-- among them -> cancelled. SKIP LOCKED: an abort still going on keeps its own.
WITH RECURSIVE now AS MATERIALIZED (SELECT clock_timestamp() AS ts),
tags (tag, n) AS (
    SELECT """
    + _NEXT_ACTIVE_TAG.replace("{after}", "$1::text")
    + """, 1
    UNION ALL
    SELECT """
    + _NEXT_ACTIVE_TAG.replace("{after}", "t.tag")
    + """, t.n + 1
    FROM tags t
    WHERE t.tag IS NOT NULL AND t.n < $2
),
win AS MATERIALIZED (SELECT t.tag FROM tags t WHERE t.tag IS NOT NULL),
b AS (
    SELECT b.id, b.finalizer_job_id
    FROM win w
    JOIN {schema}.batches b ON b.id = CASE WHEN w.tag ~ """
    + _BATCH_ID_TEXT
    + """ THEN w.tag::uuid END
    WHERE b.status = 'aborted'
),
children AS (
    SELECT j.id, j.status
    FROM b
    JOIN {schema}.jobs j ON """
    + _CHILDREN_OF_B
    + """ AND j.status IN ('pending', 'scheduled')
    LIMIT $3
    FOR UPDATE OF j SKIP LOCKED
),
"""
    + _CANCEL_CHILDREN
    + """
SELECT (SELECT count(*) FROM cancelled) AS changed, (SELECT count(*) FROM win) AS scanned,
       (SELECT max(w.tag) FROM win w) AS last_tag
"""
)

COMPLETE_BATCH: Final = (
    """
-- arbiter: clock_timestamp() (completed_at; the finalizer's scheduled_at)
-- An active batch -> complete and its finalizer -> pending; otherwise nothing. Not
-- one whose failure streak reached its threshold: abort_batch ends that one (two
-- children's hooks racing, the one that saw no child left must not complete it).
-- Aborted instead when its children's failures since its last success, in the order
-- they ended, reached the threshold: the hooks' streak lags (see _TRAILING_FAILURES).
-- $1 batch id, $2 wake channel.
WITH now AS MATERIALIZED (SELECT clock_timestamp() AS ts),
finished AS (
    UPDATE {schema}.batches b
    SET status = CASE WHEN b.failure_threshold IS NULL THEN 'complete'
                      WHEN """
    + _TRAILING_FAILURES
    + """ >= b.failure_threshold THEN 'aborted'
                      ELSE 'complete' END,
        completed_at = n.ts
    FROM now n
    WHERE b.id = $1 AND b.status = 'active'
      AND (b.failure_threshold IS NULL OR b.consecutive_failures < b.failure_threshold)
    RETURNING b.finalizer_job_id
),"""
    + _RELEASE_FINALIZER
    + """
SELECT (SELECT count(*) FROM finished) AS completed, (SELECT count(*) FROM notified) AS notified
"""
)

COMPLETE_STALE_BATCHES: Final = (
    """
-- arbiter: clock_timestamp() (the grace; completed_at; the finalizers' scheduled_at)
-- The leader's safety net for a lost terminal hook (and for empty batches):
-- every active batch with no non-terminal child -> complete (aborted, when its
-- failure streak reached its threshold: the hook's abort was lost; or its children's,
-- as COMPLETE_BATCH counts them: their hooks were lost), its finalizer ->
-- pending, as COMPLETE_BATCH does for one. A batch created, or whose last child
-- ended, within the grace ($2) is left to the worker's hook, which applies a child's
-- end just after writing it (finished here in between, a last failure that should
-- abort the batch completed it). A batch whose streak reached its threshold is
-- aborted at once, children left or not: its abort was lost, and nothing else ends
-- it before its waiting children, which the abort cancels, have all run. SKIP LOCKED
-- leaves a batch a worker's hook is finishing right now to that hook. $1 wake channel.
-- One window of the active batches per statement: at most $5, in (created_at, id) order
-- after ($3, $4), the last key of the window before (all of them in one statement, a
-- million active batches outlasted the leader's bound, and no lost hook was made up for).
WITH now AS MATERIALIZED (SELECT clock_timestamp() AS ts),
win AS MATERIALIZED (
    SELECT b.id, b.created_at
    FROM {schema}.batches b
    WHERE b.status = 'active'
      -- The first bound seeks the index past the windows before; the pair orders ties.
      AND b.created_at >= $3::timestamptz AND (b.created_at, b.id) > ($3, $4::uuid)
    ORDER BY b.created_at, b.id
    LIMIT $5
),
last AS (
    SELECT w.created_at, w.id FROM win w ORDER BY w.created_at DESC, w.id DESC LIMIT 1
),
stale AS (
    SELECT b.id
    FROM {schema}.batches b CROSS JOIN now n
    WHERE b.id = ANY (ARRAY(SELECT w.id FROM win w)) AND b.status = 'active'
      AND (b.consecutive_failures >= b.failure_threshold
           OR (b.created_at <= n.ts - $2::interval
               AND NOT EXISTS (
                   SELECT 1 FROM {schema}.jobs j
                   WHERE """
    + _CHILDREN_OF_B
    + """
                     AND j.status IN ('pending', 'scheduled', 'running'))
               -- Apart, so that a batch with a child left stops at the partial index.
               AND NOT EXISTS (
                   SELECT 1 FROM {schema}.jobs j
                   WHERE """
    + _CHILDREN_OF_B
    + """
                     AND j.finished_at > n.ts - $2::interval)))
    FOR UPDATE OF b SKIP LOCKED
),
finished AS (
    UPDATE {schema}.batches b
    SET status = CASE WHEN b.failure_threshold IS NULL THEN 'complete'
                      WHEN b.consecutive_failures >= b.failure_threshold OR """
    + _TRAILING_FAILURES
    + """ >= b.failure_threshold THEN 'aborted'
                      ELSE 'complete' END,
        completed_at = n.ts
    FROM stale s CROSS JOIN now n
    WHERE b.id = s.id AND b.status = 'active'
    RETURNING b.finalizer_job_id
),"""
    # The fragment binds the wake channel as $2 for the one-batch statements.
    + _RELEASE_FINALIZER.replace("$2::text", "$1::text")
    + """
SELECT (SELECT count(*) FROM finished) AS completed, (SELECT count(*) FROM notified) AS notified,
       (SELECT count(*) FROM win) AS scanned,
       (SELECT created_at FROM last) AS last_at, (SELECT id FROM last) AS last_id
"""
)

BATCH_REPLAY_JOBS: Final = (
    """
-- arbiter: none
-- The stored jobs a retried enqueue_batch_atomic's children name: by id ($1), and by
-- (actor, idempotency_key) ($2, $3) for a child rebuilt for the retry (another id).
SELECT """
    + job_columns("j")
    + """
FROM {schema}.jobs j WHERE j.id = ANY($1::uuid[])
UNION ALL
SELECT """
    + job_columns("j")
    + """
FROM {schema}.jobs j
JOIN unnest($2::text[], $3::text[]) AS k (actor, idempotency_key)
    ON j.actor = k.actor AND j.idempotency_key = k.idempotency_key
"""
)

GET_BATCH: Final = (
    """
-- arbiter: none
SELECT """
    + BATCH_COLUMNS
    + """ FROM {schema}.batches b WHERE b.id = $1
"""
)

BATCH_HAS_ACTIVE_CHILDREN: Final = (
    """
-- arbiter: none
-- jobs_batch_active_idx holds only the waiting and running children: the first one
-- that is not the finalizer answers, however many have finished. $1 batch id. A batch
-- of tags only (no row) has its children too, as COUNT_BATCH_NON_TERMINAL counts them
-- (joined to its row, they were never found).
SELECT EXISTS (
    SELECT 1
    FROM (SELECT $1::uuid AS id,
                 (SELECT finalizer_job_id FROM {schema}.batches WHERE id = $1) AS finalizer_job_id) b
    JOIN {schema}.jobs j ON """
    + _CHILDREN_OF_B
    + """
    WHERE j.status IN ('pending', 'scheduled', 'running'))
"""
)

COUNT_BATCH_NON_TERMINAL: Final = (
    """
-- arbiter: none
SELECT count(*)
FROM (SELECT $1::uuid AS id,
             (SELECT finalizer_job_id FROM {schema}.batches WHERE id = $1) AS finalizer_job_id) b
JOIN {schema}.jobs j ON """
    + _CHILDREN_OF_B
    + """
WHERE j.status IN ('pending', 'scheduled', 'running')
"""
)

LIST_BATCHES: Final = (
    """
-- arbiter: none
-- Newest first, each with its children's counts by status. {where} holds the
-- filter (fixed fragments over alias b; values bound from $2); $1 is the limit, taken
-- before the counting (after it, every matching batch's children were counted).
SELECT """
    + BATCH_COLUMNS
    + """, c.statuses, c.counts
FROM (SELECT * FROM {schema}.batches b
      {where}
      ORDER BY b.created_at DESC, b.id DESC
      LIMIT $1) AS b
LEFT JOIN LATERAL (
    SELECT array_agg(s.status::text) AS statuses, array_agg(s.n) AS counts
    FROM (
        SELECT j.status, count(*) AS n
        FROM {schema}.jobs j
        WHERE """
    + _CHILDREN_OF_B
    + """
        GROUP BY j.status
    ) s
) c ON true
ORDER BY b.created_at DESC, b.id DESC
"""
)

PRUNE_OLD_BATCHES: Final = (
    """
-- arbiter: clock_timestamp(), read by the caller through now() (the cutoff derives from it)
-- One window: at most $4 finished batches, in (completed_at, id) order after ($2, $3)
-- (the last key of the window before), read from the index alone; those of them whose
-- children and finalizer are gone are deleted. The window, not the batches deleted, bounds the turn:
-- with the children's check in the window's own query, the planner read and sorted every
-- finished batch after the key (and all their children) at every turn, a backlog of
-- 1,000,000 pruned in quadratic time. A batch kept for its children is read once per
-- prune. SKIP LOCKED leaves a batch row another transaction holds to the next prune.
WITH win AS MATERIALIZED (
    SELECT b.id, b.completed_at
    FROM {schema}.batches b
    WHERE b.status <> 'active' AND b.completed_at < $1
      -- The first bound seeks the index past the windows before; the pair orders ties.
      AND b.completed_at >= $2::timestamptz AND (b.completed_at, b.id) > ($2, $3::uuid)
    ORDER BY b.completed_at, b.id
    LIMIT $4
),
last AS (
    SELECT w.completed_at, w.id FROM win w ORDER BY w.completed_at DESC, w.id DESC LIMIT 1
),
old AS (
    SELECT b.id
    FROM {schema}.batches b
    WHERE b.id = ANY (ARRAY(SELECT w.id FROM win w))
      AND NOT EXISTS (SELECT 1 FROM {schema}.jobs j WHERE """
    + _CHILDREN_OF_B
    + """)
      -- Nor its finalizer: one still waiting or running would run against no batch.
      AND NOT EXISTS (SELECT 1 FROM {schema}.jobs f WHERE f.id = b.finalizer_job_id)
    FOR UPDATE OF b SKIP LOCKED
),
-- By the array of ids: joined to the CTE, the planner read the whole table each turn.
removed AS (
    DELETE FROM {schema}.batches b WHERE b.id = ANY (ARRAY(SELECT o.id FROM old o))
    RETURNING 1
)
SELECT (SELECT count(*) FROM removed) AS changed, (SELECT count(*) FROM win) AS scanned,
       (SELECT completed_at FROM last) AS last_at, (SELECT id FROM last) AS last_id
"""
)
