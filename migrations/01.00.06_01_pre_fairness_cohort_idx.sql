-- Round-robin dispatch names the fairness cohorts of each (queue, actor) with a
-- loose scan of this index (one probe per cohort) and reads each cohort's first
-- jobs in dispatch order from it, so a batch costs about the cohorts plus the
-- sample instead of ranking the whole backlog (1,000,000 pending in 1,000 cohorts:
-- ~30 ms a dispatch of 16 instead of ~2.2 s). NULL keys are indexed too: the
-- unkeyed cohort is read the same way, and a round-robin queue whose jobs all carry
-- keys must not scan its backlog to find it empty. The INCLUDE column is the rest
-- of what the sample reads, so the scans can be index-only.
--
-- Its cost falls on every pending row, whatever its queue's mode: measured here,
-- bulk enqueue by COPY ~13 % slower and by multi-row INSERT ~8 %, a one-job enqueue
-- within noise; dispatch (a row leaving pending) inserts nothing into it.
--
-- This file stays transactional (a test pins that every bundled migration
-- is), so the plain CREATE INDEX below locks jobs against writes while it
-- builds. On a large, busy table, build the same index by hand first,
-- outside a transaction, and this migration then does nothing:
--
--     CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_fairness_idx
--         ON <schema>.jobs (queue, actor, fairness_key, priority DESC, scheduled_at, id)
--         INCLUDE (identity_key) WHERE status = 'pending';
--
-- If a concurrent build fails it leaves an INVALID index behind: drop it and
-- run the build again before migrating.
CREATE INDEX IF NOT EXISTS jobs_fairness_idx ON {schema}.jobs
    (queue, actor, fairness_key, priority DESC, scheduled_at, id)
    INCLUDE (identity_key)
    WHERE status = 'pending';
