"""Dispatch: the CTE variants, the queue-mode lookup, leases and dispatch settings.

The two variants of architecture.md ("Dispatch CTE"), strict FIFO and round
robin, are each one atomic ``UPDATE … RETURNING`` built from the same phases;
a third, small statement (``DISPATCH_PLAIN_HEAD``: params, head_rows,
head_plain, then straight to the lock and the write) serves the common
strict-FIFO case whose head needs no cap or identity check, because starting
the full statement's plan costs about a fifth of a dispatch even when its
per-actor branches do not run::

    params              $1 queues, $2 limit_n, $3 worker_id, $4 lock_lease, $5 oversample;
                        round robin: $6/$7 capped queues and their caps, $8 round-robin
                        queues (from QUEUE_SETTINGS); strict FIFO reads the caps from
                        ``queues`` itself and sets limit_n to 0 for a round-robin queue;
                        the actors whose jobs to dispatch (NULL: all), $6 in strict
                        FIFO, $13 in round robin
    pending_actors      the (queue, actor) pairs with pending jobs: a loose index scan
    running_per_actor   running jobs per actor (max_concurrent)
    running_identities  (actor, identity_key) pairs already running
    per_actor_capacity  residual = max_concurrent - in_flight (limit_n when uncapped), of
                        the actors asked for; ``capped`` only where the room is
                        short of the sample (limit_n * oversample)
    head_rows           strict FIFO: the first limit_n * oversample due jobs of the queues
    head_plain          strict FIFO: no queue cap, and no job of the head is capped,
                        waits on an identity (two of the head share one, or a job
                        of it runs) or is of an actor not asked for; then the batch is the head's first unlocked
                        limit_n jobs and every per-actor phase is skipped (round robin:
                        always false)
    head                strict FIFO: head_rows but those whose identity is running, with
                        each job's position within its actor
    head_admitted       strict FIFO: what the per-actor sample would admit from the head
    head_suffices       strict FIFO: the head gives limit_n jobs, or holds every due job
    rr_keys, rr_state   round robin: the fairness cohorts of each (queue, actor) with
                        room, a loose index scan, with their running jobs and turns
    rr_level            round robin: the level to which the cohorts of all pairs that
                        could fill the batch hold limit_n * oversample jobs
    rr_pairs            round robin: each pair's cohorts, and how deep to read each (to
                        the pair's own depth, and ``capped`` at the level)
    rr_capped, rr_capped_kept, rr_use_capped
                        round robin: every pair's cohorts read to the level; the
                        cohorts those reads ended early or read to the pair's own depth
                        (not read again); whether they are the candidates
    candidates          CROSS JOIN LATERAL per (queue, actor), LIMIT residual * oversample,
                        past the jobs whose identity is running (strict FIFO: only when
                        the head does not suffice; round robin: its cohorts read to
                        depth, or to the sample's size when that falls short)
    queue_capacity      residual of each capped queue (queues.max_concurrent)
    admitted            jobs of queues with room whose identity is not running; then, as
                        the in-memory walk takes them: without capped queues, identity
                        dedup (DISTINCT ON (actor, identity_key) UNION ALL jobs without
                        identity), then pending_rank per capped actor <= residual; with
                        capped queues, the walk's fixed point (queue, actor and identity
                        places counted over the jobs taken before each job)
    locked              FOR UPDATE SKIP LOCKED, LIMIT limit_n
    eligible_candidates in_flight < max_concurrent gate; actor_rank
    eligible            actor_rank <= max_concurrent - in_flight; queue caps; LIMIT limit_n
    dispatched          UPDATE … WHERE id (pending as locked) RETURNING
    events              one state_change event per dispatched job

The phases skipped for a plain head are gated by one-time filters (``WHERE
(SELECT ok FROM head_plain)``), which Postgres evaluates before running the
branch under them: the common uncapped dispatch never names the pending
actors nor counts their running jobs.

``FOR UPDATE`` lives only in ``locked``: Postgres forbids it next to window
functions. ``dispatched`` finds its rows by id alone: the lock checked them pending
on their latest version and holds them so. Checked again, the planner drove that
join from a partial index on pending jobs whenever the statistics said none were
pending (a burst since the last ANALYZE), reading every pending job once per row:
half a second a dispatch of 100 at 30,000 pending. ``locked``'s own join can still
take that plan (a tenth of a second there), until the table is analyzed again: the
jobs table is analyzed after 1,000 changes and a fiftieth of its rows (migration
01.00.09), not after a tenth. Concurrent dispatchers may over-count an actor's cap by at most
``(producers - 1) * max_concurrent`` (each sees the others' running jobs only
once they commit); the sweeps bound the effect. ``pending_actors``, the
``head`` phases and ``queue_capacity`` are additions to the architecture's
list: the first names the actors to sample, the head phases spare strict FIFO
that sample on deep queues (below), the last applies the queue caps the
in-memory reference enforces too.

Round robin reads, per (queue, actor) of its round-robin queues, one
``jobs_fairness_idx`` entry per fairness cohort and the cohorts' first jobs: to the
level at which the cohorts of all pairs hold ``limit_n * oversample`` (50 actors of
20 keys: 1,000 jobs for a batch of 100, where each pair's sample, sized for the whole
batch, read 10,000); when a cohort ends before that level, each pair to its own
``residual * oversample`` (at most that many per cohort when shallow cohorts leave
that read short), whatever the backlog; a pair of more cohorts than its
share of ``_COHORT_BUDGET`` ranks its whole backlog instead, as near-unique keys, or
thousands of cohorts over many actors, read dearer than they rank. A cohort whose
jobs all wait on a running identity (or are not yet due) is read to its end, as
those are filtered, not index conditions. Each cohort costs ~15 us (its probe and
its read): where cohorts are many and shallow, or all wait on running identities,
that costs more than ranking did (up to ~2x within the budget: 200 actors x 10
cohorts, every identity running, 56 -> 103 ms at 200,000 pending), against seconds
saved on deep backlogs. A strict queue asked for in the same call is one cohort,
read to its ``residual * oversample`` first jobs.

Strict FIFO reads ``limit_n * oversample`` rows of ``jobs_dispatch_head_idx`` per
queue plus, unless the head is plain, one ``jobs_dispatch_idx`` entry per pending
actor, whatever the backlog and the number of actors; only when caps or
identities filter out most of the head does it also read ``residual *
oversample`` rows per (queue, actor).
"""

from __future__ import annotations

import re
from typing import Final

from taskq.backend.statemachine import JobStatus
from taskq_postgres._sql import TransitionSQL, job_columns

__all__ = [
    "CONFIGURE_QUEUE",
    "DISPATCH_PLAIN_HEAD",
    "DISPATCH_ROUND_ROBIN",
    "DISPATCH_STRICT_FIFO",
    "EXTEND_RESERVATION_LEASES",
    "HEARTBEAT_JOBS",
    "HELD_JOBS",
    "QUEUE_SETTINGS",
    "REGISTER_ACTORS",
]

QUEUE_SETTINGS: Final = """
-- arbiter: none
-- Queues absent here are strict_fifo, uncapped. Read before a round-robin dispatch
-- (which takes the caps as parameters), not before a strict-FIFO one.
SELECT name, mode, max_concurrent FROM {schema}.queues WHERE name = ANY($1::text[])
"""

