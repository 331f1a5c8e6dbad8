"""The job a cron slot enqueues (the actor's own queue unless the schedule names one), and
schedules checked at create and update as their slots' jobs will be built."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from uuid import uuid4

import pytest
from pydantic import BaseModel

from taskq import TaskQ, actor
from taskq.backend import Backend
from taskq.errors import EnqueueOptionsError, PayloadValidationError
from taskq.models import ScheduleCreateArgs, ScheduleRecord, ScheduleUpdateArgs
from taskq.worker.cron import SlotJobBuilder

SLOT = datetime(2026, 12, 4, 3, 0, tzinfo=UTC)


@actor(name="cron.report", queue="reports")
async def report(payload: dict[str, Any]) -> None:
    return None


class Count(BaseModel):
    n: int


@actor(name="cron.counted")
async def counted(payload: Count) -> None:
    return None


def _schedule(actor_name: str, queue: str | None) -> ScheduleRecord:
    return ScheduleRecord(
        id=uuid4(),
        name="nightly",
        actor=actor_name,
        cron="0 3 * * *",
        payload={},
        queue=queue,
        timezone="UTC",
        enabled=True,
        next_fire_at=SLOT,
        created_at=SLOT,
        updated_at=SLOT,
    )


@pytest.mark.parametrize(
    ("actor_name", "queue", "expected"),
    [
        ("cron.report", None, "reports"),  # the actor's, as a worker of "reports" runs it
        ("cron.report", "urgent", "urgent"),
        ("cron.gone", None, "default"),  # an actor this worker does not know
    ],
)
def test_a_slot_job_goes_to_the_actors_queue_unless_the_schedule_names_one(
    actor_name: str, queue: str | None, expected: str
) -> None:
    tq = TaskQ("memory://", actors=[report])
    build = SlotJobBuilder(tq.client, tq.actors)
    args = build(_schedule(actor_name, queue), SLOT)
    assert args is not None and args.queue == expected


async def test_a_schedule_without_a_queue_is_stored_so(taskq_backend: Backend) -> None:
    tq = TaskQ("memory://", actors=[report], backend=taskq_backend)
    record = await tq.client.create_schedule(
        ScheduleCreateArgs(name="nightly", actor="cron.report", cron="0 3 * * *")
    )
    assert record.queue is None
    [listed] = await tq.client.list_schedules()
    assert listed.queue is None


@pytest.mark.parametrize(
    ("payload", "options", "error", "match"),
    [
        ({"n": 1}, {"bogus": 1}, EnqueueOptionsError, "unknown enqueue option.*bogus"),
        ({"n": 1}, {"priority": "high"}, EnqueueOptionsError, "priority"),
        ({}, {"metadata": {"k": 1}}, ValueError, "cannot set metadata"),
    ],
)
async def test_a_schedule_is_checked_as_its_slots_jobs_will_be(
    taskq_backend: Backend,
    payload: dict[str, Any],
    options: dict[str, Any],
    error: type,
    match: str,
) -> None:
    tq = TaskQ("memory://", actors=[report, counted], backend=taskq_backend)
    with pytest.raises(error, match=match):
        await tq.client.create_schedule(
            ScheduleCreateArgs(
                name="bad", actor="cron.counted", cron="* * * * *", payload=payload, options=options
            )
        )
    assert await tq.client.list_schedules() == []


async def test_an_update_is_checked_against_the_stored_schedule(taskq_backend: Backend) -> None:
    tq = TaskQ("memory://", actors=[report, counted], backend=taskq_backend)
    stored = await tq.client.create_schedule(
        ScheduleCreateArgs(name="ok", actor="cron.counted", cron="* * * * *", payload={"n": 1})
    )
    with pytest.raises(PayloadValidationError):
        await tq.client.update_schedule(stored.id, ScheduleUpdateArgs(payload={"n": "many"}))
    [kept] = await tq.client.list_schedules()
    assert kept.payload == {"n": 1}
