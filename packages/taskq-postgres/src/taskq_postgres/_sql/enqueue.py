"""Inserting jobs: the row-by-row insert with idempotency, and the checks around it."""

from __future__ import annotations

from typing import Final

from taskq_postgres._sql import FINALIZER_PARKED_AT, JOB_COLUMNS, job_columns

__all__ = [
    "CLOCK_NOW",
    "COPY_COLUMNS",
    "DECIDED_COLUMNS",
    "ENQUEUE",
    "ENQUEUE_CONFLICTS",
    "ENQUEUE_ONE",
    "ENQUEUE_ONE_PLAIN",
    "EXISTING_BY_KEY",
    "MARK_SINGLETONS",
    "NOTIFY",
    "SINGLETON_LOCKS",
]

_J: Final = job_columns("j")

DECIDED_COLUMNS: Final = (
    "status",
    "attempt",
    "created_at",
    "scheduled_at",
    "schedule_to_close_deadline",
)
"""What the server decides for a job it inserts; the caller knows the rest (it sent it,
or the column holds its default). ``ENQUEUE_ONE`` returns these first, in this order:
its rows are read by position (``ENQUEUE_ONE_PLAIN`` returns only ``created_at``)."""

FRESH_COLUMNS: Final = ("id", *DECIDED_COLUMNS)
"""What ``ENQUEUE`` returns of a job it inserted (its records also carry the rest as NULL)."""

_RETURN_DECIDED: Final = ", ".join(f"j.{name}" for name in DECIDED_COLUMNS)

_FRESH: Final = ", ".join(
    f"ins.{name}" if name in FRESH_COLUMNS else f"NULL AS {name}" for name in JOB_COLUMNS
)

ENQUEUE: Final = (
    """
-- arbiter: clock_timestamp() (created_at; scheduled_at = now + delay; deadline = now + schedule_to_close)
-- One row per element of the parallel arrays $1..$19. An item whose (actor,
-- idempotency_key) exists is skipped by ON CONFLICT and its existing row is
-- returned instead (inserted = false); an inserted one comes back with only
-- FRESH_COLUMNS, the rest NULL. $20 is the wake channel, or NULL when the
-- caller sends the one wake of its transaction itself. An array of the optional
-- columns ($6, $8..$19) may be NULL when no item sets it: unnest pads it with NULLs.
-- Durations are added as seconds (make_interval(secs => extract(epoch FROM d))): on a
-- caller's connection the session's zone may have DST, where + interval '1 day' is
-- a calendar day (23 or 25 hours), not the timedelta sent.
WITH now AS MATERIALIZED (SELECT clock_timestamp() AS ts),
input AS (
    SELECT *
    FROM unnest(
        $1::uuid[], $2::text[], $3::text[], $4::int[], $5::text[], $6::interval[], $7::int[],
        $8::text[], $9::text[], $10::text[], $11::interval[], $12::interval[], $13::interval[],
        $14::text[], $15::text[], $16::text[], $17::text[], $18::bool[], $19::bool[]
    ) WITH ORDINALITY AS i (
        id, actor, queue, priority, payload, delay, max_attempts,
        idempotency_key, identity_key, fairness_key, schedule_to_close, timeout, result_ttl,
        metadata, tags, trace_id, span_id, parked, singleton, ord
    )
),
ins AS (
    INSERT INTO {schema}.jobs (
        id, actor, queue, status, priority, payload, scheduled_at, created_at, enqueued_at,
        max_attempts, idempotency_key, identity_key, fairness_key, schedule_to_close_deadline,
        timeout, result_ttl, metadata, tags, trace_id, span_id, updated_at, singleton
    )
    SELECT
        i.id, i.actor, i.queue,
        CASE WHEN i.parked OR i.delay > interval '0' THEN 'scheduled' ELSE 'pending' END
            ::{schema}.job_status,
        i.priority, i.payload::jsonb,
        -- A parked batch finalizer waits for its batch, not for time.
        CASE
            WHEN i.parked THEN """
    + FINALIZER_PARKED_AT
    + """
            WHEN i.delay > interval '0'
                THEN n.ts + make_interval(secs => extract(epoch FROM i.delay))
            ELSE n.ts
        END,
        n.ts, n.ts, i.max_attempts, i.idempotency_key, i.identity_key, i.fairness_key,
        n.ts + make_interval(secs => extract(epoch FROM i.schedule_to_close)), i.timeout, i.result_ttl, COALESCE(i.metadata::jsonb, '{}'),
        ARRAY(SELECT jsonb_array_elements_text(i.tags::jsonb)), i.trace_id, i.span_id, n.ts,
        coalesce(i.singleton, false)
    FROM input i CROSS JOIN now n
    -- In key order: batches sharing keys in different orders would otherwise wait on
    -- each other's speculative inserts crosswise (a deadlock). Rows go back by id.
    ORDER BY i.actor, i.idempotency_key, i.ord
    ON CONFLICT (actor, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING """
    + ", ".join(FRESH_COLUMNS)
    + """
),
notified AS (
    SELECT pg_notify($20::text, '')
    FROM (SELECT 1 FROM ins LIMIT 1) AS any_inserted
    WHERE $20::text IS NOT NULL
)
SELECT true AS inserted, """
    + _FRESH
    + """
FROM ins
-- Referencing notified makes Postgres run it: an unreferenced CTE never runs.
WHERE (SELECT count(*) FROM notified) >= 0
UNION ALL
SELECT false AS inserted, """
    + _J
    + """
FROM {schema}.jobs j
JOIN input i ON j.actor = i.actor AND j.idempotency_key = i.idempotency_key
WHERE NOT EXISTS (SELECT 1 FROM ins WHERE ins.id = i.id)
"""
)