# Strict FIFO first reads the head of the queues: their first limit_n *
# oversample due jobs in dispatch order (jobs_dispatch_head_idx), whatever the
# number of actors. The head is a prefix of the global order, so what the
# per-actor sample would admit from it (same per-(queue, actor) sample bound,
# same identity dedup and ranks, which depend only on earlier jobs) is exactly
# the start of what the per-actor sample admits. When that gives limit_n jobs,
# or the head holds every due job, it is the answer; only otherwise (caps or
# identities filter out most of the head) are all actors sampled, which reads
# up to residual * oversample jobs of each.
# The head of the queues: their first limit_n * oversample due jobs in dispatch
# order, and whether it is plain (no queue is round robin or capped, no job of the
# head waits on an identity, the head's or a running one, and none is of a capped
# actor): then the batch is simply its first unlocked limit_n jobs.
_HEAD: Final = """
head_rows AS (
    SELECT c.*
    FROM params p
    CROSS JOIN unnest(p.queues) AS q (queue)
    CROSS JOIN LATERAL (
        SELECT j.id, j.actor, j.queue, j.priority, j.scheduled_at, j.identity_key,
               NULL::bigint AS fairness_rank
        FROM {schema}.jobs j
        WHERE j.status = 'pending' AND j.queue = q.queue AND j.scheduled_at <= p.now
        ORDER BY j.priority DESC, j.scheduled_at, j.id
        LIMIT p.limit_n * p.oversample
    ) c
    ORDER BY <ORDER:c>
    LIMIT (SELECT p.limit_n * p.oversample FROM params p)
),
head_plain (ok) AS (
    SELECT NOT p.round_robin AND cardinality(p.capped_queues) = 0
           -- Identities are plain while no two jobs of the head share one and none runs
           -- (a probe of jobs_running_identity_key per keyed job of the head): then no
           -- job of the head waits on another.
           AND NOT EXISTS (
               SELECT 1 FROM head_rows h WHERE h.identity_key IS NOT NULL
               GROUP BY h.actor, h.identity_key HAVING count(*) > 1
           )
           AND NOT EXISTS (
               SELECT 1 FROM head_rows h
               JOIN {schema}.jobs r ON r.actor = h.actor AND r.identity_key = h.identity_key
               WHERE h.identity_key IS NOT NULL AND r.status = 'running'
           )
           AND NOT EXISTS (
               SELECT 1 FROM head_rows h JOIN {schema}.actor_config ac ON ac.actor = h.actor
               WHERE ac.max_concurrent IS NOT NULL
           )
           -- and every job of the head is of an actor asked for
           AND (p.actors IS NULL OR NOT EXISTS (
               SELECT 1 FROM head_rows h WHERE h.actor <> ALL (p.actors)
           ))
    FROM params p
),
"""

_STRICT_CANDIDATES: Final = (
    _HEAD
    + """
head AS (
    SELECT h.*,
           ROW_NUMBER() OVER (PARTITION BY h.queue, h.actor ORDER BY <ORDER:h>) AS actor_pos
    FROM head_rows h
    WHERE <WAITS_NOT:h>
),
head_candidates AS (
    SELECT h.id, h.actor, h.queue, h.priority, h.scheduled_at, h.identity_key, h.fairness_rank
    FROM head h
    JOIN per_actor_capacity pac ON pac.actor = h.actor
    CROSS JOIN params p
    WHERE h.actor_pos <= pac.residual * p.oversample
),<ADMIT:head_admitted:head_candidates>
head_suffices (ok) AS (
    SELECT (SELECT count(*) FROM head_admitted) >= p.limit_n
           OR (SELECT count(*) FROM head_rows) < p.limit_n * p.oversample
    FROM params p
),
candidates AS (
    SELECT c.id, c.actor, c.queue, c.priority, c.scheduled_at, c.identity_key,
           NULL::bigint AS fairness_rank
    FROM pending_actors pa
    JOIN per_actor_capacity pac ON pac.actor = pa.actor
    CROSS JOIN params p
    CROSS JOIN LATERAL (
        SELECT j.id, j.actor, j.queue, j.priority, j.scheduled_at, j.identity_key
        FROM {schema}.jobs j
        WHERE j.status = 'pending' AND j.queue = pa.queue AND j.actor = pa.actor
          AND j.scheduled_at <= p.now
          AND <WAITS_NOT:j>
        ORDER BY j.priority DESC, j.scheduled_at, j.id
        LIMIT pac.residual * p.oversample
    ) c
    WHERE pa.actor IS NOT NULL AND pac.residual > 0
      AND NOT (SELECT hp.ok FROM head_plain hp) AND NOT (SELECT hs.ok FROM head_suffices hs)
),<ADMIT:sampled_admitted:candidates>
admitted AS (
    SELECT h.*, NULL::bigint AS pending_rank FROM head_rows h WHERE (SELECT hp.ok FROM head_plain hp)
    UNION ALL
    SELECT * FROM head_admitted
    WHERE NOT (SELECT hp.ok FROM head_plain hp) AND (SELECT hs.ok FROM head_suffices hs)
    UNION ALL
    SELECT * FROM sampled_admitted WHERE NOT (SELECT hp.ok FROM head_plain hp)
),"""
)

# Round robin ranks each job within its fairness cohort: first among its
# cohort-mates by priority DESC, scheduled_at, id, after the cohort's jobs already
# running (in the round-robin queues asked for), and among the cohorts of one rank,
# the one this dispatcher served longest ago first (its turn: $9-$12, from
# taskq.backend.fairness; 0 never served). Each dispatch starts afresh, so without
# them a cohort whose jobs are older would win every one-slot dispatch, starving the
# others for as long as its backlog lasts. Rank and turn make one bigint, the rank
# in the high bits (a job's level: its rank within the cohort plus the cohort's
# running jobs). PARTITION BY puts all NULL keys in one cohort (no '__null__'
# sentinel a real key could collide with).
#
# Each (queue, actor) of a round-robin queue is sampled to its first
# residual * oversample jobs by level without ranking its backlog: its cohorts
# are named by a loose scan of jobs_fairness_idx (one probe each), then each
# cohort is read to the depth at which the cohorts together hold that many jobs
# (rr_pairs: were every cohort deep enough), which holds every job of those
# levels. When shallow cohorts leave that short, every cohort not read to its end
# is read again to the sample's size (no cohort gives more); either way the sample
# is exactly the first jobs by level, at the cost of the cohorts plus the sample,
# not the backlog. In strict queues asked for in the same call every job shares
# one cohort, read to its sample.
#
# The cohorts of the pair ``pa`` (its rr_pairs row ``pr``), each read to <TAKE>
# jobs with their rank in the cohort; <ONLY> may filter the cohorts. Keyed and
# unkeyed cohorts are read by separate branches: an equality, and an IS NULL, are
# both index conditions, where IS NOT DISTINCT FROM is not.
_COHORT_READ: Final = """
    SELECT x.id, x.actor, x.queue, x.priority, x.scheduled_at, x.identity_key, x.fairness_key,
           co.running, co.turn,
           ROW_NUMBER() OVER (
               PARTITION BY co.fairness_key ORDER BY x.priority DESC, x.scheduled_at, x.id
           ) AS cohort_rank
    FROM unnest(pr.keys, pr.running, pr.turns, pr.to_depth)
        AS co (fairness_key, running, turn, to_depth)
    CROSS JOIN LATERAL (
        (
            SELECT j.id, j.actor, j.queue, j.priority, j.scheduled_at, j.identity_key,
                   j.fairness_key
            FROM {schema}.jobs j
            WHERE co.fairness_key IS NOT NULL AND <COHORT_OK>
              AND j.status = 'pending' AND j.queue = pa.queue AND j.actor = pa.actor
              AND j.fairness_key = co.fairness_key AND j.scheduled_at <= p.now
              AND <WAITS_NOT:j>
            ORDER BY j.priority DESC, j.scheduled_at, j.id
            LIMIT <TAKE>
        )
        UNION ALL
        (
            SELECT j.id, j.actor, j.queue, j.priority, j.scheduled_at, j.identity_key,
                   j.fairness_key
            FROM {schema}.jobs j
            WHERE co.fairness_key IS NULL AND <COHORT_OK>
              AND j.status = 'pending' AND j.queue = pa.queue AND j.actor = pa.actor
              AND j.fairness_key IS NULL AND j.scheduled_at <= p.now
              AND <WAITS_NOT:j>
            ORDER BY j.priority DESC, j.scheduled_at, j.id
            LIMIT <TAKE>
        )
    ) x<ONLY>"""


