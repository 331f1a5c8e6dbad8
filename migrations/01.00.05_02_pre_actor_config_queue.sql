-- Each actor's queue, registered by the workers that have it: a cron slot of an actor
-- the leader does not have goes there (it went to "default", where no worker of the
-- actor may ever look). NULL: registered by an older worker, or not known.
ALTER TABLE {schema}.actor_config ADD COLUMN IF NOT EXISTS queue text;
