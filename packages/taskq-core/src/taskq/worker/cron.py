"""The job of one cron slot: what the leader's cron loop asks the backend to enqueue."""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime

import structlog

from taskq.client import JobsClient
from taskq.errors import TaskQError
from taskq.models import EnqueueArgs, ScheduleRecord

__all__ = ["SlotJobBuilder"]

_log = structlog.get_logger("taskq.leader")


class SlotJobBuilder:
    """The backend's ``ScheduleFire`` callback: builds the job of one slot through
    ``client`` (payload validation, the actor's defaults) for the ``actors`` this
    worker knows. The slot's idempotency key makes a second enqueue of the same
    slot return the first job instead of running it twice."""

    def __init__(self, client: JobsClient, actors: Collection[str]) -> None:
        self._client = client
        self._actors = actors

    def __call__(self, schedule: ScheduleRecord, slot: datetime) -> EnqueueArgs | None:
        key = f"taskq:schedule:{schedule.id}:{slot.isoformat()}"
        metadata = {"schedule_id": str(schedule.id), "schedule_slot": slot.isoformat()}
        if schedule.actor not in self._actors:
            # Another worker may know the actor: enqueue as stored rather than drop
            # the slot (the stranded-jobs warning covers an actor nobody runs).
            return EnqueueArgs(
                actor=schedule.actor,
                queue=schedule.queue or "default",
                payload=schedule.payload,
                idempotency_key=key,
                metadata=metadata,
            )
        try:
            return self._client.build_args(
                schedule.actor,
                schedule.payload,
                queue=schedule.queue,
                idempotency_key=key,
                metadata=metadata,
                **schedule.options,
            )
        except (TaskQError, TypeError, ValueError) as exc:
            # A bad stored payload or option fails every slot alike: say so and skip.
            _log.error(
                "taskq.schedule-slot-skipped",
                schedule=schedule.name,
                slot=slot.isoformat(),
                error=repr(exc),
            )
            return None