def _cohorts(take: str, only: str = "", *, depths: str = "pr.to_depth", skip: str = "") -> str:
    """:data:`_COHORT_READ` with its placeholders: each cohort read to ``take`` jobs
    (``co.to_depth`` is the pair's ``depths`` array), ``only`` after it, and the
    cohorts for which ``skip`` holds left unread (a condition per cohort, checked
    before its read)."""
    read = _COHORT_READ.replace("pr.to_depth", depths).replace("<TAKE>", take)
    ok = f"NOT {skip}" if skip else "true"
    return read.replace("<ONLY>", only).replace("<COHORT_OK>", ok)


_COHORT_BUDGET: Final = 2_000
"""Cohorts a round-robin dispatch reads one by one, shared evenly among the (queue,
actor) pairs it samples: a pair with more than its share ranks its whole backlog
instead. Reading costs ~15 us a cohort, ranking ~1 us a job, so near-unique keys
(200,000 cohorts: 188 ms ranked, 3 s read) or many actors' cohorts (200 x 50, every
identity running: 63 ms ranked, 228 ms read) read dearer than they rank."""

_ROUND_ROBIN_CANDIDATES: Final = (
    """
head_plain (ok) AS (SELECT false),
running_cohorts AS (
    SELECT j.fairness_key, count(*) AS running
    FROM {schema}.jobs j CROSS JOIN params p
    WHERE j.status = 'running' AND j.queue = ANY (p.rr_queues)
    GROUP BY j.fairness_key
),
running_unkeyed (running) AS (
    SELECT coalesce((SELECT rc.running FROM running_cohorts rc WHERE rc.fairness_key IS NULL), 0)
),
-- Each keyed cohort's running jobs and turn, for one join per cohort.
cohort_state (fairness_key, running, turn) AS (
    SELECT coalesce(rc.fairness_key, t.fairness_key), coalesce(rc.running, 0),
           coalesce(t.turn, 0)
    FROM running_cohorts rc
    FULL JOIN (
        SELECT t.fairness_key, t.turn
        FROM params p CROSS JOIN unnest(p.turn_keys, p.turns) AS t (fairness_key, turn)
    ) t ON t.fairness_key = rc.fairness_key
    WHERE coalesce(rc.fairness_key, t.fairness_key) IS NOT NULL
),
-- The pending cohorts of each (queue, actor) with room in the round-robin queues, one
-- index probe per key; the NULL that ends each pair's scan stands for its unkeyed
-- cohort, kept when it has pending jobs (an empty cohort counted in rr_pairs' depth
-- left the reads to that depth short, and every cohort was read to the sample's size).
-- The scan stops past the pair's share of <BUDGET> keys: a pair with more is
-- crowded (below).
rr_keys (queue, actor, fairness_key, n, share) AS (
    SELECT pa.queue,
           pa.actor,
           (SELECT min(j.fairness_key) FROM {schema}.jobs j
            WHERE j.status = 'pending' AND j.queue = pa.queue AND j.actor = pa.actor),
           1,
           greatest(<BUDGET> / count(*) OVER (), 1)
    FROM pending_actors pa
    JOIN per_actor_capacity pac ON pac.actor = pa.actor
    CROSS JOIN params p
    WHERE pa.actor IS NOT NULL AND pa.queue = ANY (p.rr_queues) AND pac.residual > 0
    UNION ALL
    SELECT k.queue,
           k.actor,
           (SELECT min(j.fairness_key) FROM {schema}.jobs j
            WHERE j.status = 'pending' AND j.queue = k.queue AND j.actor = k.actor
              AND j.fairness_key > k.fairness_key),
           k.n + 1,
           k.share
    FROM rr_keys k
    WHERE k.fairness_key IS NOT NULL AND k.n <= k.share
),
-- Pairs of more cohorts than their share: each cohort read costs about as much as
-- ranking twenty jobs, so near-unique keys (one job per customer), or thousands of
-- cohorts over many actors, made the reads dearer than ranking the whole backlog,
-- which these pairs do instead.
rr_crowded AS (
    SELECT k.queue, k.actor FROM rr_keys k WHERE k.n > k.share AND k.fairness_key IS NOT NULL
),
rr_state (queue, actor, fairness_key, running, turn, wanted) AS (
    SELECT k.queue, k.actor, k.fairness_key,
           CASE WHEN k.fairness_key IS NULL THEN ru.running ELSE coalesce(cs.running, 0) END,
           CASE WHEN k.fairness_key IS NULL THEN p.unkeyed_turn ELSE coalesce(cs.turn, 0) END,
           pac.residual * p.oversample
    FROM rr_keys k
    JOIN per_actor_capacity pac ON pac.actor = k.actor
    CROSS JOIN params p
    CROSS JOIN running_unkeyed ru
    LEFT JOIN cohort_state cs ON cs.fairness_key = k.fairness_key
    WHERE NOT EXISTS (SELECT 1 FROM rr_crowded c WHERE c.queue = k.queue AND c.actor = k.actor)
    -- A probe per pair (a scalar LIMIT 1): an EXISTS here was planned as a hashed scan
    -- of every pending unkeyed job.
      AND (k.fairness_key IS NOT NULL OR (
        SELECT true FROM {schema}.jobs j
        WHERE j.status = 'pending' AND j.queue = k.queue AND j.actor = k.actor
          AND j.fairness_key IS NULL
        LIMIT 1
    ))
),
-- One row per pair, its cohorts in arrays (each pair's lateral unnests its own rather
-- than scanning every pair's), each with how deep to read it: to the least level d
-- at which the pair's cohorts, were each deep enough, hold its sample (the sum of
-- d - running over the cohorts running fewer than d). Over the cohorts in order of
-- running jobs, the first k alone need max(ceil((wanted + their running) / k), the
-- k-th's running); d is the least of these.
--
-- Each pair's sample is sized for the whole batch, so over many pairs those depths
-- read far more than one batch needs (50 actors of 20 keys each: 10,000 jobs read
-- and ranked for a batch of 100). rr_level is the least level at which the cohorts
-- of the pairs that could fill the batch alone (as many free slots as the batch, in
-- a queue without a cap), each key once (its running jobs and its ranks are the
-- key's, across actors), hold limit_n * oversample jobs, were they deep enough: no
-- job past it is needed. ``capped`` reads each cohort to that level at most.
rr_level (depth) AS (
    SELECT min(greatest(ceil((w.wanted + w.below)::numeric / w.k)::bigint, w.running))
    FROM (
        SELECT k.running, k.wanted, ROW_NUMBER() OVER w AS k, sum(k.running) OVER w AS below
        FROM (
            SELECT DISTINCT c.fairness_key, c.running, p.limit_n * p.oversample AS wanted
            FROM rr_state c CROSS JOIN params p
            WHERE c.wanted >= p.limit_n * p.oversample AND c.queue <> ALL (p.capped_queues)
        ) k
        WINDOW w AS (ORDER BY k.running ROWS UNBOUNDED PRECEDING)
    ) w
),
rr_pairs (queue, actor, keys, running, turns, to_depth, capped) AS (
    SELECT c.queue, c.actor, array_agg(c.fairness_key), array_agg(c.running),
           array_agg(c.turn), array_agg(greatest(d.depth - c.running, 0)),
           array_agg(greatest(least(d.depth, (SELECT l.depth FROM rr_level l)) - c.running, 0))
    FROM rr_state c
    JOIN (
        SELECT w.queue, w.actor,
               min(greatest(ceil((w.wanted + w.below)::numeric / w.k)::bigint, w.running))
                   AS depth
        FROM (
            SELECT c.queue, c.actor, c.running, c.wanted,
                   ROW_NUMBER() OVER w AS k, sum(c.running) OVER w AS below
            FROM rr_state c
            WINDOW w AS (PARTITION BY c.queue, c.actor ORDER BY c.running
                         ROWS UNBOUNDED PRECEDING)
        ) w
        GROUP BY w.queue, w.actor
    ) d ON d.queue = c.queue AND d.actor = c.actor
    GROUP BY c.queue, c.actor
),
-- Every pair's cohorts read to the level, when there is one.
rr_capped AS MATERIALIZED (
    SELECT c.*
    FROM rr_pairs pr
    JOIN pending_actors pa ON pa.queue = pr.queue AND pa.actor = pr.actor
    CROSS JOIN params p
    CROSS JOIN LATERAL ("""
    + _cohorts("co.to_depth", depths="pr.capped")
    + """
    ) c
    WHERE (SELECT l.depth IS NOT NULL FROM rr_level l)
),
-- The cohorts those reads need not be made again for: ``ended``, read to their end
-- (fewer jobs than their depth: shallow, or their jobs waiting on running identities),
-- or read to their pair's own depth already (a lone pair's are). Keyed by (is NULL,
-- text) for equality joins, hashable, where IS NOT DISTINCT FROM is a nested loop of
-- all by all.
rr_capped_kept AS MATERIALIZED (
    SELECT pr.queue, pr.actor, co.fairness_key IS NULL AS unkeyed,
           coalesce(co.fairness_key, '') AS fairness_key, co.capped > coalesce(r.n, 0) AS ended
    FROM rr_pairs pr
    CROSS JOIN unnest(pr.keys, pr.capped, pr.to_depth) AS co (fairness_key, capped, to_depth)
    LEFT JOIN (
        SELECT r.queue, r.actor, r.fairness_key IS NULL AS unkeyed,
               coalesce(r.fairness_key, '') AS fairness_key, count(*) AS n
        FROM rr_capped r
        GROUP BY r.queue, r.actor, r.fairness_key IS NULL, coalesce(r.fairness_key, '')
    ) r ON r.queue = pr.queue AND r.actor = pr.actor
       AND r.unkeyed = (co.fairness_key IS NULL)
       AND r.fairness_key = coalesce(co.fairness_key, '')
    WHERE (SELECT l.depth IS NOT NULL FROM rr_level l)
      AND (co.capped > coalesce(r.n, 0) OR co.capped >= co.to_depth)
),
-- Those reads are the candidates unless one ended early: then the cohorts may hold
-- fewer jobs up to the level than it assumed, and the batch may need some past it, so
-- every pair is sampled to its own depth as without a level (the cohorts kept above
-- keep what they gave, not read again). Likewise when two of those reads' jobs share
-- an actor and identity: the level counted each as a job the batch can take, but the
-- walk takes one, so the batch may need jobs past the level (read to it alone, a
-- cohort of one actor's identity shorted the batch that another actor's deeper
-- cohort filled).
rr_use_capped (ok) AS (
    SELECT (SELECT l.depth IS NOT NULL FROM rr_level l)
           AND NOT EXISTS (SELECT 1 FROM rr_capped_kept k WHERE k.ended)
           AND NOT EXISTS (
               SELECT 1 FROM rr_capped r WHERE r.identity_key IS NOT NULL
               GROUP BY r.actor, r.identity_key HAVING count(*) > 1
           )
           -- and when a key the level counted has jobs of a pair that could not fill the
           -- batch (a capped queue, an actor with fewer free slots): those jobs take the
           -- key's levels, but the caps may refuse them (a crowded pair of those may
           -- hold any key).
           AND NOT EXISTS (
               SELECT 1
               FROM rr_capped r
               JOIN per_actor_capacity pac ON pac.actor = r.actor
               CROSS JOIN params p
               GROUP BY r.fairness_key IS NULL, coalesce(r.fairness_key, '')
               HAVING bool_or(pac.residual >= p.limit_n AND r.queue <> ALL (p.capped_queues))
                  AND bool_or(pac.residual < p.limit_n OR r.queue = ANY (p.capped_queues))
           )
           AND NOT EXISTS (
               SELECT 1
               FROM rr_crowded rc
               JOIN per_actor_capacity pac ON pac.actor = rc.actor
               CROSS JOIN params p
               WHERE pac.residual < p.limit_n OR rc.queue = ANY (p.capped_queues)
           )
),
candidates AS (
    SELECT c.id, c.actor, c.queue, c.priority, c.scheduled_at, c.identity_key,
           (ROW_NUMBER() OVER (
               PARTITION BY c.queue = ANY (p.rr_queues),
                            CASE WHEN c.queue = ANY (p.rr_queues) THEN c.fairness_key END
               ORDER BY c.priority DESC, c.scheduled_at, c.id
           ) + c.running) * 4294967296 + c.turn AS fairness_rank
    FROM (
    -- The reads to the level, when they hold: taken whole, not looked up pair by pair
    -- (each pair's scan of them was a third of the statement with 50 pairs).
    SELECT r.id, r.actor, r.queue, r.priority, r.scheduled_at, r.identity_key, r.fairness_key,
           r.running, r.turn
    FROM rr_capped r
    WHERE (SELECT u.ok FROM rr_use_capped u)
    UNION ALL
    SELECT c.*
    FROM pending_actors pa
    JOIN per_actor_capacity pac ON pac.actor = pa.actor
    CROSS JOIN params p
    LEFT JOIN rr_pairs pr ON pr.queue = pa.queue AND pr.actor = pa.actor
    LEFT JOIN rr_crowded rc ON rc.queue = pa.queue AND rc.actor = pa.actor
    CROSS JOIN LATERAL (
        WITH rr_to_depth AS MATERIALIZED ("""
    + _cohorts(
        "co.to_depth",
        """
    WHERE NOT (SELECT u.ok FROM rr_use_capped u)
    UNION ALL
    SELECT r.id, r.actor, r.queue, r.priority, r.scheduled_at, r.identity_key,
           r.fairness_key, r.running, r.turn, r.cohort_rank
    FROM rr_capped r
    JOIN rr_capped_kept e
      ON e.queue = r.queue AND e.actor = r.actor AND e.unkeyed = (r.fairness_key IS NULL)
     AND e.fairness_key = coalesce(r.fairness_key, '')
    WHERE NOT (SELECT u.ok FROM rr_use_capped u) AND r.queue = pa.queue AND r.actor = pa.actor""",
        # Kept from the reads to the level: their rows are taken from there.
        skip="""EXISTS (
                  SELECT 1 FROM rr_capped_kept e
                  WHERE e.queue = pa.queue AND e.actor = pa.actor
                    AND e.unkeyed = (co.fairness_key IS NULL)
                    AND e.fairness_key = coalesce(co.fairness_key, ''))""",
    )
    + """
        ),
        -- The cohorts that read reached the end of (fewer jobs than asked for): read
        -- again, they would give the same jobs. Only a short read looks (below), so
        -- this counts at most a sample's rows per cohort.
        rr_exhausted AS MATERIALIZED (
            SELECT coalesce(array_agg(co.fairness_key) FILTER (WHERE co.fairness_key IS NOT NULL),
                            '{}') AS keys,
                   coalesce(bool_or(co.fairness_key IS NULL), false) AS unkeyed
            FROM unnest(pr.keys, pr.to_depth) AS co (fairness_key, to_depth)
            WHERE co.to_depth > (SELECT count(*) FROM rr_to_depth r
                                 WHERE r.fairness_key IS NOT DISTINCT FROM co.fairness_key)
        )
        SELECT f.id, f.actor, f.queue, f.priority, f.scheduled_at, f.identity_key, f.fairness_key,
               f.running, f.turn
        FROM (
            SELECT * FROM rr_to_depth
            WHERE (SELECT count(*) FROM rr_to_depth) >= pac.residual * p.oversample
            UNION ALL
            -- Short (shallow cohorts): every cohort to the sample's size, as none gives
            -- more; a cohort read to its end already (one whose jobs all wait on a running
            -- identity was read through its backlog) keeps what that read found.
            SELECT r.* FROM rr_to_depth r CROSS JOIN rr_exhausted e
            WHERE NOT (SELECT u.ok FROM rr_use_capped u)
              AND (SELECT count(*) FROM rr_to_depth) < pac.residual * p.oversample
              AND CASE WHEN r.fairness_key IS NULL THEN e.unkeyed
                       ELSE r.fairness_key = ANY (e.keys) END
            UNION ALL
            SELECT * FROM ("""
    + _cohorts(
        "pac.residual * p.oversample",
        """
    CROSS JOIN rr_exhausted e
    WHERE CASE WHEN co.fairness_key IS NULL THEN NOT e.unkeyed
               ELSE co.fairness_key <> ALL (e.keys) END""",
    )
    + """
            ) whole
            WHERE NOT (SELECT u.ok FROM rr_use_capped u)
              AND (SELECT count(*) FROM rr_to_depth) < pac.residual * p.oversample
            UNION ALL
            -- A crowded pair: its whole backlog ranked.
            SELECT j.id, j.actor, j.queue, j.priority, j.scheduled_at, j.identity_key,
                   j.fairness_key,
                   -- The NULL cohort's count and turn read once (an InitPlan; joined,
                   -- running_unkeyed was a nested loop per row), and an equality join
                   -- (hashable) for the others, not IS NOT DISTINCT FROM per row.
                   CASE WHEN j.fairness_key IS NULL
                        THEN (SELECT ru.running FROM running_unkeyed ru)
                        ELSE coalesce(cs.running, 0) END,
                   CASE WHEN j.fairness_key IS NULL THEN p.unkeyed_turn
                        ELSE coalesce(cs.turn, 0) END,
                   ROW_NUMBER() OVER (
                       PARTITION BY j.fairness_key ORDER BY j.priority DESC, j.scheduled_at, j.id
                   )
            FROM {schema}.jobs j
            LEFT JOIN cohort_state cs ON cs.fairness_key = j.fairness_key
            WHERE rc.queue IS NOT NULL
              AND j.status = 'pending' AND j.queue = pa.queue AND j.actor = pa.actor
              AND j.scheduled_at <= p.now
              AND <WAITS_NOT:j>
            UNION ALL
            -- A strict queue asked for in the same call is one cohort: its ranks are its
            -- index order, so its first jobs are read, not its whole backlog ranked.
            SELECT s.id, s.actor, s.queue, s.priority, s.scheduled_at, s.identity_key,
                   s.fairness_key, 0, p.strict_turn,
                   ROW_NUMBER() OVER (ORDER BY s.priority DESC, s.scheduled_at, s.id)
            FROM (
                SELECT j.id, j.actor, j.queue, j.priority, j.scheduled_at, j.identity_key,
                       j.fairness_key
                FROM {schema}.jobs j
                WHERE pa.queue <> ALL (p.rr_queues)
                  AND j.status = 'pending' AND j.queue = pa.queue AND j.actor = pa.actor
                  AND j.scheduled_at <= p.now
                  AND <WAITS_NOT:j>
                ORDER BY j.priority DESC, j.scheduled_at, j.id
                LIMIT pac.residual * p.oversample
            ) s
        ) f
        ORDER BY (f.cohort_rank + f.running) * 4294967296 + f.turn, f.priority DESC,
                 f.scheduled_at, f.id
        LIMIT pac.residual * p.oversample
    ) c
    WHERE pa.actor IS NOT NULL AND pac.residual > 0
    ) c
    CROSS JOIN params p
),<ADMIT:admitted:candidates>"""
).replace("<BUDGET>", str(_COHORT_BUDGET))

