-- Whether a job was enqueued as a singleton (at most one active job of its actor and
-- identity key): an operator's retry of a finished singleton must not make it a second
-- active job of its identity, and only the row can say it was one. Instant: a constant
-- default needs no rewrite of the table. The archive mirrors it (prune copies it).
-- Rows stored before it, or enqueued during a rolling deploy by a release without it,
-- read false (nothing could tell which were singletons): their retry is not checked.
ALTER TABLE {schema}.jobs ADD COLUMN IF NOT EXISTS singleton boolean NOT NULL DEFAULT false;
ALTER TABLE {schema}.jobs_archive ADD COLUMN IF NOT EXISTS singleton boolean NOT NULL DEFAULT false;
