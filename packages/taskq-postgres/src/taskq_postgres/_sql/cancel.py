"""Cancel requests: one statement for a single job (``write_cancel_request``) or a filter
(``cancel_where``), and the cancel-flag poll."""

from __future__ import annotations

from typing import Final

__all__ = [
    "CANCEL_JOBS",
    "DIRECTION_TOKEN",
    "FILTER_TOKEN",
    "POLL_CANCEL_FLAGS",
    "WORKER_CHANNEL_SQL",
]

FILTER_TOKEN: Final = "{filter}"
"""Where ``CANCEL_JOBS`` takes its row predicate (over alias ``j``, params from ``$4``)."""
DIRECTION_TOKEN: Final = "{direction}"
"""Where ``CANCEL_JOBS`` takes ``ASC`` or ``DESC``: the filter's order, in which its
events are written and its ids returned (the rows are still locked in id order)."""

WORKER_CHANNEL_SQL: Final = """CASE
    WHEN octet_length(ch.full_name) <= 63 THEN ch.full_name
    ELSE left(ch.full_name, 46) || '_' || left(md5(ch.full_name), 16)
END"""
"""``channels.worker_channel`` in SQL, over ``ch.full_name`` (prefix || worker hex):
pg_notify raises on a channel over 63 bytes, so a long one keeps its head and
ends in a hash of the whole name."""

CANCEL_JOBS: Final = (
    """
-- arbiter: clock_timestamp() (cancel_requested_at; finished_at of waiting jobs)
-- Pending/scheduled jobs are cancelled at once; running ones get cancel phase 1
-- (the first request's time is kept) and their worker is told: one notify on the
-- events channel ($2) and one on the worker's own channel (prefix $3) per worker,
-- never one per row; none when $2 is NULL (poll-only). $1 reason.
-- The updates decide on target's status, never on their own read of j: target locked
-- the row, and a status change that committed while it waited for the lock (a dispatch,
-- a snooze) is in target's re-read row, not in the statement's snapshot.
WITH now AS MATERIALIZED (SELECT clock_timestamp() AS ts),
target AS (
    -- Locked in id order, as two cancels of overlapping sets then wait, not deadlock.
    SELECT j.id, j.status, j.created_at
    FROM {schema}.jobs j
    WHERE j.status IN ('pending', 'scheduled', 'running') AND ({filter})
    ORDER BY j.id
    FOR UPDATE OF j
),
cancelled AS (
    UPDATE {schema}.jobs j
    SET status = 'cancelled', finished_at = n.ts, updated_at = n.ts,
        cancel_requested_at = n.ts, cancel_reason = $1::text
    FROM target t CROSS JOIN now n
    WHERE j.id = t.id AND t.status IN ('pending', 'scheduled')
    RETURNING j.id, j.created_at, t.status AS from_status, j.metadata ->> 'batch_id' AS batch_tag
),
requested AS (
    UPDATE {schema}.jobs j
    SET cancel_phase = greatest(j.cancel_phase, 1), updated_at = n.ts,
        cancel_requested_at = coalesce(j.cancel_requested_at, n.ts),
        cancel_reason = coalesce($1::text, j.cancel_reason)
    FROM target t CROSS JOIN now n
    WHERE j.id = t.id AND t.status = 'running'
    RETURNING j.id, j.created_at, j.locked_by_worker
),
events AS (
    INSERT INTO {schema}.job_events (job_id, kind, detail)
    SELECT e.job_id, e.kind, e.detail
    FROM (
        SELECT c.id AS job_id, c.created_at, 'state_change' AS kind,
               jsonb_strip_nulls(jsonb_build_object('from_state', c.from_status,
                                                    'to_state', 'cancelled',
                                                    'reason', $1::text)) AS detail
        FROM cancelled c
        UNION ALL
        SELECT r.id, r.created_at, 'cancel_requested',
               jsonb_strip_nulls(jsonb_build_object('reason', $1::text))
        FROM requested r
    ) e
    ORDER BY e.created_at {direction}, e.job_id {direction}
),
notified AS (
    SELECT pg_notify(c.channel,
                     json_build_object('type', 'cancel', 'worker_id', w.worker_id,
                                       'job_id', w.job_id)::text)
    FROM (
        SELECT DISTINCT ON (r.locked_by_worker) r.locked_by_worker AS worker_id, r.id AS job_id
        FROM requested r
        ORDER BY r.locked_by_worker, r.created_at, r.id
    ) w
    CROSS JOIN LATERAL (
        SELECT $3::text || replace(w.worker_id::text, '-', '') AS full_name
    ) ch
    CROSS JOIN LATERAL (VALUES ($2::text), ("""
    + WORKER_CHANNEL_SQL
    + """)) AS c (channel)
    WHERE $2::text IS NOT NULL
)
-- batch_tag: the metadata.batch_id of a job cancelled at once (a batch child), for the
-- caller to apply to its batch.
SELECT x.outcome, x.id, x.batch_tag
FROM (
    SELECT 'cancelled' AS outcome, c.id, c.created_at, c.batch_tag FROM cancelled c
    UNION ALL
    SELECT 'requested', r.id, r.created_at, NULL::text FROM requested r
) x
-- Referencing notified makes Postgres run it: an unreferenced CTE never runs.
CROSS JOIN (SELECT count(*) FROM notified) AS sent
ORDER BY x.created_at {direction}, x.id {direction}
"""
)

POLL_CANCEL_FLAGS: Final = """
-- arbiter: none
SELECT j.id, j.cancel_phase, j.cancel_requested_at, j.cancel_reason
FROM {schema}.jobs j
WHERE j.status = 'running' AND j.locked_by_worker = $1
  AND j.cancel_phase >= 1 AND j.cancel_requested_at IS NOT NULL
ORDER BY j.cancel_requested_at, j.id
"""