# What the candidates of <SOURCE> admit: the jobs the in-memory reference's walk
# (taskq.backend._memory_dispatch.take_jobs) takes, going through them in order and
# taking each job whose queue and actor still have room and whose identity no job
# taken before it holds, counting only the jobs taken before it. Whether a job is
# taken depends only on the jobs before it, so the head's admissions are a prefix
# of the sample's. Jobs of full queues, and jobs whose identity is running, are
# never taken (<NAME>_open).
#
# Without capped queues the walk is two cuts: one job per (actor, identity_key),
# the first; then at most residual jobs per capped actor, by pending_rank (an
# uncapped actor's limit_n-th job is the last it could give a batch of limit_n
# anyway, and locked reads past the jobs other dispatchers hold: cut at limit_n, a
# head they held gave nothing). That is exact: an identity's first job refused for
# its actor's cap leaves that actor full, so its later jobs are refused too.
#
# A queue cap crosses actors, and no order of independent cuts gives the walk: cut
# first, a capped queue's job past its cap kept its identity or actor place from
# another queue's job (which then waited for as long as the queue stayed full);
# cut after the actor cap, a job refused for its actor's cap took the queue's place
# from a later job of another actor (which ran a dispatch later, after jobs behind
# it). With capped queues the walk is computed as a fixed point instead
# (<NAME>_walk): each round takes every job that the previous round's takings
# before it leave room for, from "all taken" until a round changes nothing. Round
# k is right about the first k jobs at least (each depends only on the ones before
# it), so it ends; the answer is the only fixed point. Chains of refusals that
# change the next job's fate are short (each link a job that another's queue or
# actor place turned away): two or three rounds of window functions over the
# candidates, run only when a queue asked for is capped.
_ADMIT: Final = """
<NAME>_open AS (
    SELECT c.* FROM <SOURCE> c
    WHERE NOT EXISTS (
              SELECT 1 FROM queue_capacity qc WHERE qc.queue = c.queue AND qc.residual = 0
          )
      AND (c.identity_key IS NULL OR NOT EXISTS (
              SELECT 1 FROM running_identities ri
              WHERE ri.actor = c.actor AND ri.identity_key = c.identity_key
          ))
),
<NAME>_dedup AS (
    (
        SELECT DISTINCT ON (c.actor, c.identity_key) c.*
        FROM <NAME>_open c
        WHERE c.identity_key IS NOT NULL
          AND (SELECT cardinality(p.capped_queues) = 0 FROM params p)
        ORDER BY c.actor, c.identity_key, <ORDER:c>
    )
    UNION ALL
    SELECT c.* FROM <NAME>_open c
    WHERE c.identity_key IS NULL AND (SELECT cardinality(p.capped_queues) = 0 FROM params p)
),
-- Round 1: each job taken that its queue's, its actor's and its identity's places
-- would take were every job before it taken. That takes no more than the walk (it
-- counts more jobs before each), so once it has taken limit_n * oversample jobs the
-- walk has taken as many: the rows past that point are left out (the oversample
-- keeps some for locked to read past the jobs other dispatchers hold).
<NAME>_first AS (
    SELECT f.*,
           count(*) FILTER (WHERE f.taken) OVER (ORDER BY f.pos ROWS UNBOUNDED PRECEDING)
               - f.taken::int AS taken_before
    FROM (
        SELECT o.*, ROW_NUMBER() OVER (ORDER BY <ORDER:o>) AS pos,
               CASE WHEN pac.capped THEN pac.residual END AS actor_room,
               qc.residual AS queue_room,
               (NOT pac.capped
                OR ROW_NUMBER() OVER (PARTITION BY o.actor ORDER BY <ORDER:o>) <= pac.residual)
               AND (qc.queue IS NULL
                    OR ROW_NUMBER() OVER (PARTITION BY o.queue ORDER BY <ORDER:o>) <= qc.residual)
               AND (o.identity_key IS NULL OR ROW_NUMBER() OVER (
                        PARTITION BY o.actor, o.identity_key ORDER BY <ORDER:o>) = 1) AS taken
        FROM <NAME>_open o
        JOIN per_actor_capacity pac ON pac.actor = o.actor
        LEFT JOIN queue_capacity qc ON qc.queue = o.queue
        WHERE (SELECT cardinality(p.capped_queues) > 0 FROM params p)
    ) f
),
-- Running counts (frames from the partition's start, not excluding the current row:
-- an excluded row makes Postgres recount the frame for every row).
<NAME>_walk (round, id, actor, queue, priority, scheduled_at, identity_key, fairness_rank,
             pos, actor_room, queue_room, was_taken, taken) AS (
    SELECT 1, f.id, f.actor, f.queue, f.priority, f.scheduled_at, f.identity_key,
           f.fairness_rank, f.pos, f.actor_room, f.queue_room, true, f.taken
    FROM <NAME>_first f CROSS JOIN params p
    WHERE f.taken_before < p.limit_n * p.oversample
    UNION ALL
    SELECT w.round + 1, w.id, w.actor, w.queue, w.priority, w.scheduled_at, w.identity_key,
           w.fairness_rank, w.pos, w.actor_room, w.queue_room, w.taken,
           (w.actor_room IS NULL OR count(*) FILTER (WHERE w.taken) OVER (
                PARTITION BY w.actor ORDER BY w.pos ROWS UNBOUNDED PRECEDING
            ) - w.taken::int < w.actor_room)
           AND (w.queue_room IS NULL OR count(*) FILTER (WHERE w.taken) OVER (
                PARTITION BY w.queue ORDER BY w.pos ROWS UNBOUNDED PRECEDING
            ) - w.taken::int < w.queue_room)
           AND (w.identity_key IS NULL OR count(*) FILTER (WHERE w.taken) OVER (
                PARTITION BY w.actor, w.identity_key ORDER BY w.pos ROWS UNBOUNDED PRECEDING
            ) - w.taken::int = 0)
    FROM (
        SELECT w.*, bool_or(w.taken <> w.was_taken) OVER () AS moving FROM <NAME>_walk w
    ) w
    WHERE w.moving
),
<NAME> AS (
    SELECT r.*
    FROM (
        SELECT d.*, ROW_NUMBER() OVER (PARTITION BY d.actor ORDER BY <ORDER:d>) AS pending_rank
        FROM <NAME>_dedup d
    ) r
    JOIN per_actor_capacity pac ON pac.actor = r.actor
    WHERE NOT pac.capped OR r.pending_rank <= pac.residual
    UNION ALL
    SELECT w.id, w.actor, w.queue, w.priority, w.scheduled_at, w.identity_key, w.fairness_rank,
           NULL::bigint
    FROM <NAME>_walk w
    WHERE w.taken AND w.round = (SELECT max(l.round) FROM <NAME>_walk l)
),"""

