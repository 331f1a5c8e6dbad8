-- Each actor's declared job options (priority, max_attempts, timeout, schedule_to_close,
-- result_ttl), registered by the workers that have it: a cron slot of an actor the
-- leader does not have takes them (it took the enqueue defaults: three attempts, no
-- timeout, whichever worker led). NULL: registered by an older worker, or not known.
ALTER TABLE {schema}.actor_config ADD COLUMN IF NOT EXISTS job_defaults jsonb;