ENQUEUE_ONE: Final = (
    """
-- arbiter: clock_timestamp() (created_at; scheduled_at = now + delay; deadline = now + schedule_to_close)
-- ENQUEUE for its common case, one job without an idempotency key: no arrays to
-- unnest, no conflict to resolve, no existing row to look up. $1..$16 as the
-- arrays of ENQUEUE (tags as text[]); $17 is the wake channel, or NULL. It returns
-- only what the server decides (status, attempt, the times): the caller knows the
-- rest, as it sent it, and a fresh row's other columns hold their defaults.
-- Durations are added as seconds, as in ENQUEUE.
INSERT INTO {schema}.jobs AS j (
    id, actor, queue, status, priority, payload, scheduled_at, created_at, enqueued_at,
    max_attempts, identity_key, fairness_key, schedule_to_close_deadline,
    timeout, result_ttl, metadata, tags, trace_id, span_id, updated_at
)
SELECT
    $1::uuid, $2::text, $3::text,
    CASE WHEN $6::interval > interval '0' THEN 'scheduled' ELSE 'pending' END::{schema}.job_status,
    $4::int, $5::text::jsonb,
    CASE WHEN $6::interval > interval '0' THEN n.ts + n.delay ELSE n.ts END,
    n.ts, n.ts, $7::int, $8::text, $9::text,
    n.ts + make_interval(secs => extract(epoch FROM $10::interval)), $11::interval, $12::interval,
    $13::text::jsonb, $14::text[], $15::text, $16::text, n.ts
FROM (
    SELECT clock_timestamp() AS ts, make_interval(secs => extract(epoch FROM $6::interval)) AS delay
) AS n
RETURNING """
    + _RETURN_DECIDED
    + """,
    CASE WHEN $17::text IS NOT NULL THEN pg_notify($17::text, '') END AS notified
"""
)

ENQUEUE_ONE_PLAIN: Final = """
-- arbiter: clock_timestamp() (created_at = scheduled_at)
-- ENQUEUE_ONE for a job due now none of whose optional columns is set (no delay,
-- identity or fairness key, deadline, timeout, result TTL, metadata, tags or
-- trace): those keep their defaults, and the server decides only the time. Each
-- parameter costs encoding, sending and binding, each returned column decoding:
-- a loop of one-job enqueues pays for every one. $1..$5 as ENQUEUE_ONE's, $6 its
-- $7 (max_attempts); $7 is the wake channel, or NULL.
INSERT INTO {schema}.jobs AS j (
    id, actor, queue, status, priority, payload, scheduled_at, created_at, enqueued_at,
    max_attempts, updated_at
)
SELECT
    $1::uuid, $2::text, $3::text, 'pending', $4::int, $5::text::jsonb,
    n.ts, n.ts, n.ts, $6::int, n.ts
FROM (SELECT clock_timestamp() AS ts) AS n
RETURNING j.created_at,
    CASE WHEN $7::text IS NOT NULL THEN pg_notify($7::text, '') END AS notified
"""

