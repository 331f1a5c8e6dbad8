"""The job a cron slot enqueues (the actor's own queue unless the schedule names one), and
schedules checked at create and update as their slots' jobs will be built."""

from __future__ import annotations

from collections.abc import MutableMapping
from datetime import UTC, datetime
from typing import Any
from uuid import uuid4

import pytest
from pydantic import BaseModel

from taskq import TaskQ, actor
from taskq.backend import Backend
from taskq.errors import EnqueueOptionsError, PayloadValidationError
from taskq.models import JobFilter, ScheduleCreateArgs, ScheduleRecord, ScheduleUpdateArgs
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


@actor(name="cron.capped", queue="capped", max_pending=2)
async def capped(payload: dict[str, Any]) -> None:
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
        # Actors this worker does not have: the queue their workers registered, else
        # "default" (it went to "default" either way, where no worker of it looked).
        ("cron.elsewhere", None, "thumbs"),
        ("cron.elsewhere", "urgent", "urgent"),
        ("cron.gone", None, "default"),
    ],
)
def test_a_slot_job_goes_to_the_actors_queue_unless_the_schedule_names_one(
    actor_name: str, queue: str | None, expected: str
) -> None:
    tq = TaskQ("memory://", actors=[report])
    build = SlotJobBuilder(tq.client, tq.actors, {"cron.elsewhere": "thumbs"})
    args = build(_schedule(actor_name, queue), SLOT)
    assert args is not None and args.queue == expected


def test_a_slot_of_an_actor_this_worker_lacks_keeps_the_schedules_options() -> None:
    # They were dropped: the job ran with no priority, the default attempts and timeout.
    tq = TaskQ("memory://", actors=[report])
    build = SlotJobBuilder(tq.client, tq.actors, {"cron.elsewhere": "thumbs"})
    schedule = _schedule("cron.elsewhere", None).model_copy(
        update={"options": {"priority": 7, "max_attempts": 9, "timeout": 30, "tags": ["n"]}}
    )
    args = build(schedule, SLOT)
    assert args is not None
    assert (args.queue, args.priority, args.max_attempts, args.tags) == ("thumbs", 7, 9, ["n"])
    assert args.timeout is not None and args.timeout.total_seconds() == 30
    bad = schedule.model_copy(update={"options": {"priority": "high"}})
    assert build(bad, SLOT) is None  # skipped and logged, as a bad option of a known actor


def test_a_slot_of_an_actor_this_worker_lacks_takes_the_actors_registered_options() -> None:
    # The job took the enqueue defaults (three attempts, no timeout, priority 0) under a
    # leader without the actor, and the actor's own under one with it.
    tq = TaskQ("memory://", actors=[report])
    registered = {"cron.elsewhere": {"priority": 3, "max_attempts": 5, "timeout": 7.0}}
    build = SlotJobBuilder(tq.client, tq.actors, {"cron.elsewhere": "thumbs"}, registered)
    args = build(_schedule("cron.elsewhere", None), SLOT)
    assert args is not None
    assert (args.queue, args.priority, args.max_attempts) == ("thumbs", 3, 5)
    assert args.timeout is not None and args.timeout.total_seconds() == 7
    # The schedule's own options win over them.
    mine = _schedule("cron.elsewhere", None).model_copy(update={"options": {"max_attempts": 9}})
    args = build(mine, SLOT)
    assert args is not None and (args.priority, args.max_attempts) == (3, 9)


def test_a_worker_registers_what_its_actors_declare_for_their_jobs() -> None:
    @actor(name="cron.declared", priority=2, max_attempts=4, timeout=1.5)
    async def declared(payload: dict[str, Any]) -> None:
        return None

    assert declared.options.job_defaults() == {"priority": 2, "max_attempts": 4, "timeout": 1.5}
    assert report.options.job_defaults() == {"priority": 0, "max_attempts": 3}


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