_DISPATCH_TEMPLATE: Final = """
-- arbiter: clock_timestamp() (due check scheduled_at <= now; started_at and lease expiry)
WITH RECURSIVE
params AS (<PARAMS>
),
-- One index probe per (queue, actor) with pending jobs instead of reading them all.
pending_actors (queue, actor) AS (
    SELECT q.queue,
           (SELECT min(j.actor) FROM {schema}.jobs j
            WHERE j.status = 'pending' AND j.queue = q.queue)
    FROM params p CROSS JOIN unnest(p.queues) AS q (queue)
    UNION ALL
    SELECT pa.queue,
           (SELECT min(j.actor) FROM {schema}.jobs j
            WHERE j.status = 'pending' AND j.queue = pa.queue AND j.actor > pa.actor)
    FROM pending_actors pa
    WHERE pa.actor IS NOT NULL
),
running_per_actor AS (
    SELECT j.actor, count(*) AS in_flight
    FROM {schema}.jobs j
    WHERE j.status = 'running'
      AND j.actor IN (SELECT pa.actor FROM pending_actors pa WHERE pa.actor IS NOT NULL)
    GROUP BY j.actor
),
running_identities AS (
    SELECT DISTINCT j.actor, j.identity_key
    FROM {schema}.jobs j
    WHERE j.status = 'running' AND j.identity_key IS NOT NULL
      AND j.actor IN (SELECT pa.actor FROM pending_actors pa WHERE pa.actor IS NOT NULL)
),
per_actor_capacity AS (
    SELECT a.actor,
           CASE
               WHEN ac.max_concurrent IS NULL THEN p.limit_n
               ELSE least(p.limit_n, greatest(ac.max_concurrent - coalesce(r.in_flight, 0), 0))
           END AS residual,
           -- Admitted as an uncapped actor's when its room holds its whole sample
           -- (residual * oversample): the dispatchers of the same queues sample the
           -- same first jobs, so together they take no more than the room, and locked
           -- reads past the ones the others hold. Cut at residual, those held gave
           -- nothing: a second worker sat out its poll interval behind the first's
           -- batch. eligible still applies the cap to what was locked.
           ac.max_concurrent IS NOT NULL
               AND ac.max_concurrent - coalesce(r.in_flight, 0) < p.limit_n * p.oversample
               AS capped
    FROM (SELECT DISTINCT pa.actor FROM pending_actors pa WHERE pa.actor IS NOT NULL) a
    CROSS JOIN params p
    LEFT JOIN {schema}.actor_config ac ON ac.actor = a.actor
    LEFT JOIN running_per_actor r ON r.actor = a.actor
    -- Only the actors asked for (all when NULL): every sample joins this, so the others'
    -- jobs take no place, rank or turn.
    WHERE p.actors IS NULL OR a.actor = ANY (p.actors)
),
queue_capacity AS (
    SELECT qc.queue,
           greatest(qc.cap - (SELECT count(*) FROM {schema}.jobs j
                              WHERE j.status = 'running' AND j.queue = qc.queue), 0) AS residual
    FROM params p CROSS JOIN unnest(p.capped_queues, p.queue_caps) AS qc (queue, cap)
),<CANDIDATES>
-- The candidates are put in order before the join with jobs, so the nested loop
-- stops locking once it has limit_n rows instead of joining every candidate first.
locked AS (
    SELECT r.id, r.actor, r.queue, r.priority, r.scheduled_at, r.fairness_rank
    FROM (SELECT r.* FROM admitted r ORDER BY <ORDER:r>) r
    JOIN {schema}.jobs j ON j.id = r.id
    WHERE j.status = 'pending'
    ORDER BY <ORDER:r>
    LIMIT (SELECT p.limit_n FROM params p)
    FOR UPDATE OF j SKIP LOCKED
),
eligible_candidates AS (
    SELECT l.*, ac.max_concurrent, coalesce(r.in_flight, 0) AS in_flight,
           ROW_NUMBER() OVER (PARTITION BY l.actor ORDER BY <ORDER:l>) AS actor_rank
    FROM locked l
    LEFT JOIN {schema}.actor_config ac ON ac.actor = l.actor
    LEFT JOIN running_per_actor r ON r.actor = l.actor
    WHERE ac.max_concurrent IS NULL OR coalesce(r.in_flight, 0) < ac.max_concurrent
),
eligible AS (
    (
        SELECT l.id, l.priority, l.scheduled_at, l.fairness_rank
        FROM locked l
        WHERE (SELECT hp.ok FROM head_plain hp)
        LIMIT (SELECT p.limit_n FROM params p)
    )
    UNION ALL
    (
        SELECT e.id, e.priority, e.scheduled_at, e.fairness_rank
        FROM (
            SELECT e.*, ROW_NUMBER() OVER (PARTITION BY e.queue ORDER BY <ORDER:e>) AS queue_rank
            FROM eligible_candidates e
            WHERE e.max_concurrent IS NULL OR e.actor_rank <= e.max_concurrent - e.in_flight
        ) e
        LEFT JOIN queue_capacity qc ON qc.queue = e.queue
        WHERE (qc.queue IS NULL OR e.queue_rank <= qc.residual)
          AND NOT (SELECT hp.ok FROM head_plain hp)
        ORDER BY <ORDER:e>
        LIMIT (SELECT p.limit_n FROM params p)
    )
),
<WRITE>
<RESULT>
"""