EXISTING_BY_KEY: Final = (
    """
-- arbiter: none (a lookup by key)
-- Rows another transaction inserted under our keys after this statement's
-- snapshot was taken by ENQUEUE (ON CONFLICT waited for them to commit).
SELECT """
    + _J
    + """
FROM {schema}.jobs j
JOIN unnest($1::text[], $2::text[]) AS k (actor, idempotency_key)
    ON j.actor = k.actor AND j.idempotency_key = k.idempotency_key
"""
)

SINGLETON_LOCKS: Final = """
-- arbiter: none
-- Serializes singleton enqueues of the same identities until commit. Its own
-- statement, so that ENQUEUE_CONFLICTS takes its snapshot after the locks are
-- held and sees whatever a competing enqueue committed. $1 is sorted, so two
-- enqueues locking several identities cannot deadlock. Returns the transaction's
-- isolation: only READ COMMITTED gives the next statement a fresh snapshot.
SELECT current_setting('transaction_isolation') AS isolation
FROM (SELECT count(pg_advisory_xact_lock(hashtextextended(k, 0))) FROM unnest($1::text[]) AS k) l
"""

ENQUEUE_CONFLICTS: Final = """
-- arbiter: clock_timestamp() (the advisory retry_after hint of a singleton collision)
-- The idempotency keys already used, and the active jobs holding the
-- identities asked for (checked under SINGLETON_LOCKS).
SELECT 'idempotency' AS kind, j.actor, j.idempotency_key AS key, j.id, NULL::float8 AS retry_after
FROM {schema}.jobs j
JOIN unnest($1::text[], $2::text[]) AS k (actor, idempotency_key)
    ON j.actor = k.actor AND j.idempotency_key = k.idempotency_key
UNION ALL
SELECT 'identity', j.actor, j.identity_key, j.id,
       greatest(extract(epoch FROM j.schedule_to_close_deadline - clock_timestamp()), 0)::float8
FROM {schema}.jobs j
JOIN unnest($3::text[], $4::text[]) AS k (actor, identity_key)
    ON j.actor = k.actor AND j.identity_key = k.identity_key
WHERE j.status IN ('pending', 'scheduled', 'running')
"""

MARK_SINGLETONS: Final = """
-- arbiter: clock_timestamp() (updated_at)
-- Copied singletons (COPY writes no singleton column): their rows say they are.
UPDATE {schema}.jobs SET singleton = true, updated_at = clock_timestamp()
WHERE id = ANY($1::uuid[])
RETURNING id
"""

CLOCK_NOW: Final = """
-- arbiter: clock_timestamp() (the instant COPY'd jobs are created at)
-- $1 is the wake channel (or NULL: no wake): the notify is sent when the COPY's
-- transaction commits.
SELECT clock_timestamp() AS now,
       CASE WHEN $1::text IS NOT NULL THEN pg_notify($1::text, '') END AS notified
"""

NOTIFY: Final = """
-- arbiter: none
SELECT pg_notify($1::text, '')
"""

COPY_COLUMNS: Final = (
    "id",
    "actor",
    "queue",
    "status",
    "priority",
    "payload",
    "scheduled_at",
    "created_at",
    "enqueued_at",
    "max_attempts",
    "idempotency_key",
    "identity_key",
    "fairness_key",
    "schedule_to_close_deadline",
    "timeout",
    "result_ttl",
    "metadata",
    "tags",
    "trace_id",
    "span_id",
    "updated_at",
)
"""The columns ``enqueue_batch_fast`` COPYs; the rest take their defaults."""
