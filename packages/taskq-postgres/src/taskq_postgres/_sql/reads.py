"""Reads: jobs, their history, the counts, and the checks run at open."""

from __future__ import annotations

from typing import Final

from taskq_postgres._sql import job_columns

__all__ = [
    "COUNT_ACTIVE_JOBS",
    "COUNT_PENDING_JOBS",
    "GET_ACTOR_JOB_DEFAULTS",
    "GET_ACTOR_MAX_PENDING",
    "GET_ACTOR_QUEUES",
    "GET_ATTEMPTS",
    "GET_EVENTS",
    "GET_JOB",
    "LIST_JOBS",
    "ORDER_TOKEN",
    "POOLED_SESSION_SETTINGS",
    "SCHEMA_IS_MIGRATED",
    "SERVER_IDENTITY",
    "SET_IDLE_LIMIT",
    "WHERE_TOKEN",
    "waiting_up_to",
]

_J: Final = job_columns("j")

GET_JOB: Final = (
    """
-- arbiter: none
SELECT """
    + _J
    + """
FROM {schema}.jobs j WHERE j.id = $1
"""
)

WHERE_TOKEN: Final = "{where}"
"""Where ``LIST_JOBS`` takes its predicate, ordering and limit (built from fixed
fragments over alias ``j``)."""

ORDER_TOKEN: Final = "{order}"
"""Where ``LIST_JOBS`` takes the page's ordering again (over alias ``page``)."""

# The page is chosen on two narrow columns; then only its rows are read whole, their
# JSON turned into text. Converted before the sort and the limit, every matching row's
# was: `taskq jobs list --json` over 100 jobs of 5 MB results took 2 GB and 11 s.
LIST_JOBS: Final = (
    """
-- arbiter: none
SELECT """
    + _J
    + """
FROM (SELECT j.id, j.created_at FROM {schema}.jobs j
      {where}) AS page
JOIN {schema}.jobs j ON j.id = page.id
{order}
"""
)


def waiting_up_to(actor: str, limit: str) -> str:
    """A subquery counting the waiting (pending + scheduled) jobs of ``actor`` up to
    ``limit`` (SQL expressions; a NULL limit counts all): what ``max_pending`` is
    checked against, by the client and by cron alike. Counting stops at the limit,
    so a backlog of a million rows is not read for every refused enqueue."""
    return f"""(
    SELECT count(*) FROM (
        SELECT 1 FROM {{schema}}.jobs j
        WHERE j.actor = {actor} AND j.status IN ('pending', 'scheduled')
        LIMIT {limit}
    ) AS w
)"""


# $2 holds each actor's count limit (NULL: count all).
COUNT_PENDING_JOBS: Final = f"""
-- arbiter: none
SELECT a.actor, {waiting_up_to("a.actor", "a.up_to")} AS waiting
FROM unnest($1::text[], $2::bigint[]) AS a (actor, up_to)
"""


COUNT_ACTIVE_JOBS: Final = """
-- arbiter: none
SELECT count(*) FROM {schema}.jobs j
WHERE j.queue = ANY($1::text[]) AND j.status IN ('pending', 'scheduled', 'running')
"""

GET_ACTOR_MAX_PENDING: Final = """
-- arbiter: none
SELECT actor, max_pending FROM {schema}.actor_config ORDER BY actor
"""

GET_ACTOR_QUEUES: Final = """
-- arbiter: none
SELECT actor, queue FROM {schema}.actor_config WHERE queue IS NOT NULL ORDER BY actor
"""

GET_ACTOR_JOB_DEFAULTS: Final = """
-- arbiter: none
SELECT actor, job_defaults::text AS job_defaults
FROM {schema}.actor_config WHERE job_defaults IS NOT NULL ORDER BY actor
"""

GET_ATTEMPTS: Final = """
-- arbiter: none
-- One row per attempt number, the last written: a terminal write inserts its row
-- even where write_attempt stored one for that attempt (job_attempts has a
-- surrogate key), and the later write replaces the earlier, as on every backend.
SELECT DISTINCT ON (a.attempt)
       a.job_id, a.attempt, a.worker_id, a.started_at, a.finished_at, a.outcome,
       a.error_class, a.error_message, a.error_traceback
FROM {schema}.job_attempts a
WHERE a.job_id = $1
ORDER BY a.attempt, a.id DESC
"""

GET_EVENTS: Final = """
-- arbiter: none
SELECT e.id, e.job_id, e.occurred_at, e.kind, e.detail::text AS detail
FROM {schema}.job_events e
WHERE e.job_id = $1
ORDER BY e.id
"""

# The settings TaskQ sends at connect, as a pooled connection has them from the role's
# defaults (a pooler passes none): schema-free.
POOLED_SESSION_SETTINGS: Final = """
-- arbiter: none
SELECT quote_ident(current_user) AS role, current_setting('jit') AS jit,
       (SELECT setting::bigint FROM pg_settings
        WHERE name = 'idle_in_transaction_session_timeout') AS idle_timeout_ms
"""

# Which database of which running server a session reached (the start time tells two
# servers apart, and any role may read it): schema-free.
SERVER_IDENTITY: Final = """
-- arbiter: none
SELECT current_database() AS database, pg_postmaster_start_time() AS started
"""

# For this transaction only ($1 in milliseconds): behind a pooler, TaskQ's connections
# carry no session setting.
SET_IDLE_LIMIT: Final = """
-- arbiter: none
SELECT set_config('idle_in_transaction_session_timeout', $1, true)
"""

SCHEMA_IS_MIGRATED: Final = """
-- arbiter: none
SELECT to_regclass('{schema}.jobs') IS NOT NULL
"""
