"""Which slots of a due cron schedule fire now, for every backend's cron tick.

The backend reads ``now`` off its own clock (Postgres: inside the tick's
transaction), so the due check, the catch-up cutoff and the recompute all
use one arbiter.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Final

from taskq.backend._memory_schedules import next_fire_at
from taskq.models import ScheduleRecord

__all__ = ["MAX_SLOTS_PER_TICK", "cron_slots"]

MAX_SLOTS_PER_TICK: Final = 1000
"""Slots one schedule may fire in one tick; the rest fire on the next ticks."""


def cron_slots(
    schedule: ScheduleRecord, now: datetime, catch_up: timedelta
) -> tuple[list[datetime], datetime]:
    """The slots of ``schedule`` to fire at ``now`` and its next ``next_fire_at``.

    Slots from ``next_fire_at`` up to ``now`` fire, except those older than
    ``catch_up`` (a leader gap longer than that skips them: the schedule
    resumes from ``now - catch_up``).
    """
    cutoff = now - catch_up
    slot = schedule.next_fire_at
    if slot is None or slot < cutoff:
        slot = next_fire_at(schedule.cron, schedule.timezone, cutoff)
    slots: list[datetime] = []
    while slot <= now and len(slots) < MAX_SLOTS_PER_TICK:
        slots.append(slot)
        slot = next_fire_at(schedule.cron, schedule.timezone, slot)
    return slots, slot
