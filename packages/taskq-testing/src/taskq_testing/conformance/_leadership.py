"""The maintenance leader's election, cron ticks and record of its slotted loops' runs
(``SupportsLeaderElection``, ``SupportsCron``, ``SupportsMaintenanceRuns``); a backend
without one skips its tests.

What a lease does to a leader that stops renewing is not checked here: a backend in
one process (in-memory) cannot freeze a leader without freezing every elector.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from uuid import uuid4
from zoneinfo import ZoneInfo

import pytest

from taskq.backend import (
    Backend,
    JobStatus,
    SupportsCron,
    SupportsLeaderElection,
    SupportsMaintenanceRuns,
)
from taskq.models import ActorConfig, EnqueueArgs, JobFilter, ScheduleCreateArgs, ScheduleRecord
from taskq_testing.conformance._support import (
    ACTOR,
    AdvanceTime,
    TimeLimits,
    assert_utc,
    covers,
    make_args,
    reach,
    skip_unless_can_wait,
)

_LEASE = timedelta(seconds=5)
_EVERY_SECOND = "* * * * * *"
_PAST_ONE_SLOT = timedelta(seconds=1.1)
"""Long enough that a per-second schedule created now has at least one slot due."""
_WIDE_CATCH_UP = timedelta(hours=1)
_OTHER_ACTOR = "conformance.other"


def _elections(backend: Backend) -> SupportsLeaderElection:
    if not isinstance(backend, SupportsLeaderElection):
        pytest.skip(f"{type(backend).__name__} does not implement SupportsLeaderElection")
    return backend


def _cron(backend: Backend) -> SupportsCron:
    if not isinstance(backend, SupportsCron):
        pytest.skip(f"{type(backend).__name__} does not implement SupportsCron")
    return backend


def _maintenance_runs(backend: Backend) -> SupportsMaintenanceRuns:
    if not isinstance(backend, SupportsMaintenanceRuns):
        pytest.skip(f"{type(backend).__name__} does not implement SupportsMaintenanceRuns")
    return backend


def _slot_job(schedule: ScheduleRecord, slot: datetime) -> EnqueueArgs:
    """A slot's job, as the worker's builder makes it: keyed by schedule and slot."""
    return make_args(
        actor=schedule.actor,
        payload=schedule.payload,
        idempotency_key=f"schedule:{schedule.id}:{slot.isoformat()}",
        metadata={"schedule_slot": slot.isoformat()},
    )


async def _fired_slots(backend: Backend, actor: str = ACTOR) -> list[str]:
    jobs = await backend.list_jobs(JobFilter(actor=actor, limit=1000))
    return sorted(job.metadata["schedule_slot"] for job in jobs if "schedule_slot" in job.metadata)


async def _every_second(backend: Backend, **overrides: object) -> ScheduleRecord:
    fields: dict[str, object] = {
        "name": f"tick-{uuid4().hex[:8]}",
        "actor": ACTOR,
        "cron": _EVERY_SECOND,
        "payload": {"n": 1},
        **overrides,
    }
    return await backend.create_schedule(ScheduleCreateArgs.model_validate(fields))


async def _due(
    backend: Backend, advance_time: AdvanceTime, max_advance: timedelta, **overrides: object
) -> tuple[SupportsCron, ScheduleRecord]:
    """A per-second schedule (as created) with at least one slot due by now."""
    cron = _cron(backend)
    skip_unless_can_wait(_PAST_ONE_SLOT, max_advance, "a due cron slot")
    created = await _every_second(backend, **overrides)
    await advance_time(_PAST_ONE_SLOT)
    return cron, created


class LeadershipTests(TimeLimits):
    """``leader_elector`` (``try_acquire``, ``release``) and ``fire_due_schedules``."""

    @covers("leader_elector")
    async def test_one_elector_leads_until_it_steps_down(self, backend: Backend) -> None:
        elections = _elections(backend)
        first = elections.leader_elector(uuid4(), lease=_LEASE)
        second = elections.leader_elector(uuid4(), lease=_LEASE)
        try:
            assert await first.try_acquire()
            for _ in range(3):  # each tick confirms (renews) the leadership it holds
                assert await first.try_acquire()
                assert not await second.try_acquire()
            await second.release()  # stepping down from nothing changes nothing
            assert await first.try_acquire()
            await first.release()
            await first.release()  # idempotent
            assert await second.try_acquire()
            assert not await first.try_acquire()
        finally:  # an elector holds what it needs to try (a session) until released
            await first.release()
            await second.release()

    @covers("last_maintenance_run", "record_maintenance_run")
    async def test_a_maintenance_run_record_only_moves_forward(self, backend: Backend) -> None:
        runs = _maintenance_runs(backend)
        monday = datetime(2026, 11, 30, 3, tzinfo=UTC)
        tuesday = monday + timedelta(days=1)
        assert await runs.last_maintenance_run("leader-prune") is None
        assert await runs.record_maintenance_run("leader-prune", monday)
        # A second leader recording the same slot (or an earlier one) changes nothing:
        # only one of them ran it as far as the record tells.
        assert not await runs.record_maintenance_run("leader-prune", monday)
        assert await runs.record_maintenance_run("leader-prune", tuesday)
        assert not await runs.record_maintenance_run("leader-prune", monday)
        assert await runs.last_maintenance_run("leader-prune") == tuesday
        assert await runs.last_maintenance_run("leader-archive-expiry") is None  # per loop
        # Two leaders recording one slot at once: exactly one of them does.
        wednesday = tuesday + timedelta(days=1)
        both = [runs.record_maintenance_run("leader-prune", wednesday) for _ in range(2)]
        assert sorted(await asyncio.gather(*both)) == [False, True]
        assert await runs.last_maintenance_run("leader-prune") == wednesday

    @covers("last_maintenance_run", "record_maintenance_run")
    async def test_a_maintenance_run_slot_is_stored_as_every_time_is(
        self, backend: Backend
    ) -> None:
        # Read back in UTC, a naive slot taken as UTC (as asyncpg takes it): the in-memory
        # backend kept the caller's zone, and a naive slot beside an aware one made every
        # later record raise TypeError.
        runs = _maintenance_runs(backend)
        naive = datetime(2026, 11, 30, 3)
        assert await runs.record_maintenance_run("leader-prune", naive)
        assert await runs.last_maintenance_run("leader-prune") == naive.replace(tzinfo=UTC)
        tokyo = naive.replace(tzinfo=UTC).astimezone(ZoneInfo("Asia/Tokyo"))
        assert not await runs.record_maintenance_run("leader-prune", tokyo)  # the same instant
        later = tokyo + timedelta(hours=1)
        assert await runs.record_maintenance_run("leader-prune", later)
        recorded = await runs.last_maintenance_run("leader-prune")
        assert recorded == later
        assert_utc(recorded)

    @covers("register_actors", "get_actor_queues")
    async def test_register_actors_keeps_each_actors_queue(self, backend: Backend) -> None:
        # A leader without an actor puts its cron slots on this queue (not "default").
        cron = _cron(backend)
        await backend.register_actors(
            [ActorConfig(actor="a", queue="images"), ActorConfig(actor="b")]
        )
        assert await cron.get_actor_queues() == {"a": "images"}
        # An older worker registers no queue: the one known is kept; a new one wins.
        await backend.register_actors([ActorConfig(actor="a", max_pending=2)])
        assert await cron.get_actor_queues() == {"a": "images"}
        await backend.register_actors([ActorConfig(actor="a", queue="thumbs")])
        assert await cron.get_actor_queues() == {"a": "thumbs"}

    @covers("register_actors", "get_actor_job_defaults", "get_actor_max_pending")
    async def test_register_actors_stores_job_defaults_as_json_values(
        self, backend: Backend
    ) -> None:
        # Tuples come back as lists and NULs replaced; a value JSON cannot hold refuses
        # the whole call, the other actors' configs included.
        cron = _cron(backend)
        await backend.register_actors(
            [ActorConfig(actor="a", job_defaults={"pair": (1, 2), "text": "x\x00"})]
        )
        assert await cron.get_actor_job_defaults() == {"a": {"pair": [1, 2], "text": "x\ufffd"}}
        with pytest.raises(ValueError, match="is not a JSON number"):
            await backend.register_actors(
                [
                    ActorConfig(actor="b", max_pending=1),
                    ActorConfig(actor="c", job_defaults={"ratio": float("nan")}),
                ]
            )
        assert await backend.get_actor_max_pending() == {"a": None}

    @covers(
        "register_actors", "get_actor_queues", "get_actor_job_defaults", "get_actor_max_pending"
    )
    async def test_register_actors_applies_an_actors_repeated_configs_in_order(
        self, backend: Backend
    ) -> None:
        # One call naming an actor twice is the two registrations one after the other:
        # the later one's limits win, and the queue and job defaults it does not give
        # are the earlier one's.
        cron = _cron(backend)
        defaults = {"priority": 3}
        await backend.register_actors(
            [
                ActorConfig(actor="a", queue="images", job_defaults=defaults, max_pending=3),
                ActorConfig(actor="a", max_pending=5),
            ]
        )
        assert await cron.get_actor_queues() == {"a": "images"}
        assert await cron.get_actor_job_defaults() == {"a": defaults}
        assert await backend.get_actor_max_pending() == {"a": 5}
        await backend.register_actors(
            [ActorConfig(actor="a", queue="thumbs"), ActorConfig(actor="a", max_pending=1)]
        )
        assert await cron.get_actor_queues() == {"a": "thumbs"}
        assert await cron.get_actor_job_defaults() == {"a": defaults}
        assert await backend.get_actor_max_pending() == {"a": 1}

    @covers("register_actors", "get_actor_job_defaults")
    async def test_register_actors_keeps_each_actors_job_defaults(self, backend: Backend) -> None:
        # A leader without an actor gives its cron slots' jobs these (it gave the
        # enqueue defaults: three attempts, no timeout, whichever worker led).
        cron = _cron(backend)
        defaults = {"priority": 3, "max_attempts": 5, "timeout": 7.5}
        await backend.register_actors(
            [ActorConfig(actor="a", job_defaults=defaults), ActorConfig(actor="b")]
        )
        assert await cron.get_actor_job_defaults() == {"a": defaults}
        # An older worker registers none: the ones known are kept; new ones win.
        await backend.register_actors([ActorConfig(actor="a", max_pending=2)])
        assert await cron.get_actor_job_defaults() == {"a": defaults}
        await backend.register_actors([ActorConfig(actor="a", job_defaults={"max_attempts": 1})])
        assert await cron.get_actor_job_defaults() == {"a": {"max_attempts": 1}}

    @covers("fire_due_schedules", "create_schedule", "list_schedules")
    async def test_each_due_slot_fires_once_and_the_schedule_moves_past_it(
        self, backend: Backend, advance_time: AdvanceTime
    ) -> None:
        cron, created = await _due(backend, advance_time, self.max_advance)
        fired = await cron.fire_due_schedules(_slot_job, catch_up=_WIDE_CATCH_UP)
        assert fired >= 1
        # Again at once: only a slot that came due meanwhile may fire, none twice.
        fired += await cron.fire_due_schedules(_slot_job, catch_up=_WIDE_CATCH_UP)
        slots = await _fired_slots(backend)
        assert len(slots) == fired == len(set(slots))
        [after] = await backend.list_schedules()
        assert after.next_fire_at is not None and created.next_fire_at is not None
        assert after.next_fire_at.isoformat() > slots[-1]
        assert slots[0] == created.next_fire_at.isoformat()
        assert after.last_fired_at is not None and after.last_fired_at.isoformat() == slots[-1]
        # Firing changed the row: on the backend's clock, after the slots it fired.
        assert after.updated_at.isoformat() >= slots[-1] > created.updated_at.isoformat()

    @covers("fire_due_schedules")
    async def test_two_concurrent_ticks_fire_each_slot_once(
        self, backend: Backend, advance_time: AdvanceTime
    ) -> None:
        cron, _ = await _due(backend, advance_time, self.max_advance)
        counts = await asyncio.gather(
            cron.fire_due_schedules(_slot_job, catch_up=_WIDE_CATCH_UP),
            cron.fire_due_schedules(_slot_job, catch_up=_WIDE_CATCH_UP),
        )
        slots = await _fired_slots(backend)
        assert sum(counts) == len(slots) == len(set(slots)) >= 1

    @covers("fire_due_schedules", "update_schedule")
    async def test_disabled_schedules_do_not_fire(
        self, backend: Backend, advance_time: AdvanceTime
    ) -> None:
        cron, _ = await _due(backend, advance_time, self.max_advance, enabled=False)
        assert await cron.fire_due_schedules(_slot_job, catch_up=_WIDE_CATCH_UP) == 0
        assert await _fired_slots(backend) == []

    @covers("fire_due_schedules")
    async def test_a_slot_the_builder_skips_enqueues_nothing_but_is_passed(
        self, backend: Backend, advance_time: AdvanceTime
    ) -> None:
        cron, created = await _due(backend, advance_time, self.max_advance)
        assert await cron.fire_due_schedules(lambda _s, _t: None, catch_up=_WIDE_CATCH_UP) == 0
        assert await _fired_slots(backend) == []
        [after] = await backend.list_schedules()
        assert after.next_fire_at is not None and created.next_fire_at is not None
        assert after.next_fire_at > created.next_fire_at

    @covers("fire_due_schedules")
    async def test_a_slot_that_cannot_be_enqueued_is_passed_and_the_others_fire(
        self, backend: Backend, advance_time: AdvanceTime
    ) -> None:
        # A "never overlap" schedule (a singleton identity) whose last job still runs: its
        # enqueue used to raise out of the tick, so no schedule fired and the leader
        # crashed, then its successor.
        cron = _cron(backend)
        skip_unless_can_wait(_PAST_ONE_SLOT, self.max_advance, "a due cron slot")
        await backend.enqueue(make_args(identity_key="report"))  # the last one, still due
        lone = await _every_second(backend, name="a-lone")
        other = await _every_second(backend, name="b-other")
        await advance_time(_PAST_ONE_SLOT)

        def slot_job(schedule: ScheduleRecord, slot: datetime) -> EnqueueArgs:
            job = _slot_job(schedule, slot)
            if schedule.id == lone.id:
                return job.model_copy(update={"identity_key": "report", "singleton": True})
            return job

        fired = await cron.fire_due_schedules(slot_job, catch_up=_WIDE_CATCH_UP)
        jobs = await backend.list_jobs(JobFilter(actor=ACTOR, limit=1000))
        slots = [j for j in jobs if "schedule_slot" in j.metadata]
        assert fired == len(slots) >= 1
        assert all(j.identity_key is None for j in slots)  # the other schedule's
        after = {s.id: s for s in await backend.list_schedules()}
        for created in (lone, other):
            moved, was = after[created.id].next_fire_at, created.next_fire_at
            assert moved is not None and was is not None and moved > was  # passed

    @covers("fire_due_schedules", "create_schedule")
    async def test_a_one_shot_schedule_fires_once_and_is_done(
        self, backend: Backend, advance_time: AdvanceTime
    ) -> None:
        # Past its last time, the next one could not be computed: the tick raised, the
        # one-shot never fired and no other schedule did.
        cron = _cron(backend)
        skip_unless_can_wait(_PAST_ONE_SLOT, self.max_advance, "a one-shot's slot")
        probe = await _every_second(backend)  # the backend's clock, read as a schedule does
        await backend.delete_schedule(probe.id)
        assert probe.next_fire_at is not None
        at = probe.next_fire_at
        once = await _every_second(
            backend, cron=f"{at.minute} {at.hour} {at.day} {at.month} * {at.second} {at.year}"
        )
        assert once.next_fire_at == at
        await advance_time(_PAST_ONE_SLOT)
        assert await cron.fire_due_schedules(_slot_job, catch_up=_WIDE_CATCH_UP) == 1
        assert await _fired_slots(backend) == [at.isoformat()]
        [after] = await backend.list_schedules()
        assert (after.next_fire_at, after.last_fired_at) == (None, at)
        assert await cron.fire_due_schedules(_slot_job, catch_up=_WIDE_CATCH_UP) == 0

    @covers("fire_due_schedules")
    async def test_slots_older_than_the_catch_up_window_are_skipped(
        self, backend: Backend, advance_time: AdvanceTime
    ) -> None:
        cron, created = await _due(backend, advance_time, self.max_advance)
        # No window: every slot due so far is older than "now"; the schedule resumes after it.
        assert await cron.fire_due_schedules(_slot_job, catch_up=timedelta(0)) == 0
        assert await _fired_slots(backend) == []
        [after] = await backend.list_schedules()
        assert after.next_fire_at is not None and created.next_fire_at is not None
        assert after.next_fire_at > created.next_fire_at

    @covers("fire_due_schedules", "register_actors")
    async def test_a_slot_past_its_actors_max_pending_is_skipped_and_never_fired_late(
        self, backend: Backend, advance_time: AdvanceTime
    ) -> None:
        # With no worker consuming them, a schedule's jobs piled up past the actor's
        # max_pending without bound.
        cron = _cron(backend)
        skip_unless_can_wait(_PAST_ONE_SLOT, self.max_advance, "a due cron slot")
        await backend.register_actors(
            [ActorConfig(actor=ACTOR, max_pending=2), ActorConfig(actor=_OTHER_ACTOR)]
        )
        # Full as the client counts it: pending and scheduled jobs (not running ones).
        await reach(backend, JobStatus.RUNNING)
        await reach(backend, JobStatus.PENDING)
        scheduled = await reach(backend, JobStatus.SCHEDULED)
        full = await _every_second(backend, name="a-full")
        await _every_second(backend, name="b-unbounded", actor=_OTHER_ACTOR)
        await advance_time(_PAST_ONE_SLOT)
        fired = await cron.fire_due_schedules(_slot_job, catch_up=_WIDE_CATCH_UP)
        assert await _fired_slots(backend) == []
        assert fired == len(await _fired_slots(backend, _OTHER_ACTOR)) >= 1
        [passed] = [s.next_fire_at for s in await backend.list_schedules() if s.id == full.id]
        assert passed is not None and full.next_fire_at is not None
        assert passed > full.next_fire_at
        # Room again: the slots skipped are not fired late, only those due from now on.
        assert await backend.write_cancel_request(scheduled.id, "conformance")
        await cron.fire_due_schedules(_slot_job, catch_up=_WIDE_CATCH_UP)
        assert all(slot >= passed.isoformat() for slot in await _fired_slots(backend))

    @covers("fire_due_schedules", "register_actors")
    async def test_due_slots_fire_in_order_until_their_actors_max_pending_is_reached(
        self, backend: Backend, advance_time: AdvanceTime
    ) -> None:
        cron = _cron(backend)
        skip_unless_can_wait(_PAST_ONE_SLOT, self.max_advance, "due cron slots")
        await backend.register_actors([ActorConfig(actor=ACTOR, max_pending=2)])
        await reach(backend, JobStatus.PENDING)  # room for one more
        await reach(backend, JobStatus.RUNNING)  # neither counts
        await reach(backend, JobStatus.SUCCEEDED)
        first = await _every_second(backend, name="a-first")
        second = await _every_second(backend, name="b-second")
        for _ in range(2):  # two slots of each due, at least
            await advance_time(_PAST_ONE_SLOT)
        # One slot fits, the earliest; its schedule's later slots and the other
        # schedule's (of the same actor, in the same tick) do not.
        assert await cron.fire_due_schedules(_slot_job, catch_up=_WIDE_CATCH_UP) == 1
        assert first.next_fire_at is not None and second.next_fire_at is not None
        assert first.next_fire_at <= second.next_fire_at
        assert await _fired_slots(backend) == [first.next_fire_at.isoformat()]
        after = {s.id: s.next_fire_at for s in await backend.list_schedules()}
        for created in (first, second):  # passed every slot due, the skipped ones too
            moved, was = after[created.id], created.next_fire_at
            assert moved is not None and was is not None
            assert moved >= was + timedelta(seconds=2)