# Strict FIFO: always a row, so that a dispatch that locked nothing still says whether
# its head was plain and whether a queue asked for is round robin (then it locked
# nothing on purpose); with no job dispatched, the job columns are NULL.
_STRICT_RESULT: Final = """
SELECT hp.ok AS plain_head, p.round_robin, d.*
FROM head_plain hp CROSS JOIN params p LEFT JOIN dispatched d ON true
ORDER BY <ORDER:d>"""

_ROUND_ROBIN_RESULT: Final = """
SELECT d.* FROM dispatched d ORDER BY <ORDER:d>"""

# Lock and mark what ``eligible`` holds, with one event per job.
_WRITE: Final = """
dispatched AS (
    UPDATE {schema}.jobs j
    SET status = 'running', attempt = j.attempt + 1, locked_by_worker = p.worker_id,
        started_at = p.now, lock_expires_at = p.now + p.lock_lease,
        execution_started_at = NULL, updated_at = p.now
    FROM eligible e CROSS JOIN params p
    WHERE j.id = e.id
    RETURNING <JOB_COLUMNS>, e.fairness_rank
),
events AS (
    INSERT INTO {schema}.job_events (job_id, kind, detail)
    SELECT d.id, 'state_change',
           jsonb_build_object('from_state', 'pending', 'to_state', 'running',
                              'worker_id', p.worker_id::text)
    FROM dispatched d CROSS JOIN params p
    ORDER BY <ORDER:d>
)"""

