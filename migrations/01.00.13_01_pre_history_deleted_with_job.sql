-- A job's history (job_attempts, job_events) is deleted with the job by this trigger,
-- as the foreign keys' ON DELETE CASCADE did: the post migration of this release
-- drops those foreign keys. Their check, run for every history row inserted (three a
-- job on its way to succeeded), took about 7 µs of the server's time a row: a fifth of
-- a dispatch's time, and a one-worker drain ran about a quarter faster without them
-- (bench/README.md, "Drain, 7 December"). Every statement of TaskQ's that writes a
-- history row takes the job's row in the same statement (it updates or locks it), so
-- no such row is written for a job that does not exist or is being deleted.
--
-- One statement-level trigger per DELETE on jobs (the prune's batches, a user's own
-- delete), over the rows it deleted. While the foreign keys still exist their cascade
-- runs first and this finds nothing left to delete. It runs with its owner's rights,
-- as a foreign key's cascade does with the table owner's: a role that may delete jobs
-- needs no right of its own on the history tables for it.
CREATE OR REPLACE FUNCTION {schema}.delete_job_history() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    DELETE FROM {schema}.job_events e WHERE e.job_id IN (SELECT g.id FROM gone g);
    DELETE FROM {schema}.job_attempts a WHERE a.job_id IN (SELECT g.id FROM gone g);
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS jobs_delete_history ON {schema}.jobs;
CREATE TRIGGER jobs_delete_history AFTER DELETE ON {schema}.jobs
    REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.delete_job_history();
