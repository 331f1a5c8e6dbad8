-- A tracked batch's children still to run, found at once: after each child's end the
-- worker asks whether any is left (the batch completes when none is), and through
-- jobs_batch_id_idx that walked every finished child first (a 20,000-child batch:
-- ~3 ms a child's end, 64 s of database time for the batch). Only jobs of a batch
-- enter it, and only while they wait or run.
--
-- This file stays transactional (a test pins that every bundled migration is), so
-- the plain CREATE INDEX below locks jobs against writes while it builds (it reads
-- the batched jobs only, but the whole table). On a large, busy table, build the
-- same index by hand first, outside a transaction, and this migration then does
-- nothing:
--
--     CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_batch_active_idx
--         ON <schema>.jobs ((metadata ->> 'batch_id'))
--         WHERE metadata ? 'batch_id' AND status IN ('pending', 'scheduled', 'running');
CREATE INDEX IF NOT EXISTS jobs_batch_active_idx ON {schema}.jobs ((metadata ->> 'batch_id'))
    WHERE metadata ? 'batch_id' AND status IN ('pending', 'scheduled', 'running');
