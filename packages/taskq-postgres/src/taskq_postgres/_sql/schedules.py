"""Cron schedules. ``next_fire_at`` is computed in Python from a time read off the
server clock (``CLOCK_NOW``), so the first fire is anchored to the same arbiter
as the cron due-check."""

from __future__ import annotations

from typing import Final

__all__ = [
    "CLOCK_NOW",
    "DELETE_SCHEDULE",
    "INSERT_SCHEDULE",
    "LIST_SCHEDULES",
    "LOCK_SCHEDULE",
    "SCHEDULE_COLUMNS",
    "UPDATE_SCHEDULE",
]

SCHEDULE_COLUMNS: Final = (
    "s.id, s.name, s.actor, s.queue, s.cron, s.timezone, s.payload::text AS payload, s.enabled, "
    "s.next_fire_at, s.last_fired_at, s.created_at, s.updated_at, s.options::text AS options"
)

CLOCK_NOW: Final = """
-- arbiter: clock_timestamp() (the instant next_fire_at is computed from)
SELECT clock_timestamp()
"""

INSERT_SCHEDULE: Final = (
    """
-- arbiter: clock_timestamp() ($9: created_at = updated_at, read by CLOCK_NOW)
INSERT INTO {schema}.schedules AS s
    (id, name, actor, cron, payload, queue, timezone, enabled, options, next_fire_at,
     created_at, updated_at)
VALUES ($1, $2, $3, $4, $5::text::jsonb, $6, $7, $8, $10::text::jsonb, $11, $9, $9)
RETURNING """
    + SCHEDULE_COLUMNS
)

LOCK_SCHEDULE: Final = (
    """
-- arbiter: clock_timestamp() (the instant the new next_fire_at is computed from)
SELECT clock_timestamp() AS now, """
    + SCHEDULE_COLUMNS
    + """
FROM {schema}.schedules s WHERE s.id = $1 FOR UPDATE
"""
)

UPDATE_SCHEDULE: Final = (
    """
-- arbiter: clock_timestamp() (updated_at, via the table's trigger)
UPDATE {schema}.schedules AS s
SET cron = $2, payload = $3::text::jsonb, queue = $4, timezone = $5, enabled = $6,
    options = $7::text::jsonb, next_fire_at = $8
WHERE s.id = $1
RETURNING """
    + SCHEDULE_COLUMNS
)

LIST_SCHEDULES: Final = (
    """
-- arbiter: none
SELECT """
    + SCHEDULE_COLUMNS
    + """
FROM {schema}.schedules s
WHERE ($1::text IS NULL OR s.actor = $1) AND ($2::bool IS NULL OR s.enabled = $2)
-- By code point, as every backend orders them: not by the database's collation.
ORDER BY s.name COLLATE "C"
"""
)

DELETE_SCHEDULE: Final = """
-- arbiter: none
DELETE FROM {schema}.schedules WHERE id = $1 RETURNING id
"""
