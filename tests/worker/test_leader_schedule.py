"""When the leader's daily sweeps run: at their UTC time of day (and every period from
there), not whenever a worker happens to be elected; a slot no leader ran is run once
by the next leader."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, time, timedelta
from typing import Any

import pytest

from taskq import JobStatus, TaskQ, WorkerSettings, actor
from taskq.backend import SupportsMaintenanceRuns, SystemClock
from taskq.settings import SettingsError
from taskq.worker import Worker
from taskq.worker.leader import _due_slot, _next_slot
from taskq_testing import TEST_SETTINGS, run_until_idle

DAY = timedelta(days=1)


def _at(hh: int, mm: int = 0, ss: float = 0.0, day: int = 4) -> datetime:
    return datetime(2026, 12, day, hh, mm, tzinfo=UTC) + timedelta(seconds=ss)


@pytest.mark.parametrize(
    ("now", "at", "period", "after", "expected"),
    [
        (_at(2), time(3), DAY, None, _at(3)),  # later today
        (_at(3), time(3), DAY, None, _at(3)),  # now is the slot
        (_at(3, ss=1), time(3), DAY, None, _at(3, day=5)),  # just missed: tomorrow
        (_at(22), time(3), timedelta(hours=6), None, _at(3, day=5)),  # 03, 09, 15, 21
        (_at(10), time(3), timedelta(hours=6), None, _at(15)),
        (_at(1), time(3), timedelta(hours=6), None, _at(3)),
        # A sleep that woke a little early does not run the same slot twice.
        (_at(2, 59, 59.999), time(3), DAY, _at(3), _at(3, day=5)),
        (_at(12, ss=0.1), time(0), timedelta(milliseconds=250), None, _at(12, ss=0.25)),
    ],
)
def test_the_next_slot(
    now: datetime, at: time, period: timedelta, after: datetime | None, expected: datetime
) -> None:
    assert _next_slot(now, at, period, after) == expected


@pytest.mark.parametrize("period", [timedelta(days=7), timedelta(days=2)])
def test_a_slot_longer_than_a_day_does_not_move_with_each_election(period: timedelta) -> None:
    # Counted from the day of the election, a weekly archive expiry came due a week after
    # each new leader's election: a fleet redeployed (or failing over) daily never ran it.
    elected = [_at(12, day=day) for day in range(1, 15)]
    slots = [_next_slot(now, time(4), period) for now in elected]
    assert all(now < slot <= now + period for now, slot in zip(elected, slots, strict=True))
    assert all((slot - slots[0]) % period == timedelta(0) for slot in slots)


@pytest.mark.parametrize(
    ("now", "done", "expected"),
    [
        (_at(2), _at(3, day=3), _at(3)),  # yesterday's ran: today's, later
        (_at(3, ss=30), _at(3, day=3), _at(3)),  # today's missed (no leader): now
        (_at(3, ss=30), _at(3), _at(3, day=5)),  # today's ran: tomorrow's
        (_at(12), _at(3, day=1), _at(3)),  # three missed: the latest, once
        (_at(12), _at(2, 30, day=3), _at(3)),  # prune_at moved: on the new time
    ],
)
def test_the_slot_due_after_the_last_run(now: datetime, done: datetime, expected: datetime) -> None:
    assert _due_slot(now, time(3), DAY, done) == expected


def test_the_time_of_day_is_utc() -> None:
    settings = WorkerSettings.load({}, env={"TASKQ_PRUNE_AT": "02:30"})
    assert (settings.prune_at, settings.archive_expiry_at) == (time(2, 30), time(4))
    assert WorkerSettings.load({}, env={}).prune_at == time(3)
    with pytest.raises(SettingsError, match="TASKQ_ARCHIVE_EXPIRY_AT.*in UTC"):
        WorkerSettings.load({}, env={"TASKQ_ARCHIVE_EXPIRY_AT": "04:00+02:00"})


@actor(name="schedule.done")
async def done(payload: dict[str, Any]) -> None:
    return None


async def test_the_prune_waits_for_its_time_of_day() -> None:
    tq = TaskQ("memory://", actors=[done])
    async with tq:
        job = await tq.client.enqueue(done, {})
        await run_until_idle(tq)
        # 3 s out: the check below, 0.7 s after the start, must come before the slot
        # (with 1.5 s, a loaded machine's lag could carry it past).
        slot = SystemClock().now() + timedelta(seconds=3)
        settings = {
            **TEST_SETTINGS,
            "prune_at": slot.time().isoformat(),
            "prune_retention_succeeded": "1ms",
        }
        worker = Worker(tq, WorkerSettings.load(settings, env={}))
        runner = asyncio.create_task(worker.run())
        try:
            await asyncio.sleep(0.7)  # elected long since: an interval loop had pruned
            row = await tq.client.get(job.id)
            assert row is not None and row.status is JobStatus.SUCCEEDED
            async with asyncio.timeout(10):
                while await tq.client.get(job.id) is not None:  # noqa: ASYNC110 - polling the store
                    await asyncio.sleep(0.05)
            assert SystemClock().now() >= slot
        finally:
            worker.stop()
            await asyncio.wait_for(runner, 10)


async def _prune_worker(tq: TaskQ, prune_at: time) -> tuple[Worker, asyncio.Task[None]]:
    settings = {
        **TEST_SETTINGS,
        "prune_at": prune_at.isoformat(),
        "prune_retention_succeeded": "1ms",
    }
    worker = Worker(tq, WorkerSettings.load(settings, env={}))
    return worker, asyncio.create_task(worker.run())


async def test_a_slot_no_leader_ran_is_run_once_by_the_next_leader() -> None:
    # The slot passed a moment ago with no leader (none elected at its time): the record
    # says yesterday's ran. The leader elected now runs today's at once, where it waited
    # a day (a week for a weekly interval), and records it: the leader after it does not
    # run it again.
    tq = TaskQ("memory://", actors=[done])
    async with tq:
        runs = tq.backend
        assert isinstance(runs, SupportsMaintenanceRuns)
        now = SystemClock().now()
        slot = now.replace(microsecond=0) - timedelta(seconds=2)
        await runs.record_maintenance_run("leader-prune", slot - DAY)
        job = await tq.client.enqueue(done, {})
        await run_until_idle(tq)
        worker, runner = await _prune_worker(tq, slot.time())
        try:
            async with asyncio.timeout(5):
                while await tq.client.get(job.id) is not None:  # noqa: ASYNC110 - polling the store
                    await asyncio.sleep(0.05)
            assert await runs.last_maintenance_run("leader-prune") == slot
        finally:
            worker.stop()
            await asyncio.wait_for(runner, 10)

        later = await tq.client.enqueue(done, {})
        await run_until_idle(tq)
        worker, runner = await _prune_worker(tq, slot.time())
        try:
            await asyncio.sleep(1)  # elected long since: a second run had pruned
            assert await tq.client.get(later.id) is not None
        finally:
            worker.stop()
            await asyncio.wait_for(runner, 10)


async def test_without_a_record_of_runs_a_new_leader_waits_for_the_next_slot() -> None:
    # Nothing tells whether the slot just passed was run (a new schema): not run at start.
    tq = TaskQ("memory://", actors=[done])
    async with tq:
        job = await tq.client.enqueue(done, {})
        await run_until_idle(tq)
        slot = SystemClock().now() - timedelta(seconds=2)
        worker, runner = await _prune_worker(tq, slot.time())
        try:
            await asyncio.sleep(1)
            assert await tq.client.get(job.id) is not None
        finally:
            worker.stop()
            await asyncio.wait_for(runner, 10)