_STRICT_ORDER: Final = "{a}.priority DESC, {a}.scheduled_at, {a}.id"
_ROUND_ROBIN_ORDER: Final = "{a}.fairness_rank, {a}.priority DESC, {a}.scheduled_at, {a}.id"


def _admit(candidates: str) -> str:
    """``candidates`` with each ``<ADMIT:name:source>`` replaced by the admission CTEs."""
    head, *parts = candidates.split("<ADMIT:")
    for part in parts:
        spec, _, rest = part.partition(">")
        name, source = spec.split(":")
        head += _ADMIT.replace("<NAME>", name).replace("<SOURCE>", source) + rest
    return head


# Strict FIFO reads the queue settings itself (saving a round trip per dispatch),
# and dispatches nothing when a queue asked for is round robin: the caller then
# looks the settings up (QUEUE_SETTINGS) and runs the round-robin variant.
_STRICT_PARAMS: Final = """
    SELECT $1::text[] AS queues,
           CASE WHEN qs.round_robin THEN 0 ELSE $2::int END AS limit_n,
           $3::uuid AS worker_id, $4::interval AS lock_lease, $5::int AS oversample,
           $6::text[] AS actors,
           qs.round_robin, qs.capped_queues, qs.queue_caps, clock_timestamp() AS now
    FROM (
        SELECT coalesce(bool_or(q.mode = 'round_robin'), false) AS round_robin,
               coalesce(array_agg(q.name ORDER BY q.name)
                        FILTER (WHERE q.max_concurrent IS NOT NULL), '{}') AS capped_queues,
               coalesce(array_agg(q.max_concurrent ORDER BY q.name)
                        FILTER (WHERE q.max_concurrent IS NOT NULL), '{}') AS queue_caps
        FROM {schema}.queues q
        WHERE q.name = ANY($1::text[])
    ) AS qs"""

_ROUND_ROBIN_PARAMS: Final = """
    SELECT $1::text[] AS queues, $2::int AS limit_n, $3::uuid AS worker_id,
           $4::interval AS lock_lease, $5::int AS oversample,
           $6::text[] AS capped_queues, $7::int[] AS queue_caps,
           $8::text[] AS rr_queues, $9::text[] AS turn_keys, $10::bigint[] AS turns,
           $11::bigint AS unkeyed_turn, $12::bigint AS strict_turn, $13::text[] AS actors,
           clock_timestamp() AS now"""


