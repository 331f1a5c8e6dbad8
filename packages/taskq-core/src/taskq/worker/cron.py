"""The job of one cron slot: what the leader's cron loop asks the backend to enqueue."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from datetime import datetime
from typing import Any

import structlog

from taskq.actor import IDENTITY_FROM_PAYLOAD
from taskq.client import JobsClient
from taskq.errors import PayloadValidationError
from taskq.models import EnqueueArgs, ScheduleRecord

__all__ = ["SlotJobBuilder"]

_log = structlog.get_logger("taskq.leader")


class SlotJobBuilder:
    """The backend's ``ScheduleFire`` callback: builds the job of one slot through
    ``client`` (payload validation, the actor's defaults) for the ``actors`` this
    worker knows. The slot's idempotency key makes a second enqueue of the same
    slot return the first job instead of running it twice.

    A slot of an actor this worker does not have (another worker's) is enqueued as
    stored: with the schedule's options over the job options the actor's workers
    registered (``job_defaults``), on the schedule's queue, else the one they
    registered (``queues``), else ``default``; its payload is checked by the worker
    that runs it. So is a slot whose stored payload the actor refuses: its job fails
    with the validation error.

    Unless the actor computes its jobs' ``identity_key`` from the payload (its workers
    registered :data:`~taskq.actor.IDENTITY_FROM_PAYLOAD`) and the schedule's options
    name none: the identity keeps the jobs of one key from running together, and
    enqueued without it the slot's job ran beside them. Such a slot is skipped and said
    (``taskq.schedule-slot-skipped``, ``reason="identity_key"``); a leader with the
    actor fires it, as does one whose schedule names its ``identity_key``."""

    def __init__(
        self,
        client: JobsClient,
        actors: Collection[str],
        queues: Mapping[str, str],
        job_defaults: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        self._client = client
        self._actors = actors
        self._queues = queues
        self._job_defaults = job_defaults or {}

    def __call__(self, schedule: ScheduleRecord, slot: datetime) -> EnqueueArgs | None:
        key = f"taskq:schedule:{schedule.id}:{slot.isoformat()}"
        metadata = {"schedule_id": str(schedule.id), "schedule_slot": slot.isoformat()}
        try:
            if schedule.actor not in self._actors:
                if self._identity_unknown(schedule):
                    _log.error(
                        "taskq.schedule-slot-skipped",
                        schedule=schedule.name,
                        slot=slot.isoformat(),
                        reason="identity_key",
                        hint=f"actor {schedule.actor!r} computes each job's identity_key "
                        f"from its payload, and this leader's application does not have "
                        f"the actor: run the leader with an application that has it, or "
                        f"give the schedule an identity_key option",
                    )
                    return None
                # Another worker may know the actor: enqueue rather than drop the slot
                # (the stranded-jobs warning covers an actor nobody runs). On "default"
                # it sat where no worker of the actor's queue ever looked.
                return self._as_stored(schedule, key, metadata)
            try:
                return self._client.build_args(
                    schedule.actor,
                    schedule.payload,
                    queue=schedule.queue,
                    idempotency_key=key,
                    metadata=metadata,
                    **schedule.options,
                )
            except PayloadValidationError as exc:
                # Stored where nothing could check it (`taskq schedules`, which loads no
                # application). Skipped, every slot was lost with a line in the leader's
                # log only; enqueued as stored, each fails with the validation error,
                # in the job list for all to see.
                _log.error(
                    "taskq.schedule-payload-invalid",
                    schedule=schedule.name,
                    slot=slot.isoformat(),
                    error=str(exc),
                )
                return self._as_stored(schedule, key, metadata)
        except Exception as exc:  # noqa: BLE001 - the actor's own code raises what it will
            # A bad stored option fails every slot alike, and so does the actor's own code
            # (a payload validator, an identity_key) raising on the stored payload: say so
            # and skip. Raised, it ended the tick, every tick, before the later schedules.
            _log.error(
                "taskq.schedule-slot-skipped",
                schedule=schedule.name,
                slot=slot.isoformat(),
                error=repr(exc),
            )
            return None

    def _identity_unknown(self, schedule: ScheduleRecord) -> bool:
        """Whether the slot's job needs an identity key only the actor's code can give."""
        registered = self._job_defaults.get(schedule.actor, {})
        return bool(registered.get(IDENTITY_FROM_PAYLOAD)) and (
            schedule.options.get("identity_key") is None
        )

    def _as_stored(
        self, schedule: ScheduleRecord, key: str, metadata: dict[str, str]
    ) -> EnqueueArgs:
        """The slot's job with the schedule's payload and options as stored, unchecked."""
        defaults = {
            name: value
            for name, value in self._job_defaults.get(schedule.actor, {}).items()
            if name != IDENTITY_FROM_PAYLOAD
        }
        return EnqueueArgs.model_validate(
            {
                # The actor's own options as its workers registered them: without, the
                # job's attempts, timeout and priority depended on which worker led.
                **defaults,
                **schedule.options,
                "actor": schedule.actor,
                "queue": schedule.queue or self._queues.get(schedule.actor, "default"),
                "payload": schedule.payload,
                "idempotency_key": key,
                "metadata": metadata,
            }
        )