async def test_a_worker_registers_its_actors_queues() -> None:
    from taskq.backend.memory import InMemoryBackend
    from taskq_testing import run_until_idle

    async with TaskQ("memory://", actors=[report, counted]) as tq:
        await run_until_idle(tq)
        assert isinstance(tq.backend, InMemoryBackend)
        queues = await tq.backend.get_actor_queues()
        defaults = await tq.backend.get_actor_job_defaults()
    assert queues == {"cron.report": "reports", "cron.counted": "default"}
    assert defaults["cron.report"] == report.options.job_defaults()


async def test_a_slot_whose_stored_payload_the_actor_refuses_fails_in_plain_sight() -> None:
    # `taskq schedules create` loads no application, so stores any payload; each slot
    # was skipped with a line in the leader's log, and the schedule never ran.
    import structlog.testing

    from taskq import JobStatus
    from taskq_testing import run_until_idle

    tq = TaskQ("memory://", actors=[counted])
    build = SlotJobBuilder(tq.client, tq.actors, {})
    schedule = _schedule("cron.counted", None).model_copy(update={"payload": {"n": "many"}})
    with structlog.testing.capture_logs() as logs:
        args = build(schedule, SLOT)
    assert args is not None and args.payload == {"n": "many"}
    assert [entry["event"] for entry in logs] == ["taskq.schedule-payload-invalid"]
    async with tq:
        job = await tq.backend.enqueue(args)
        await run_until_idle(tq)
        row = await tq.client.get(job.id)
    assert row is not None and row.status is JobStatus.FAILED and row.error is not None
    assert row.error.error_class == "taskq.errors.PayloadValidationError"
    assert "invalid payload for actor 'cron.counted'" in row.error.message


async def _due_since(backend: Backend, schedule_id: Any, seconds: float) -> None:
    """Put a schedule's next fire time ``seconds`` in the past (a leader gap)."""
    from datetime import timedelta

    from taskq.backend.memory import InMemoryBackend

    if isinstance(backend, InMemoryBackend):
        backend._schedules.advance(
            schedule_id, backend.clock.now() - timedelta(seconds=seconds), None
        )
        return
    async with backend.connection() as conn:  # type: ignore[attr-defined]
        await conn.execute(
            f"UPDATE {backend.schema}.schedules "  # type: ignore[attr-defined]
            f"SET next_fire_at = date_trunc('second', clock_timestamp()) - make_interval(secs => $2) "
            f"WHERE id = $1",
            schedule_id,
            seconds,
        )


def _slot_args(schedule: ScheduleRecord, slot: datetime) -> Any:
    from taskq.models import EnqueueArgs

    return EnqueueArgs(
        actor=schedule.actor,
        idempotency_key=f"taskq:schedule:{schedule.id}:{slot.isoformat()}",
        **schedule.options,
    )


