"""Which slots of a due cron schedule fire now, for every backend's cron tick.

The backend reads ``now`` off its own clock (Postgres: inside the tick's
transaction), so the due check, the catch-up cutoff and the recompute all
use one arbiter.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Final
from zoneinfo import ZoneInfo

import structlog
from croniter import CroniterBadDateError, croniter

from taskq.errors import SingletonCollisionError
from taskq.models import RANDOM_CRON_FIELD, EnqueueArgs, ScheduleRecord

__all__ = [
    "MAX_SLOTS_PER_TICK",
    "cron_slots",
    "first_fire_at",
    "next_fire_at",
    "one_per_singleton",
    "skipped_slots",
    "updated_fire_at",
    "within_max_pending",
]

_log = structlog.get_logger("taskq.leader")

_MAX_REPEATED_SLOTS: Final = 3601
"""Slots one repeated hour can hold (a per-second cron): skipped one by one."""

MAX_SLOTS_PER_TICK: Final = 1000
"""Slots one schedule may fire in one tick; the rest fire on the next ticks."""


def first_fire_at(cron: str, timezone: str, enabled: bool, now: datetime) -> datetime | None:
    """A schedule's ``next_fire_at`` as it is stored or changed at ``now`` (the backend's
    clock): None when disabled (enabling it computes it again); ``ValueError`` when
    enabled and ``cron`` matches no later time (a year field in the past): it would be
    stored enabled and never fire."""
    if not enabled:
        return None
    fire = next_fire_at(cron, timezone, now)
    if fire is None:
        raise ValueError(
            f"cron expression {cron!r} never fires after now; give a time still to come, "
            f"or disable the schedule"
        )
    return fire


def updated_fire_at(
    current: ScheduleRecord, updated: ScheduleRecord, now: datetime
) -> datetime | None:
    """``next_fire_at`` of ``current`` changed into ``updated`` at ``now``: kept while its
    timing (cron, time zone, enabled) is unchanged, else computed from ``now``. Always
    computed, a payload change dropped the slots due and not yet fired (a catch-up's
    whole backlog)."""
    if current.next_fire_at is not None and (updated.cron, updated.timezone, updated.enabled) == (
        current.cron,
        current.timezone,
        current.enabled,
    ):
        return current.next_fire_at
    return first_fire_at(updated.cron, updated.timezone, updated.enabled, now)


def next_fire_at(cron: str, timezone: str, after: datetime) -> datetime | None:
    """The first time ``cron`` matches strictly after ``after``, read in ``timezone``
    (so "0 9 * * *" means 09:00 local, across DST changes), returned in UTC; None
    when it matches no later time (a one-shot whose year has passed).

    A sixth cron field gives seconds, a seventh the year (croniter's layout)."""
    local_start = after.astimezone(ZoneInfo(timezone))
    times = _times(cron, local_start)
    try:
        fire: datetime = times.get_next(datetime)
        # When clocks go back, a local time happens twice (the second has fold=1). A
        # schedule with set hours runs once at it, as cron does; an every-hour one runs
        # in both hours, as elapsed time says.
        for _ in range(_MAX_REPEATED_SLOTS):
            if fire.fold == 0 or times.expanded[1] == ["*"]:
                break
            fire = times.get_next(datetime)
    except CroniterBadDateError:
        return None
    return fire.astimezone(UTC)


def _times(cron: str, start: datetime) -> croniter:
    """croniter's times of ``cron`` from ``start``. A random field (R), refused at
    create/update but stored before that, is drawn from the expression instead (as
    croniter's hashed ``H``): croniter drew it again at each computation of the next
    slot, so "R 3 * * *" fired at two or three random minutes of 03:00 each night.
    Drawn from the expression, it is one time a period, the same on every leader."""
    fields = cron.split()
    if not any(RANDOM_CRON_FIELD.match(field) for field in fields):
        return croniter(cron, start)
    hashed = " ".join(
        f"H{field[1:]}" if RANDOM_CRON_FIELD.match(field) else field for field in fields
    )
    return croniter(hashed, start, hash_id=cron)


def cron_slots(
    schedule: ScheduleRecord, now: datetime, catch_up: timedelta
) -> tuple[list[datetime], datetime | None]:
    """The slots of ``schedule`` to fire at ``now`` and its next ``next_fire_at`` (None:
    the cron has no later time, and the schedule is done).

    Slots from ``next_fire_at`` up to ``now`` fire, except those older than
    ``catch_up`` (a leader gap longer than that skips them: the schedule
    resumes from ``now - catch_up``).
    """
    cutoff = now - catch_up
    try:
        slot = schedule.next_fire_at
        if slot is not None and slot < cutoff:
            # Skipped by design (cron_catch_up), but not in silence: no job or event
            # would say that these slots never ran.
            _log.warning(
                "taskq.schedule-slots-missed",
                schedule=schedule.name,
                since=slot.isoformat(),
                until=cutoff.isoformat(),
                hint="no leader fired them within cron_catch_up (TASKQ_CRON_CATCH_UP); "
                "the schedule goes on from its next slot",
            )
        if slot is None or slot < cutoff:
            slot = next_fire_at(schedule.cron, schedule.timezone, cutoff)
        slots: list[datetime] = []
        while slot is not None and slot <= now and len(slots) < MAX_SLOTS_PER_TICK:
            slots.append(slot)
            slot = next_fire_at(schedule.cron, schedule.timezone, slot)
    except Exception as exc:  # noqa: BLE001 - a row this code cannot read, whatever the cause
        # A time zone this host's tzdata lacks, an expression a newer croniter refuses:
        # raised, it failed every tick (the guard then ended each leader in turn) and,
        # first in line, kept every other schedule from firing. Parked instead.
        _log.error(
            "taskq.schedule-unreadable",
            schedule=schedule.name,
            cron=schedule.cron,
            timezone=schedule.timezone,
            error=repr(exc),
            hint="the schedule is parked (no next fire time): fix its cron or timezone "
            "with `taskq schedules update`, which computes it again",
        )
        return [], None
    return slots, slot


def one_per_singleton(
    schedule: ScheduleRecord, slots: list[datetime], jobs: list[EnqueueArgs]
) -> list[EnqueueArgs]:
    """``jobs`` (of ``slots``) keeping the first of each singleton identity: the slots of
    a catch-up collided with each other in their all-or-nothing enqueue, and a singleton
    schedule enqueued none of them."""
    seen: set[tuple[str, str | None]] = set()
    kept: list[EnqueueArgs] = []
    for job in jobs:
        if job.singleton:
            if (job.actor, job.identity_key) in seen:
                continue
            seen.add((job.actor, job.identity_key))
        kept.append(job)
    if len(kept) < len(jobs):
        _log.warning(
            "taskq.schedule-slot-skipped",
            schedule=schedule.name,
            slots=(slots[0].isoformat(), slots[-1].isoformat()),
            skipped=len(jobs) - len(kept),
            reason="singleton: one job for the slots of one tick",
        )
    return kept


def within_max_pending(
    schedule: ScheduleRecord,
    slots: list[datetime],
    jobs: list[EnqueueArgs],
    max_pending: int,
    waiting: int,
) -> list[EnqueueArgs]:
    """The first of ``jobs`` (of ``slots``, in order) that fit within the ``max_pending``
    registered for the schedule's actor beside its ``waiting`` (pending + scheduled)
    jobs, as the client counts them; the rest are skipped, said in one log line, and
    never fired later (the schedule is advanced past them as past the others)."""
    room = max(max_pending - waiting, 0)
    if len(jobs) <= room:
        return jobs
    _log.warning(
        "taskq.schedule-slot-skipped",
        schedule=schedule.name,
        actor=schedule.actor,
        max_pending=max_pending,
        slots=(slots[0].isoformat(), slots[-1].isoformat()),
        skipped=len(jobs) - room,
        reason="max_pending",
        hint="the actor's waiting jobs reached its max_pending: is a worker running the "
        "actor on its queue? Skipped slots are not fired later",
    )
    return jobs[:room]


def skipped_slots(schedule: ScheduleRecord, slots: list[datetime], exc: Exception) -> None:
    """Say why a schedule's slots were not enqueued; the tick goes on with the others
    and advances this one past them (a slot that cannot be enqueued now never can)."""
    first, last = slots[0].isoformat(), slots[-1].isoformat()
    if isinstance(exc, SingletonCollisionError):
        # The schedule's singleton job of an earlier slot is still active.
        _log.warning(
            "taskq.schedule-slot-skipped",
            schedule=schedule.name,
            slots=(first, last),
            reason="singleton-active",
        )
        return
    _log.error(
        "taskq.schedule-slot-skipped", schedule=schedule.name, slots=(first, last), error=repr(exc)
    )
