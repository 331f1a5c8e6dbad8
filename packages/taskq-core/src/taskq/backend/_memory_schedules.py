"""Cron schedules kept in memory, with ``next_fire_at`` taken from the backend's clock."""

from __future__ import annotations

from datetime import datetime
from uuid import UUID, uuid4

from taskq.backend.clock import Clock
from taskq.backend.cron import first_fire_at, updated_fire_at
from taskq.backend.storable import stored_json
from taskq.models import ScheduleCreateArgs, ScheduleRecord, ScheduleUpdateArgs

__all__ = ["ScheduleTable"]


class ScheduleTable:
    """The schedules of one in-memory backend, keyed by id; names are unique."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._rows: dict[UUID, ScheduleRecord] = {}

    def create(self, args: ScheduleCreateArgs) -> ScheduleRecord:
        if any(row.name == args.name for row in self._rows.values()):
            raise ValueError(
                f"a schedule named {args.name!r} already exists; update it or pick another name"
            )
        now = self._clock.now()
        record = ScheduleRecord(
            id=uuid4(),
            name=args.name,
            actor=args.actor,
            cron=args.cron,
            payload=stored_json(args.payload),
            queue=args.queue,
            timezone=args.timezone,
            enabled=args.enabled,
            options=stored_json(args.options),
            next_fire_at=first_fire_at(args.cron, args.timezone, args.enabled, now),
            created_at=now,
            updated_at=now,
        )
        self._rows[record.id] = record
        return record

    def list(self, *, actor: str | None, enabled: bool | None) -> list[ScheduleRecord]:
        return sorted(
            (
                row
                for row in self._rows.values()
                if (actor is None or row.actor == actor)
                and (enabled is None or row.enabled == enabled)
            ),
            key=lambda row: row.name,
        )

    def update(self, schedule_id: UUID, args: ScheduleUpdateArgs) -> ScheduleRecord:
        current = self._get(schedule_id)
        merged = current.model_copy(update=args.changes())
        now = self._clock.now()
        updated = merged.model_copy(
            update={
                "payload": stored_json(merged.payload),
                "options": stored_json(merged.options),
                "next_fire_at": updated_fire_at(current, merged, now),
                "updated_at": now,
            }
        )
        self._rows[schedule_id] = updated
        return updated

    def advance(
        self, schedule_id: UUID, following: datetime | None, fired: datetime | None
    ) -> None:
        """Move a schedule past the slots just fired (``fired``: the last of them); a
        change to the row, so ``updated_at`` moves too (as Postgres's trigger does)."""
        current = self._get(schedule_id)
        changes: dict[str, object] = {"next_fire_at": following, "updated_at": self._clock.now()}
        if fired is not None:
            changes["last_fired_at"] = fired
        self._rows[schedule_id] = current.model_copy(update=changes)

    def delete(self, schedule_id: UUID) -> None:
        self._get(schedule_id)
        del self._rows[schedule_id]

    def _get(self, schedule_id: UUID) -> ScheduleRecord:
        try:
            return self._rows[schedule_id]
        except KeyError:
            raise KeyError(f"no schedule with id {schedule_id}") from None
