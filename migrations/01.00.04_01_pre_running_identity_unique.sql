-- At most one running job per (actor, identity_key), whatever dispatchers race.
-- A dispatch reads the running identities from its statement's snapshot: two
-- dispatches, each missing the other's not yet committed job (a job of higher
-- priority arriving in between makes them pick different ones), could both start
-- a job of one identity. With this index the second UPDATE fails with a unique
-- violation; the backend then runs its dispatch again, which sees the running job.
-- NULL keys never conflict (NULLS DISTINCT): jobs without an identity are free.
--
-- Fails if jobs of one identity already run side by side: let them finish, then
-- migrate again. On a large, busy table build it by hand first, outside a
-- transaction (see 01.00.03), and this migration then does nothing:
--
--     CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS jobs_running_identity_key
--         ON <schema>.jobs (actor, identity_key) WHERE status = 'running';
CREATE UNIQUE INDEX IF NOT EXISTS jobs_running_identity_key ON {schema}.jobs
    (actor, identity_key)
    WHERE status = 'running';
