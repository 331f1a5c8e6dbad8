-- The history tables' foreign keys to jobs go: jobs_delete_history (the pre
-- migration of this release) deletes a job's history with it, and the code of this
-- release checks that a job exists where it writes history for one by id.
ALTER TABLE {schema}.job_attempts DROP CONSTRAINT IF EXISTS job_attempts_job_id_fkey;
ALTER TABLE {schema}.job_events DROP CONSTRAINT IF EXISTS job_events_job_id_fkey;
