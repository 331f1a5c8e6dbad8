"""The job a cron slot enqueues: the actor's own queue unless the schedule names one."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from uuid import uuid4

import pytest

from taskq import TaskQ, actor
from taskq.backend import Backend
from taskq.models import ScheduleCreateArgs, ScheduleRecord
from taskq.worker.cron import SlotJobBuilder

SLOT = datetime(2026, 12, 4, 3, 0, tzinfo=UTC)


@actor(name="cron.report", queue="reports")
async def report(payload: dict[str, Any]) -> None:
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
