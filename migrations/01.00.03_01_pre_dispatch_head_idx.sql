-- Strict-FIFO dispatch reads the head of each queue asked for in dispatch
-- order (priority DESC, scheduled_at, id) across all its actors, so a batch
-- costs limit_n * oversample index entries instead of that many per actor.
-- The INCLUDE columns are the rest of what the head phase reads, so the scan
-- can be index-only.
--
-- This file stays transactional (a test pins that every bundled migration
-- is), so the plain CREATE INDEX below locks jobs against writes while it
-- builds. On a large, busy table, build the same index by hand first,
-- outside a transaction, and this migration then does nothing:
--
--     CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_dispatch_head_idx
--         ON <schema>.jobs (queue, priority DESC, scheduled_at, id)
--         INCLUDE (actor, identity_key) WHERE status = 'pending';
--
-- If a concurrent build fails it leaves an INVALID index behind: drop it and
-- run the build again before migrating.
CREATE INDEX IF NOT EXISTS jobs_dispatch_head_idx ON {schema}.jobs
    (queue, priority DESC, scheduled_at, id)
    INCLUDE (actor, identity_key)
    WHERE status = 'pending';
