"""Fleet statistics (queue depths, stranded jobs) and the worker registry."""

from __future__ import annotations

from typing import Final

__all__ = [
    "CLEANUP_STALE_WORKERS",
    "DEREGISTER_WORKER",
    "QUEUE_DEPTHS",
    "REGISTER_WORKER",
    "STRANDED_JOBS",
    "TOUCH_WORKER",
]

QUEUE_DEPTHS: Final = """
-- arbiter: none
-- One count per status, each from that status's partial index (pending ones index-only,
-- queue in the index): in one pass over the three statuses the planner read the whole
-- table, finished history and all (130 ms at 1,000,000 jobs, every 15 s).
SELECT c.queue, sum(c.pending)::bigint AS pending, sum(c.scheduled)::bigint AS scheduled,
       sum(c.running)::bigint AS running
FROM (SELECT j.queue, count(*) AS pending, 0 AS scheduled, 0 AS running
      FROM {schema}.jobs j WHERE j.status = 'pending' GROUP BY j.queue
      UNION ALL
      SELECT j.queue, 0, count(*), 0
      FROM {schema}.jobs j WHERE j.status = 'scheduled' GROUP BY j.queue
      UNION ALL
      SELECT j.queue, 0, 0, count(*)
      FROM {schema}.jobs j WHERE j.status = 'running' GROUP BY j.queue) c
GROUP BY c.queue
ORDER BY c.queue
"""

STRANDED_JOBS: Final = """
-- arbiter: none
-- Waiting jobs nothing will dispatch, per actor and queue: of an actor no worker ever
-- registered (no actor_config row), or, while any worker is registered, that no worker
-- row both runs (its actors) and works the queue of (its queues): actor_config rows
-- outlive every release, so only the live workers show an actor since removed or
-- renamed, or a queue nobody works (a misspelt queue=). A row with NULL actors (a
-- release before 01.00.08) runs every actor, on its own queues. Counted first, so the
-- registry is read per (actor, queue), not per job. jobs_waiting_actor_idx holds no
-- queue, so one count over both statuses reads the heap of every waiting job: pending
-- jobs are counted from the dispatch indexes instead (queue and actor in the index, an
-- index-only scan), scheduled ones through jobs_scheduled_idx. The workers' arrays are
-- unnested once, into (worker, actor) and (worker, queue) rows looked up by value:
-- tested with = ANY per pair, 2,000 actors and queues took 0.26 s a worker row, and the
-- leader's bound ran out at 30 rows in the very case the check is for.
WITH waiting AS (
    SELECT c.actor, c.queue, sum(c.jobs) AS jobs
    FROM (SELECT j.actor, j.queue, count(*) AS jobs
          FROM {schema}.jobs j
          WHERE j.status = 'pending'
          GROUP BY j.queue, j.actor
          UNION ALL
          SELECT j.actor, j.queue, count(*) AS jobs
          FROM {schema}.jobs j
          WHERE j.status = 'scheduled'
          GROUP BY j.queue, j.actor) c
    GROUP BY c.actor, c.queue
),
runs AS MATERIALIZED (
    SELECT w.id, a.actor FROM {schema}.workers w CROSS JOIN LATERAL unnest(w.actors) AS a (actor)
),
works AS MATERIALIZED (
    SELECT w.id, q.queue, w.actors IS NULL AS any_actor
    FROM {schema}.workers w CROSS JOIN LATERAL unnest(w.queues) AS q (queue)
),
-- Joined as sets (hashed), not probed per pair.
served AS (
    SELECT DISTINCT s.actor, s.queue
    FROM waiting s
    JOIN runs r ON r.actor = s.actor
    JOIN works k ON k.id = r.id AND k.queue = s.queue
    UNION
    SELECT s.actor, s.queue
    FROM waiting s
    JOIN works k ON k.any_actor AND k.queue = s.queue
)
SELECT s.actor, s.queue, s.jobs
FROM waiting s
LEFT JOIN served v ON v.actor = s.actor AND v.queue = s.queue
WHERE NOT EXISTS (SELECT 1 FROM {schema}.actor_config a WHERE a.actor = s.actor)
   OR (v.actor IS NULL AND EXISTS (SELECT 1 FROM {schema}.workers))
ORDER BY s.actor, s.queue
"""

REGISTER_WORKER: Final = """
-- arbiter: clock_timestamp() (started_at = last_seen_at = now)
-- $1 id, $2 hostname, $3 pid, $4 queues, $5 actors (NULL: not said). One reading of
-- the clock, so a fresh row's started_at and last_seen_at are equal.
INSERT INTO {schema}.workers AS w (id, hostname, pid, queues, actors, started_at, last_seen_at)
SELECT $1, $2, $3, $4::text[], $5::text[], n.ts, n.ts
FROM (SELECT clock_timestamp() AS ts) n
ON CONFLICT (id) DO UPDATE
SET hostname = EXCLUDED.hostname, pid = EXCLUDED.pid, queues = EXCLUDED.queues,
    actors = EXCLUDED.actors, started_at = EXCLUDED.started_at,
    last_seen_at = EXCLUDED.last_seen_at
"""

TOUCH_WORKER: Final = """
-- arbiter: clock_timestamp() (last_seen_at = now)
UPDATE {schema}.workers SET last_seen_at = clock_timestamp() WHERE id = $1
"""

DEREGISTER_WORKER: Final = """
-- arbiter: none
DELETE FROM {schema}.workers WHERE id = $1
"""

CLEANUP_STALE_WORKERS: Final = """
-- arbiter: clock_timestamp() (stale check last_seen_at < now - $1)
DELETE FROM {schema}.workers WHERE last_seen_at < clock_timestamp() - $1::interval
"""