async def test_an_unreadable_schedule_is_parked_and_the_others_fire(
    taskq_backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A time zone this host's tzdata lacks raised at every tick: the guard ended each
    # leader in turn, and the schedule, first in line, kept the others from firing.
    from datetime import timedelta
    from zoneinfo import ZoneInfoNotFoundError

    import structlog.testing

    from taskq.backend import cron

    bad = await taskq_backend.create_schedule(
        ScheduleCreateArgs(name="bad", actor="cron.a", cron="* * * * * *", timezone="Europe/Berlin")
    )
    good = await taskq_backend.create_schedule(
        ScheduleCreateArgs(name="good", actor="cron.b", cron="* * * * * *")
    )
    await _due_since(taskq_backend, bad.id, 3)
    await _due_since(taskq_backend, good.id, 2)
    readable = cron.next_fire_at

    def tzdata_without_berlin(expression: str, timezone: str, after: datetime) -> Any:
        if timezone == "Europe/Berlin":
            raise ZoneInfoNotFoundError("No time zone found with key Europe/Berlin")
        return readable(expression, timezone, after)

    monkeypatch.setattr(cron, "next_fire_at", tzdata_without_berlin)
    with structlog.testing.capture_logs() as logs:
        fired = await taskq_backend.fire_due_schedules(  # type: ignore[attr-defined]
            _slot_args, catch_up=timedelta(minutes=1)
        )
    assert fired >= 2  # the good one's slots
    [parked] = [s for s in await taskq_backend.list_schedules() if s.name == "bad"]
    assert parked.next_fire_at is None
    [error] = [e for e in logs if e["event"] == "taskq.schedule-unreadable"]
    assert error["schedule"] == "bad" and "taskq schedules update" in error["hint"]


async def test_a_singleton_schedule_behind_by_several_slots_enqueues_one_job(
    taskq_backend: Backend,
) -> None:
    # The slots of one tick went in as one all-or-nothing enqueue, collided with each
    # other, and none was enqueued: a singleton schedule fired nothing after a gap.
    from datetime import timedelta

    from taskq.models import JobFilter

    schedule = await taskq_backend.create_schedule(
        ScheduleCreateArgs(
            name="only-one",
            actor="cron.single",
            cron="* * * * * *",
            options={"singleton": True, "identity_key": "only-one"},
        )
    )
    await _due_since(taskq_backend, schedule.id, 3)
    fired = await taskq_backend.fire_due_schedules(  # type: ignore[attr-defined]
        _slot_args, catch_up=timedelta(minutes=1)
    )
    assert fired == 1
    assert len(await taskq_backend.list_jobs(JobFilter(actor="cron.single"))) == 1


async def test_slots_past_the_catch_up_window_are_skipped_with_a_warning(
    taskq_backend: Backend,
) -> None:
    # They vanished without a word: no job, event or log line said they never ran.
    from datetime import timedelta

    import structlog.testing

    schedule = await taskq_backend.create_schedule(
        ScheduleCreateArgs(name="late", actor="cron.late", cron="* * * * * *")
    )
    await _due_since(taskq_backend, schedule.id, 5)
    with structlog.testing.capture_logs() as logs:
        fired = await taskq_backend.fire_due_schedules(  # type: ignore[attr-defined]
            _slot_args, catch_up=timedelta(seconds=2)
        )
    assert 1 <= fired <= 4  # the slots of the last two seconds
    [missed] = [e for e in logs if e["event"] == "taskq.schedule-slots-missed"]
    assert missed["schedule"] == "late" and "TASKQ_CRON_CATCH_UP" in missed["hint"]


async def test_a_leader_skips_the_slots_past_an_actors_max_pending_and_says_so(
    taskq_backend: Backend,
) -> None:
    # With no worker on the actor's queue, a schedule's jobs piled up past its
    # max_pending without bound, and nothing said so.
    import asyncio

    import structlog.testing

    from taskq import WorkerSettings
    from taskq.worker import Worker
    from taskq_testing import TEST_SETTINGS

    tq = TaskQ("memory://", actors=[capped], backend=taskq_backend)
    schedule = await tq.client.create_schedule(
        ScheduleCreateArgs(name="every-second", actor="cron.capped", cron="* * * * * *")
    )
    await _due_since(taskq_backend, schedule.id, 5)  # the first tick has 5 slots or more
    settings = {**TEST_SETTINGS, "queues": "elsewhere", "cron_interval": "50ms"}
    worker = Worker(tq, WorkerSettings.load(settings, env={}))

    def skips() -> list[MutableMapping[str, Any]]:
        return [
            e
            for e in logs
            if e["event"] == "taskq.schedule-slot-skipped" and e.get("reason") == "max_pending"
        ]

    with structlog.testing.capture_logs() as logs:
        runner = asyncio.create_task(worker.run())
        try:
            async with asyncio.timeout(10):
                # The skip is said inside the tick's transaction: its jobs are seen once
                # it commits (a stop before then rolled them back, and none were left).
                while True:
                    fired = len(await tq.client.list_jobs(actor="cron.capped"))
                    if fired > 2 or (fired == 2 and skips()):
                        break  # past the limit, no skip is coming; or both seen
                    await asyncio.sleep(0.05)
        finally:
            worker.stop()
            await asyncio.wait_for(runner, 10)
    assert len(await tq.client.list_jobs(actor="cron.capped")) == 2
    skipped = skips()[0]
    assert skipped["log_level"] == "warning" and skipped["skipped"] >= 3
    assert (skipped["schedule"], skipped["actor"], skipped["max_pending"], skipped["reason"]) == (
        "every-second",
        "cron.capped",
        2,
        "max_pending",
    )


@actor(name="cron.per-tenant", identity_key=lambda payload: payload["tenant"])
async def per_tenant(payload: dict[str, Any]) -> None:
    return None


async def test_a_slot_the_actors_own_code_fails_to_build_is_skipped_and_the_others_fire(
    taskq_backend: Backend,
) -> None:
    # The actor's identity_key raised KeyError for the stored payload: out of the tick,
    # every tick, and the schedule, first in line, kept the others from ever firing.
    from datetime import timedelta

    import structlog.testing

    tq = TaskQ("memory://", actors=[per_tenant, report])
    build = SlotJobBuilder(tq.client, tq.actors, {})
    bad = await taskq_backend.create_schedule(
        ScheduleCreateArgs(name="a-tenantless", actor="cron.per-tenant", cron="* * * * * *")
    )
    good = await taskq_backend.create_schedule(
        ScheduleCreateArgs(name="b-report", actor="cron.report", cron="* * * * * *")
    )
    await _due_since(taskq_backend, bad.id, 3)
    await _due_since(taskq_backend, good.id, 2)
    with structlog.testing.capture_logs() as logs:
        fired = await taskq_backend.fire_due_schedules(  # type: ignore[attr-defined]
            build, catch_up=timedelta(minutes=1)
        )
    assert fired >= 2  # the good one's slots
    jobs = await taskq_backend.list_jobs(JobFilter())
    assert {job.actor for job in jobs} == {"cron.report"}
    [passed] = [s for s in await taskq_backend.list_schedules() if s.name == "a-tenantless"]
    assert passed.last_fired_at is not None  # advanced past its slots, not stuck on them
    skipped = [e for e in logs if e["event"] == "taskq.schedule-slot-skipped"]
    assert skipped and all("KeyError" in e["error"] for e in skipped)


def test_a_leader_without_an_actor_that_derives_its_identity_skips_its_slots_saying_why() -> None:
    # The leader could not run the actor's identity_key on the payload and enqueued the
    # job with none: it ran alongside the same tenant's other jobs, which the identity
    # is there to keep apart.
    import structlog.testing

    tenant = _schedule("cron.per-tenant", None).model_copy(update={"payload": {"tenant": "t1"}})
    assert per_tenant.options.job_defaults()["identity_key_from_payload"] is True
    registered = {"cron.per-tenant": per_tenant.options.job_defaults()}
    with_actor = TaskQ("memory://", actors=[per_tenant])
    args = SlotJobBuilder(with_actor.client, with_actor.actors, {}, registered)(tenant, SLOT)
    assert args is not None and args.identity_key == "t1"

    without = TaskQ("memory://", actors=[report])
    build = SlotJobBuilder(without.client, without.actors, {}, registered)
    with structlog.testing.capture_logs() as logs:
        assert build(tenant, SLOT) is None
    [skipped] = [e for e in logs if e["event"] == "taskq.schedule-slot-skipped"]
    assert skipped["log_level"] == "error" and skipped["reason"] == "identity_key"
    assert "identity_key" in skipped["hint"] and "cron.per-tenant" in skipped["hint"]
    # A schedule that names its identity needs no code: built as stored.
    named = tenant.model_copy(update={"options": {"identity_key": "t1", "singleton": True}})
    args = build(named, SLOT)
    assert args is not None and (args.identity_key, args.singleton) == ("t1", True)
    # An actor without an identity of its own is enqueued as stored, as before.
    plain = SlotJobBuilder(without.client, without.actors, {}, {"cron.x": {"max_attempts": 2}})
    args = plain(_schedule("cron.x", None), SLOT)
    assert args is not None and (args.identity_key, args.max_attempts) == (None, 2)
