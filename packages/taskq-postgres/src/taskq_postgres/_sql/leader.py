"""The maintenance leader's SQL: the election over a session advisory lock, the cron
tick, and the record of the slotted loops' runs.

The advisory lock key is derived from the schema name, so two TaskQ schemas in
one database elect their own leaders. ``pg_try_advisory_lock`` stacks (each
success needs its own unlock), so it is taken once per session; afterwards the
holder only confirms it still holds it (``LEADER_RENEW``), and steps down by
closing the session.
"""

from __future__ import annotations

from typing import Final

from taskq_postgres._sql.reads import waiting_up_to
from taskq_postgres._sql.schedules import SCHEDULE_COLUMNS

__all__ = [
    "CRON_ADVANCE",
    "CRON_DUE",
    "CRON_MAX_PENDING",
    "LEADER_CLAIM_ROW",
    "LEADER_RENEW",
    "LEADER_RESIGN_ROW",
    "LEADER_TRY_LOCK",
    "MAINTENANCE_RUN_LAST",
    "MAINTENANCE_RUN_RECORD",
]

# Both return the server session's pid: the elector checks that its statements all
# reach the session that took the lock (a transaction-mode pooler lends another).
LEADER_TRY_LOCK: Final = """
-- arbiter: none (the lock is held while this session lives)
SELECT pg_try_advisory_lock(hashtextextended('taskq:maintenance_leader:{schema}', 0)) AS ok,
       pg_backend_pid() AS pid
"""

LEADER_CLAIM_ROW: Final = """
-- arbiter: clock_timestamp() (acquired_at / last_seen_at, observability only)
INSERT INTO {schema}.maintenance_leader AS l (id, worker_id, acquired_at, last_seen_at)
VALUES (true, $1, clock_timestamp(), clock_timestamp())
ON CONFLICT (id) DO UPDATE
SET worker_id = EXCLUDED.worker_id, acquired_at = EXCLUDED.acquired_at,
    last_seen_at = EXCLUDED.last_seen_at
"""

# The leader session takes no other advisory lock, so "this backend holds a
# granted advisory lock" is "this session still leads".
LEADER_RENEW: Final = """
-- arbiter: clock_timestamp() (last_seen_at, observability only)
WITH held AS MATERIALIZED (
    SELECT EXISTS (
        SELECT 1 FROM pg_locks
        WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND granted
    ) AS ok
),
touched AS (
    UPDATE {schema}.maintenance_leader
    SET last_seen_at = clock_timestamp()
    WHERE worker_id = $1 AND (SELECT ok FROM held)
    RETURNING 1
)
SELECT ok, pg_backend_pid() AS pid FROM held
"""

LEADER_RESIGN_ROW: Final = """
-- arbiter: none
DELETE FROM {schema}.maintenance_leader WHERE worker_id = $1
"""

# Locks the first due schedule for the rest of its transaction (one per schedule): a
# second (overlapping) leader skips it, or sees it already advanced. $2 (NULL: none)
# bounds how long the transaction may then idle: should the leader freeze (a stopped
# process, a cut network), the server ends its session after that, so the lock is not
# held for the pool's minute-long limit, past the catch-up window. Set by the statement
# that takes the lock: set by the next one, a leader frozen in between held it that long.
CRON_DUE: Final = (
    """
-- arbiter: clock_timestamp() (due check next_fire_at <= now; the slots and the
-- catch-up cutoff are computed from the "now" returned here)
SELECT clock_timestamp() AS now,
       (SELECT set_config('idle_in_transaction_session_timeout', $2::text, true)
        WHERE $2::text IS NOT NULL) AS lock_bound, """
    + SCHEDULE_COLUMNS
    + """
FROM {schema}.schedules s
WHERE s.enabled AND s.next_fire_at <= clock_timestamp()
ORDER BY s.next_fire_at
LIMIT $1
FOR UPDATE OF s SKIP LOCKED
"""
)

# The actor's max_pending (no row: none) and its waiting jobs as the client counts them,
# up to max_pending only. Read in the tick's transaction, before its insert.
CRON_MAX_PENDING: Final = f"""
-- arbiter: none
SELECT c.max_pending, {waiting_up_to("c.actor", "c.max_pending")} AS waiting
FROM {{schema}}.actor_config c
WHERE c.actor = $1 AND c.max_pending IS NOT NULL
"""

# Conditional on the next_fire_at read under the lock: a fence on top of it.
CRON_ADVANCE: Final = """
-- arbiter: none ($2/$3 were computed from the server clock read by CRON_DUE)
UPDATE {schema}.schedules
SET next_fire_at = $2, last_fired_at = COALESCE($3, last_fired_at)
WHERE id = $1 AND next_fire_at = $4
"""

MAINTENANCE_RUN_LAST: Final = """
-- arbiter: none
SELECT slot FROM {schema}.maintenance_runs WHERE loop = $1
"""

# Forward only, in one statement: of two leaders recording one slot, one row changes.
MAINTENANCE_RUN_RECORD: Final = """
-- arbiter: clock_timestamp() (ran_at, observability only)
INSERT INTO {schema}.maintenance_runs AS r (loop, slot, ran_at)
VALUES ($1, $2, clock_timestamp())
ON CONFLICT (loop) DO UPDATE
SET slot = EXCLUDED.slot, ran_at = EXCLUDED.ran_at
WHERE r.slot < EXCLUDED.slot
"""
