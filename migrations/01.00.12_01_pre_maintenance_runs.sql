-- The latest slot each of the leader's slotted loops (prune, archive expiry) ran: a
-- leader elected after a slot's time, when no leader ran it, finds it missing here and
-- runs it once at start, where it waited for the next slot (a week for a weekly one).
-- The slot only moves forward (its update is guarded), so two leaders cannot both
-- record one run; ran_at is the database clock's, for observability.
CREATE TABLE IF NOT EXISTS {schema}.maintenance_runs (
    loop text PRIMARY KEY,
    slot timestamptz NOT NULL,
    ran_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