# A pending job that waits on a running job of its actor and identity. The samples
# skip them: a per-identity backlog otherwise filled each sample for as long as the
# identity ran, hiding every job behind it. Uncorrelated, the NOT IN is one hashed
# set probed per row, whatever the number of running identities.
_WAITS_NOT: Final = """({a}.identity_key IS NULL
           OR ({a}.actor, {a}.identity_key) NOT IN (
               SELECT ri.actor, ri.identity_key FROM running_identities ri))"""


def _ordered(sql: str, order: str) -> str:
    """``sql`` with ``<WRITE>``, ``<JOB_COLUMNS>`` and every ``<ORDER:alias>`` and
    ``<WAITS_NOT:alias>`` filled in."""
    sql = sql.replace("<WRITE>", _WRITE).replace("<JOB_COLUMNS>", job_columns("j"))
    sql = re.sub(r"<WAITS_NOT:(\w+)>", lambda alias: _WAITS_NOT.replace("{a}", alias[1]), sql)
    return re.sub(r"<ORDER:(\w+)>", lambda alias: order.replace("{a}", alias[1]), sql)


def _variant(candidates: str, order: str, params: str, result: str) -> str:
    sql = _DISPATCH_TEMPLATE.replace("<CANDIDATES>", _admit(candidates))
    return _ordered(sql.replace("<PARAMS>", params).replace("<RESULT>", result), order)


DISPATCH_STRICT_FIFO: Final = TransitionSQL.of(
    JobStatus.PENDING,
    JobStatus.RUNNING,
    _variant(_STRICT_CANDIDATES, _STRICT_ORDER, _STRICT_PARAMS, _STRICT_RESULT),
)
"""Priority, then time, then id; $1..$6 only (caps from the ``queues`` table). Locks
nothing when a queue asked for is ``round_robin``. At least one row: ``plain_head``
and ``round_robin`` on each, the job columns NULL when it locked nothing."""

DISPATCH_ROUND_ROBIN: Final = TransitionSQL.of(
    JobStatus.PENDING,
    JobStatus.RUNNING,
    _variant(_ROUND_ROBIN_CANDIDATES, _ROUND_ROBIN_ORDER, _ROUND_ROBIN_PARAMS, _ROUND_ROBIN_RESULT),
)
"""Interleaves fairness cohorts: ``fairness_rank, priority DESC, scheduled_at, id``.
For calls asking for at least one ``round_robin`` queue ($8 lists them); $9/$10 the
keyed cohorts' turns, $11 the unkeyed one's, $12 the strict queues' (0: never served);
$13 the actors."""

DISPATCH_PLAIN_HEAD: Final = TransitionSQL.of(
    JobStatus.PENDING,
    JobStatus.RUNNING,
    _ordered(
        """
-- arbiter: clock_timestamp() (due check scheduled_at <= now; started_at and lease expiry)
-- Strict FIFO for a plain head only ($1..$6 as DISPATCH_STRICT_FIFO): no per-actor,
-- cap or identity phase to plan or start, which is most of that statement's cost.
-- At least one row: plain_head and head_size (rows the head read) on each, the job
-- columns NULL when it locked nothing; when plain_head is false it locks nothing and
-- DISPATCH_STRICT_FIFO is the one to run.
WITH
params AS ("""
        + _STRICT_PARAMS
        + """
),"""
        + _HEAD
        + """
-- In order before the join, as in locked: the nested loop stops at limit_n rows.
eligible AS (
    SELECT h.id, h.priority, h.scheduled_at, h.fairness_rank
    FROM (SELECT h.* FROM head_rows h ORDER BY <ORDER:h>) h
    JOIN {schema}.jobs j ON j.id = h.id
    WHERE j.status = 'pending' AND (SELECT hp.ok FROM head_plain hp)
    ORDER BY <ORDER:h>
    LIMIT (SELECT p.limit_n FROM params p)
    FOR UPDATE OF j SKIP LOCKED
),<WRITE>
SELECT hp.ok AS plain_head, (SELECT count(*) FROM head_rows) AS head_size, d.*
FROM head_plain hp LEFT JOIN dispatched d ON true
ORDER BY <ORDER:d>
""",
        _STRICT_ORDER,
    ),
)
"""The strict-FIFO batch of a plain head in a small statement; every dispatch of a
strict-FIFO queue list tries it first unless its last head was not plain."""

HEARTBEAT_JOBS: Final = """
-- arbiter: clock_timestamp() (the new lease expiry)
-- The ids renewed. A row another transaction holds is skipped, left for the next
-- heartbeat: waited for, one row held by a long transaction stopped every renewal
-- of the worker, and the reclaim sweep took its other jobs. NO KEY UPDATE, the lock
-- the UPDATE takes anyway: FOR UPDATE also skipped a row whose job an open
-- transaction had only written an event or attempt row for (the KEY SHARE lock that
-- write_attempt and a late outcome take on the job, as the foreign keys' checks did).
WITH renewable AS (
    SELECT j.id FROM {schema}.jobs j
    WHERE j.status = 'running' AND j.locked_by_worker = $1
    FOR NO KEY UPDATE SKIP LOCKED
)
UPDATE {schema}.jobs j
SET lock_expires_at = clock_timestamp() + $2::interval, updated_at = clock_timestamp()
FROM renewable r
WHERE j.id = r.id
RETURNING j.id
"""

HELD_JOBS: Final = """
-- arbiter: none (the running jobs a worker holds)
SELECT id, attempt FROM {schema}.jobs WHERE status = 'running' AND locked_by_worker = $1
"""

EXTEND_RESERVATION_LEASES: Final = """
-- arbiter: clock_timestamp() (the new lease expiry)
-- A slot is held for its job's run: only the slots of jobs this worker still runs are
-- renewed, so the lease of one left behind by an ended or reclaimed job lapses.
-- (Nothing acquires slots yet, nor frees lapsed ones: rate limits and reservations
-- come with a later issue.)
UPDATE {schema}.reservation_slots rs
SET lease_expires_at = clock_timestamp() + $2::interval
FROM {schema}.jobs j
WHERE rs.worker_id = $1
  AND j.id = rs.job_id AND j.status = 'running' AND j.locked_by_worker = $1
"""

REGISTER_ACTORS: Final = """
-- arbiter: clock_timestamp() (updated_at, via the table's trigger)
-- A queue or job defaults not given (NULL) keep the registered ones, as an older
-- worker's upsert does.
INSERT INTO {schema}.actor_config AS ac (actor, max_concurrent, max_pending, queue, job_defaults)
SELECT u.actor, u.max_concurrent, u.max_pending, u.queue, u.job_defaults::jsonb
FROM unnest($1::text[], $2::int[], $3::int[], $4::text[], $5::text[])
    AS u (actor, max_concurrent, max_pending, queue, job_defaults)
ON CONFLICT (actor) DO UPDATE
SET max_concurrent = excluded.max_concurrent, max_pending = excluded.max_pending,
    queue = coalesce(excluded.queue, ac.queue),
    job_defaults = coalesce(excluded.job_defaults, ac.job_defaults)
"""

CONFIGURE_QUEUE: Final = """
-- arbiter: none
INSERT INTO {schema}.queues (name, mode, max_concurrent) VALUES ($1, $2, $3)
ON CONFLICT (name) DO UPDATE SET mode = excluded.mode, max_concurrent = excluded.max_concurrent
"""
