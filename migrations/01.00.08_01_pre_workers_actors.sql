-- The actors each live worker runs (its application's, the ones it dispatches): the
-- stranded-jobs detector warns about waiting jobs of an actor no live worker runs. The
-- actor_config rows it read before outlive every release (register_actors only adds), so
-- an actor removed or renamed since was never reported. NULL for a row written by a
-- release before this one: such a worker counts as running every actor, so a rolling
-- deploy raises no false alarm. Instant: no default, no rewrite of the table.
ALTER TABLE {schema}.workers ADD COLUMN IF NOT EXISTS actors text[];
