"""Cancellation in one worker process on the in-memory backend: what a cancel request
does to a job that snoozes, whose outcome is being written, or that has not started."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import pytest

from taskq import Backend, Context, JobRow, JobStatus, RetryAfter, Snooze, TaskQ, actor
from taskq.models import AttemptOutcome
from taskq_testing import run_until_idle
from tests.worker.controller_state import (
    dispatched,
    forced_past_cleanup,
    past_its_limit,
    worker_state,
)
from tests.worker.flaky_backend import FailuresFailWhileAway, WritesFailWhileAway
from tests.worker.running import phase_logged

_GRACES: dict[str, Any] = {"cancellation_grace_period": "100ms", "cleanup_grace_period": "100ms"}


@pytest.mark.parametrize("signal", [Snooze, RetryAfter])
async def test_a_snooze_raised_after_a_cancel_ends_the_job_cancelled(
    signal: type[Snooze | RetryAfter],
) -> None:
    # Rescheduled, the job came back with its cancel flag set, snoozed again, and never
    # ended (a RetryAfter one ended failed).
    started = asyncio.Event()

    @actor(name="snoozes_when_told")
    async def snoozes(payload: dict[str, Any], ctx: Context) -> None:
        started.set()
        await ctx.cancel_event.wait()
        raise signal(0.01)

    tq = TaskQ("memory://", actors=[snoozes])
    async with tq:
        job = await tq.client.enqueue(snoozes, {})
        runner = asyncio.create_task(run_until_idle(tq, **_GRACES))
        await asyncio.wait_for(started.wait(), 5)
        assert await tq.client.cancel(job.id)
        await asyncio.wait_for(runner, 10)
        row = await tq.client.get(job.id)
        attempts = await tq.client.get_attempts(job.id)
    assert row is not None and row.status is JobStatus.CANCELLED
    assert [a.outcome for a in attempts] == ["cancelled"]


async def test_a_cancel_does_not_escalate_over_a_finished_jobs_outcome_write() -> None:
    # The escalation cancelled the task writing the success: the job was handed back
    # and its actor ran a second time.
    runs = 0

    @actor(name="finishes_at_once")
    async def finishes(payload: dict[str, Any]) -> str:
        nonlocal runs
        runs += 1
        backend.away = True
        return "done"

    backend = WritesFailWhileAway()
    tq = TaskQ("memory://", actors=[finishes], backend=backend)
    async with tq:
        job = await tq.client.enqueue(finishes, {})
        runner = asyncio.create_task(run_until_idle(tq, **_GRACES))
        await asyncio.wait_for(backend.failed.wait(), 5)
        assert await tq.client.cancel(job.id)  # still running: the success is not in
        await asyncio.sleep(0.6)  # heartbeats see it; past both graces
        backend.away = False
        await asyncio.wait_for(runner, 10)
        row = await tq.client.get(job.id)
    assert runs == 1
    assert row is not None and row.status is JobStatus.SUCCEEDED


async def test_a_job_cancelled_before_it_starts_never_runs() -> None:
    # Locked by this worker (prefetched) and cancelled while it waited for a slot: it
    # used to start with its cancel already overdue, and be forced at the next tick.
    release = asyncio.Event()
    ran: list[str] = []

    @actor(name="holds_the_slot")
    async def holds(payload: dict[str, Any]) -> None:
        ran.append(payload["name"])
        await release.wait()

    tq = TaskQ("memory://", actors=[holds])
    async with tq:
        first = await tq.client.enqueue(holds, {"name": "first"})
        second = await tq.client.enqueue(holds, {"name": "second"})
        runner = asyncio.create_task(run_until_idle(tq, concurrency=1, prefetch=1, **_GRACES))
        for _ in range(500):  # until the second is locked here, waiting for the slot
            row = await tq.client.get(second.id)
            if row is not None and row.status is JobStatus.RUNNING:
                break
            await asyncio.sleep(0.01)
        assert await tq.client.cancel(second.id)
        await asyncio.sleep(0.3)  # the heartbeat sees the request
        release.set()
        await asyncio.wait_for(runner, 10)
        rows = [await tq.client.get(j.id) for j in (first, second)]
        attempts = await tq.client.get_attempts(second.id)
    assert ran == ["first"]
    assert [r.status for r in rows if r] == [JobStatus.SUCCEEDED, JobStatus.CANCELLED]
    assert [a.outcome for a in attempts] == ["cancelled"]


async def test_a_sync_actor_told_to_stop_ends_once_its_thread_has_returned() -> None:
    # Its thread cannot be stopped. Written off at once, the job read "cancelled" while
    # its code ran on, and the next sync job took the slot and waited for the thread
    # its own timeout running.
    import threading
    import time

    started, thread_done = threading.Event(), threading.Event()

    @actor(name="sync_slow")
    def slow(payload: dict[str, Any]) -> None:
        started.set()
        time.sleep(0.8)
        thread_done.set()

    @actor(name="sync_quick", timeout=1.0, max_attempts=1)
    def quick(payload: dict[str, Any]) -> None:
        time.sleep(0.1)

    tq = TaskQ("memory://", actors=[slow, quick])
    async with tq:
        first = await tq.client.enqueue(slow, {})
        second = await tq.client.enqueue(quick, {})
        graces: dict[str, Any] = {
            "cancellation_grace_period": "100ms",
            "cleanup_grace_period": "5s",
        }
        runner = asyncio.create_task(run_until_idle(tq, concurrency=1, **graces))
        await asyncio.get_running_loop().run_in_executor(None, started.wait, 5)
        assert await tq.client.cancel(first.id)
        seen_while_running = set()
        for _ in range(300):
            row = await tq.client.get(first.id)
            assert row is not None
            if thread_done.is_set():
                break
            seen_while_running.add(row.status)
            await asyncio.sleep(0.01)
        await asyncio.wait_for(runner, 10)
        rows = [await tq.client.get(j.id) for j in (first, second)]
    assert seen_while_running == {JobStatus.RUNNING}
    assert [r.status for r in rows if r] == [JobStatus.CANCELLED, JobStatus.SUCCEEDED]


def _outlives_cancellation(
    name: str, seconds: float, started: asyncio.Event, returned: asyncio.Event | None = None
) -> Any:
    """An actor that ignores every cancellation for ``seconds``, then returns "late"
    (``returned`` set as it does)."""

    @actor(name=name)
    async def stubborn(payload: dict[str, Any]) -> str:
        started.set()
        loop = asyncio.get_running_loop()
        end = loop.time() + seconds
        while loop.time() < end:
            try:
                await asyncio.sleep(0.02)
            except asyncio.CancelledError:
                continue
        if returned is not None:
            returned.set()
        return "late"

    return stubborn


async def _cancelled_as_it_outlives_its_grace(
    name: str, queue: str
) -> tuple[JobRow, list[MutableMapping[str, Any]]]:
    """A job of an actor ``name`` (on ``queue``) that outlives its cancellation's graces,
    cancelled by a user while it runs, with an until-idle worker run to its end: the
    job's row as it ended, and the worker's log lines."""
    import structlog.testing

    from taskq import WorkerSettings
    from taskq.worker import Worker
    from taskq_testing import TEST_SETTINGS

    started = asyncio.Event()
    stubborn = _outlives_cancellation(name, 0.8, started)
    tq = TaskQ("memory://", actors=[stubborn])
    async with tq:
        job = await tq.client.enqueue(stubborn, {}, queue=queue)
        settings = {**TEST_SETTINGS, **_GRACES, "queues": [queue], "until_idle": True}
        worker = Worker(tq, WorkerSettings.load(settings, env={}))
        with structlog.testing.capture_logs() as logs:
            running = asyncio.create_task(worker.run())
            await asyncio.wait_for(started.wait(), 5)
            assert await tq.client.cancel(job.id)
            await asyncio.wait_for(running, 10)
            await asyncio.gather(*worker.lingering_tasks())
        row = await tq.client.get(job.id)
    assert row is not None
    return row, logs


async def test_an_abandoned_actor_that_returns_at_last_writes_and_blames_nothing() -> None:
    # It used to try a success write, find the job no longer its own and warn that the
    # lock "expired and was reclaimed", which is not what happened.
    row, logs = await _cancelled_as_it_outlives_its_grace("outlives_its_abandonment", "default")
    assert row.status is JobStatus.ABANDONED and row.result is None
    events = [entry["event"] for entry in logs]
    assert "taskq.job-abandoned" in events
    assert "taskq.ownership-lost" not in events
    assert "taskq.abandoned-job-returned" in events


async def test_the_cancel_controllers_lines_about_a_job_name_its_actor_and_queue() -> None:
    # Logged outside the job's context, they carried its job_id alone: a search by actor
    # or queue missed the job's cancel, its forced stop and its abandonment.
    job, logs = await _cancelled_as_it_outlives_its_grace("abandoned_and_said_so", "q2")
    lines = {
        entry["event"]: entry
        for entry in logs
        if entry["event"] in {"taskq.cancel-observed", "taskq.cancel-forced", "taskq.job-abandoned"}
    }
    assert len(lines) == 3
    for line in lines.values():
        assert line["job_id"] == str(job.id)
        assert (line["actor"], line["queue"], line["attempt"]) == ("abandoned_and_said_so", "q2", 1)


@pytest.mark.parametrize("limit", ["timeout", "deadline"])
async def test_an_actor_that_ignores_its_limit_fails_by_it_and_frees_its_slot(limit: str) -> None:
    # It kept its slot and its lease (renewed every heartbeat) for as long as it ran,
    # past its timeout or deadline: for ever, for one that never returns. Then it was
    # cancelled as by a user: `cancelled` or `abandoned`, the limit's error nowhere.
    import structlog.testing

    from taskq import WorkerSettings
    from taskq.worker import Worker
    from taskq_testing import TEST_SETTINGS

    started = asyncio.Event()
    stubborn = _outlives_cancellation(f"ignores_its_{limit}", 3.0, started)

    @actor(name=f"after_the_{limit}_overrun")
    async def quick(payload: dict[str, Any]) -> str:
        return "ran"

    tq = TaskQ("memory://", actors=[stubborn, quick])
    async with tq:
        options: dict[str, Any] = (
            {"timeout": 0.1} if limit == "timeout" else {"schedule_to_close": 0.1}
        )
        job = await tq.client.enqueue(stubborn, {}, **options)
        settings = {
            **TEST_SETTINGS,
            **_GRACES,
            "queues": ["default"],
            "until_idle": True,
            "concurrency": 1,
        }
        worker = Worker(tq, WorkerSettings.load(settings, env={}))
        with structlog.testing.capture_logs() as logs:
            running = asyncio.create_task(worker.run())
            await asyncio.wait_for(started.wait(), 5)
            later = await tq.client.enqueue(quick, {})
            # Its one slot freed, well before the actor's 3 s.
            assert await tq.client.wait_for_result(later.id, timeout=2) == "ran"
            row = await tq.client.get(job.id)
            [attempt] = await tq.client.get_attempts(job.id)
            await asyncio.wait_for(running, 10)
            await asyncio.gather(*worker.lingering_tasks())
    assert row is not None and row.status is JobStatus.FAILED
    assert row.error is not None and attempt.error is not None
    kind = "TimeoutError" if limit == "timeout" else "DeadlineExceeded"
    assert row.error.error_class == kind == attempt.error.error_class
    assert "still running" in row.error.message and "not retried" in row.error.message
    assert row.cancel_requested_at is None and row.cancel_reason is None  # no user's cancel
    events = [entry["event"] for entry in logs]
    assert "taskq.job-past-its-limit" in events and "taskq.job-failed-past-its-limit" in events
    assert "taskq.ownership-lost" not in events  # its late end wrote nothing


async def test_the_failure_past_a_limit_is_fenced_by_the_attempt() -> None:
    # Written for a job reclaimed and running elsewhere meanwhile, an unfenced write
    # would end that other attempt.
    from taskq import WorkerSettings
    from taskq.backend.memory import InMemoryBackend
    from taskq.worker import Worker
    from taskq_testing import TEST_SETTINGS

    class Recording(InMemoryBackend):
        def __init__(self) -> None:
            super().__init__()
            self.fences: list[object] = []

        async def mark_failed_or_retry(self, *args: Any, **kwargs: Any) -> JobRow:
            self.fences.append(kwargs.get("attempt"))
            return await super().mark_failed_or_retry(*args, **kwargs)

    started = asyncio.Event()
    stubborn = _outlives_cancellation("overruns_its_timeout", 1.0, started)
    backend = Recording()
    tq = TaskQ("memory://", actors=[stubborn], backend=backend)
    async with tq:
        job = await tq.client.enqueue(stubborn, {}, timeout=0.1)
        settings = {**TEST_SETTINGS, **_GRACES, "queues": ["default"], "until_idle": True}
        worker = Worker(tq, WorkerSettings.load(settings, env={}))
        await asyncio.wait_for(worker.run(), 10)
        await asyncio.gather(*worker.lingering_tasks())
        row = await tq.client.get(job.id)
    assert row is not None and row.status is JobStatus.FAILED
    assert backend.fences == [1]


async def test_a_sync_actor_past_its_timeout_fails_by_it_and_frees_its_slot() -> None:
    # Its thread cannot be stopped; the job waited for it, holding its slot, for as
    # long as the thread ran past the timeout.
    import threading

    from taskq import WorkerSettings
    from taskq.worker import Worker
    from taskq_testing import TEST_SETTINGS

    release = threading.Event()

    @actor(name="sync_past_its_timeout", timeout=0.1)
    def hung(payload: dict[str, Any]) -> str:
        release.wait(10)
        return "late"

    @actor(name="after_the_sync_overrun")
    async def quick(payload: dict[str, Any]) -> str:
        return "ran"

    tq = TaskQ("memory://", actors=[hung, quick])
    async with tq:
        job = await tq.client.enqueue(hung, {})
        settings = {**TEST_SETTINGS, **_GRACES, "queues": ["default"], "concurrency": 1}
        worker = Worker(tq, WorkerSettings.load(settings, env={}))
        running = asyncio.create_task(worker.run())
        try:
            later = await tq.client.enqueue(quick, {})
            assert await tq.client.wait_for_result(later.id, timeout=3) == "ran"
            row = await tq.client.get(job.id)
        finally:
            release.set()
            worker.stop()
            await asyncio.wait_for(running, 10)
        after = await tq.client.get(job.id)
    assert row is not None and row.status is JobStatus.FAILED
    assert row.error is not None and row.error.error_class == "TimeoutError"
    assert after == row  # its thread's late "late" wrote nothing


async def test_a_job_a_stop_left_behind_writes_nothing_when_its_actor_returns() -> None:
    import structlog.testing

    from taskq import WorkerSettings
    from taskq.worker import Worker
    from taskq_testing import TEST_SETTINGS

    started = asyncio.Event()

    stubborn = _outlives_cancellation("outlives_the_stop", 1.5, started)

    tq = TaskQ("memory://", actors=[stubborn])
    async with tq:
        job = await tq.client.enqueue(stubborn, {})
        stop = {"drain_grace_period": "100ms", "termination_grace_period": "5s"}
        settings = {**TEST_SETTINGS, **_GRACES, **stop, "queues": ["default"]}
        worker = Worker(tq, WorkerSettings.load(settings, env={}))
        with structlog.testing.capture_logs() as logs:
            running = asyncio.create_task(worker.run())
            await asyncio.wait_for(started.wait(), 5)
            worker.stop()
            await asyncio.wait_for(running, 10)
            await asyncio.gather(*worker.lingering_tasks())
        row = await tq.client.get(job.id)
        attempts = await tq.client.get_attempts(job.id)
    assert row is not None and row.status is JobStatus.PENDING  # handed back
    assert [a.outcome for a in attempts] == ["interrupted"]
    events = [entry["event"] for entry in logs]
    assert "taskq.task-ignored-cancellation" in events
    assert "taskq.ownership-lost" not in events


async def _written_off_into_a_stop(
    name: str, seconds: float, before_stop: Callable[[Any], Awaitable[None]]
) -> tuple[JobRow | None, list[str], list[MutableMapping[str, Any]]]:
    """A job of an actor ignoring its cancellation for ``seconds``, past its 0.1 s timeout:
    written off, its failure's write failing (the database away); the worker stopped once
    ``before_stop(worker)`` returns, the database back as the stop reaches ABANDONING.
    The job's row, its attempts' outcomes, and the worker's logs."""
    import structlog.testing

    from taskq import WorkerSettings
    from taskq.worker import Worker
    from taskq_testing import TEST_SETTINGS

    started = asyncio.Event()
    stubborn = _outlives_cancellation(name, seconds, started)
    backend = FailuresFailWhileAway()
    tq = TaskQ("memory://", actors=[stubborn], backend=backend)
    async with tq:
        job = await tq.client.enqueue(stubborn, {}, timeout=0.1)
        stop = {"drain_grace_period": "100ms", "termination_grace_period": "5s"}
        settings = {**TEST_SETTINGS, **_GRACES, **stop, "queues": ["default"]}
        worker = Worker(tq, WorkerSettings.load(settings, env={}))
        with structlog.testing.capture_logs() as logs:
            running = asyncio.create_task(worker.run())
            await asyncio.wait_for(backend.tried.wait(), 5)  # written off; the write fails
            await before_stop(worker)
            worker.stop()
            await phase_logged(logs, "ABANDONING")
            backend.away = False  # back as the stop lets go of what still runs
            await asyncio.wait_for(running, 10)
            await asyncio.gather(*worker.lingering_tasks())
        row = await tq.client.get(job.id)
        attempts = await tq.client.get_attempts(job.id)
    return row, [a.outcome for a in attempts], logs


async def test_a_stop_leaves_a_job_written_off_past_its_limit_to_its_failure_write() -> None:
    # The failure's write kept failing (the database away) into a stop, which handed the
    # job back as interrupted: it ran again, though its code may still be running.
    async def at_once(worker: Any) -> None:
        return None

    row, outcomes, logs = await _written_off_into_a_stop("written_off_into_a_stop", 2.0, at_once)
    assert row is not None and row.status is JobStatus.FAILED
    assert row.error is not None and row.error.error_class == "TimeoutError"
    assert outcomes == ["failed"]
    assert "taskq.job-failed-past-its-limit" in [entry["event"] for entry in logs]


async def test_a_stop_waits_for_the_write_off_of_a_job_whose_task_has_ended() -> None:
    # Its task gave in at last and freed its slot, its failure's write still failing (the
    # database away): the stop waited for slots only, let go at once, and the write
    # was never made (the job left running to its lease) though the database came back.
    async def slot_freed(worker: Any) -> None:
        async def freed() -> None:
            while worker.processed < 1:  # noqa: ASYNC110 - the worker's own count
                await asyncio.sleep(0.01)

        await asyncio.wait_for(freed(), 5)  # the task has ended

    row, _, _ = await _written_off_into_a_stop("written_off_task_ended", 0.3, slot_freed)
    assert row is not None and row.status is JobStatus.FAILED
    assert row.error is not None and row.error.error_class == "TimeoutError"


async def test_a_stop_abandons_a_cancelled_job_whose_escalation_write_failed() -> None:
    # FORCING could not store phase 2 (a blip), and mark_abandoned acts only on phase 2:
    # the stop left the job running, locked by a worker that had gone.
    import structlog.testing

    from taskq import WorkerSettings
    from taskq.backend.memory import InMemoryBackend
    from taskq.worker import Worker
    from taskq_testing import TEST_SETTINGS

    class EscalationBlip(InMemoryBackend):
        blips = 0

        async def write_cancel_escalation(self, *args: Any, **kwargs: Any) -> bool:
            if self.blips:
                self.blips -= 1
                raise ConnectionRefusedError("database away")
            return await super().write_cancel_escalation(*args, **kwargs)

    started = asyncio.Event()
    stubborn = _outlives_cancellation("outlives_a_failed_escalation", 1.5, started)
    backend = EscalationBlip()
    tq = TaskQ("memory://", backend=backend, actors=[stubborn])
    async with tq:
        job = await tq.client.enqueue(stubborn, {})
        # The heartbeat sees the cancel (phase 1) but leaves the forcing to the stop.
        graces = {"cancellation_grace_period": "60s", "cleanup_grace_period": "100ms"}
        stop = {"drain_grace_period": "100ms", "termination_grace_period": "10s"}
        settings = {**TEST_SETTINGS, **graces, **stop, "queues": ["default"]}
        worker = Worker(tq, WorkerSettings.load(settings, env={}))
        running = asyncio.create_task(worker.run())
        await asyncio.wait_for(started.wait(), 5)
        with structlog.testing.capture_logs() as logs:
            assert await tq.client.cancel(job.id)
            for _ in range(500):
                if any(e["event"] == "taskq.cancel-observed" for e in logs):
                    break
                await asyncio.sleep(0.01)
        backend.blips = 1
        worker.stop()
        worker.escalate()
        await asyncio.wait_for(running, 10)
        await asyncio.gather(*worker.lingering_tasks())
        row = await tq.client.get(job.id)
    assert backend.blips == 0  # the blip was met
    assert row is not None and row.status is JobStatus.ABANDONED


async def test_a_sync_job_after_an_abandoned_sync_call_runs_on_a_thread_of_its_own() -> None:
    # Abandoning frees the slot but not the thread. With the pool capped at the slots,
    # the next sync job sat "running", leased but queued behind the abandoned call,
    # for as long as that call ran.
    import threading

    from taskq import WorkerSettings
    from taskq.worker import Worker
    from taskq_testing import TEST_SETTINGS

    started, release = threading.Event(), threading.Event()

    @actor(name="sync_stuck")
    def stuck(payload: dict[str, Any]) -> None:
        started.set()
        release.wait(30)

    @actor(name="sync_next")
    def after(payload: dict[str, Any]) -> str:
        return threading.current_thread().name

    tq = TaskQ("memory://", actors=[stuck, after])
    async with tq:
        first = await tq.client.enqueue(stuck, {})
        settings = {**TEST_SETTINGS, **_GRACES, "queues": ["default"], "concurrency": 1}
        worker = Worker(tq, WorkerSettings.load(settings, env={}))
        running = asyncio.create_task(worker.run())
        try:
            await asyncio.get_running_loop().run_in_executor(None, started.wait, 5)
            assert await tq.client.cancel(first.id)
            row = await _status_within(tq, first.id, JobStatus.ABANDONED, 10)
            second = await tq.client.enqueue(after, {})
            done = await _status_within(tq, second.id, JobStatus.SUCCEEDED, 10)
            assert not release.is_set()  # the abandoned call still holds its thread
        finally:
            release.set()
            worker.stop()
            await asyncio.wait_for(running, 10)
    assert row.status is JobStatus.ABANDONED
    assert done.result is not None and done.result.startswith("taskq-sync-actor")


async def _status_within(tq: TaskQ, job_id: Any, status: JobStatus, seconds: float) -> Any:
    """The job's row once it reaches ``status``; fails after ``seconds``."""
    for _ in range(int(seconds / 0.01)):
        row = await tq.client.get(job_id)
        if row is not None and row.status is status:
            return row
        await asyncio.sleep(0.01)
    raise AssertionError(f"job {job_id} is {row.status if row else None}, not {status}")


def _finishes(name: str, started: asyncio.Event, *, watching: bool) -> Any:
    """An actor that returns "stopped" once it sees a stop request (``watching``), or
    "done" once a stop was requested, without ever looking at ``ctx.cancel_event``."""

    @actor(name=name)
    async def finishes(payload: dict[str, Any], ctx: Context) -> str:
        started.set()
        if watching:
            await ctx.cancel_event.wait()
            return "stopped"
        async with asyncio.timeout(5):
            while not ctx.cancel_event.requested():  # noqa: ASYNC110 - polled without looking
                await asyncio.sleep(0.01)
        return "done"

    return finishes


async def _stopped_outcome(
    job_actor: Any, started: asyncio.Event, stop: str, graces: dict[str, Any]
) -> tuple[JobRow, list[AttemptOutcome]]:
    """Run one job of ``job_actor`` and, once it started, stop it by a ``shutdown`` of
    its worker or a user's ``cancel``; the job as it ended, and its attempts' outcomes."""
    from taskq import WorkerSettings
    from taskq.worker import Worker
    from taskq_testing import TEST_SETTINGS

    tq = TaskQ("memory://", actors=[job_actor])
    async with tq:
        job = await tq.client.enqueue(job_actor, {})
        if stop == "shutdown":
            settings = {**TEST_SETTINGS, **graces, "drain_grace_period": "100ms"}
            worker = Worker(tq, WorkerSettings.load({**settings, "queues": ["default"]}, env={}))
            running = asyncio.create_task(worker.run())
            await asyncio.wait_for(started.wait(), 5)
            worker.stop()
            await asyncio.wait_for(running, 10)
        else:
            runner = asyncio.create_task(run_until_idle(tq, **graces))
            await asyncio.wait_for(started.wait(), 5)
            assert await tq.client.cancel(job.id)
            await asyncio.wait_for(runner, 15)
        row = await tq.client.get(job.id)
        outcomes = [a.outcome for a in await tq.client.get_attempts(job.id)]
    assert row is not None
    return row, outcomes


@pytest.mark.parametrize("watching", [False, True])
@pytest.mark.parametrize("stop", ["shutdown", "cancel"])
async def test_a_stop_ends_early_only_an_actor_that_saw_the_request(
    stop: str, watching: bool
) -> None:
    # A shutdown's stop request reaches every running job: one that finished its work
    # without looking was handed back all the same, its result dropped, and ran again
    # in full; after a user's cancel it ended cancelled, its result dropped.
    started = asyncio.Event()
    finishes = _finishes(f"finishes_{stop}_{watching}", started, watching=watching)
    graces = {"cancellation_grace_period": "5s", "cleanup_grace_period": "5s"}
    row, outcomes = await _stopped_outcome(finishes, started, stop, graces)
    if not watching:
        # The request came too late: the work is done, and the job says so.
        assert (row.status, row.result, outcomes) == (JobStatus.SUCCEEDED, "done", ["succeeded"])
    elif stop == "shutdown":
        assert (row.status, outcomes) == (JobStatus.PENDING, ["interrupted"])
    else:
        assert (row.status, outcomes) == (JobStatus.CANCELLED, ["cancelled"])


def _swallows(name: str, started: asyncio.Event) -> Any:
    """An actor that never looks at ``ctx.cancel_event`` but catches its task's
    cancellation and returns what it has done so far."""

    @actor(name=name)
    async def swallows(payload: dict[str, Any]) -> str:
        started.set()
        done = 0
        try:
            for _ in range(1000):
                await asyncio.sleep(0.01)
                done += 1
        except asyncio.CancelledError:
            return f"partial {done}/1000"
        return "all 1000"

    return swallows


@pytest.mark.parametrize("stop", ["shutdown", "cancel"])
async def test_an_actor_that_swallows_its_tasks_cancel_and_returns_stopped_early(
    stop: str,
) -> None:
    # It never looked at ctx.cancel_event, yet it was stopped (FORCING, or a user's
    # cancel forced at phase 2): its partial result was written as a success.
    started = asyncio.Event()
    swallows = _swallows(f"swallows_a_{stop}", started)
    graces = {"cancellation_grace_period": "100ms", "cleanup_grace_period": "2s"}
    row, outcomes = await _stopped_outcome(swallows, started, stop, graces)
    assert row.result is None
    if stop == "shutdown":
        assert (row.status, outcomes) == (JobStatus.PENDING, ["interrupted"])
    else:
        assert (row.status, outcomes) == (JobStatus.CANCELLED, ["cancelled"])


@pytest.mark.parametrize("replaced", [False, True])
async def test_an_attempt_written_off_past_its_limit_is_not_a_later_one(replaced: bool) -> None:
    # Queued by id, the write-off found whatever entry held the id at the post-tick: a
    # job reclaimed and locked for this worker again meanwhile had its new attempt
    # failed with the old one's limit, and its slot freed under its running task.
    from taskq.backend.memory import InMemoryBackend
    from taskq.worker._state import ActiveJob

    backend = InMemoryBackend()
    await backend.open()
    worker, [job] = await dispatched(backend)
    freed: list[str] = []
    old = past_its_limit(job, release=lambda: freed.append("old"))
    state = worker_state(backend, worker, old)
    controller = state.cancel
    await controller.run_tick([])  # past its limit: written off at the post-tick
    if replaced:  # as WorkerState.hold does for the same job locked again
        old.lost = True
        state.active[job.id] = ActiveJob(job.model_copy(update={"attempt": 2}))
    await controller.run_post_tick()
    await controller.write_late_outcomes()
    assert old.task is not None  # started by past_its_limit
    old.task.cancel()
    after = await backend.get(job.id)
    assert after is not None
    assert after.status is (JobStatus.RUNNING if replaced else JobStatus.FAILED)
    assert freed == ["old"]  # the old attempt's slot either way, and only its
    # The old attempt, reclaimed while it ran on past its limit, came to that failure.
    late = [e.detail for e in await backend.get_events(job.id) if e.kind == "late_outcome"]
    assert [(d["attempt"], d["outcome"]) for d in late] == ([(1, "failed")] if replaced else [])


async def test_a_late_escalation_leaves_the_job_its_whole_cleanup_grace() -> None:
    # The cleanup grace ran from the cancel's observation: an escalation write held up
    # past both graces (the database away) cancelled the task and abandoned it at the
    # next tick, though it unwound well within its grace.
    from taskq.backend.memory import InMemoryBackend

    class EscalationHeld(InMemoryBackend):
        held = True

        async def write_cancel_escalation(self, *args: Any, **kwargs: Any) -> bool:
            if self.held:
                raise ConnectionRefusedError("database away")
            return await super().write_cancel_escalation(*args, **kwargs)

    started = asyncio.Event()

    @actor(name="unwinds_in_half_a_second")
    async def unwinds(payload: dict[str, Any]) -> None:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            await asyncio.sleep(0.5)  # its cleanup
            raise

    backend = EscalationHeld()
    tq = TaskQ("memory://", backend=backend, actors=[unwinds])
    async with tq:
        job = await tq.client.enqueue(unwinds, {})
        graces: dict[str, Any] = {
            "cancellation_grace_period": "100ms",
            "cleanup_grace_period": "2s",
        }
        runner = asyncio.create_task(run_until_idle(tq, **graces))
        await asyncio.wait_for(started.wait(), 5)
        assert await tq.client.cancel(job.id)
        await asyncio.sleep(3)  # past both graces, the escalation refused throughout
        backend.held = False
        await asyncio.wait_for(runner, 10)
        row = await tq.client.get(job.id)
    assert row is not None and row.status is JobStatus.CANCELLED


async def test_a_cancelled_write_whose_reply_was_lost_is_the_workers_own() -> None:
    # The write committed and its reply was lost: the retry found the job cancelled and
    # the worker took it for another's write, recording a late outcome and skipping the
    # batch hook.
    import structlog.testing

    from taskq.backend.memory import InMemoryBackend

    class LostReply(InMemoryBackend):
        lost = 1

        async def mark_cancelled(self, *args: Any, **kwargs: Any) -> bool:
            done = await super().mark_cancelled(*args, **kwargs)
            if self.lost:
                self.lost -= 1
                raise ConnectionResetError("the reply was lost")
            return done

    started = asyncio.Event()

    @actor(name="waits_for_its_cancel")
    async def waits(payload: dict[str, Any], ctx: Context) -> None:
        started.set()
        await ctx.cancel_event.wait()
        raise asyncio.CancelledError

    backend = LostReply()
    tq = TaskQ("memory://", backend=backend, actors=[waits])
    async with tq:
        job = await tq.client.enqueue(waits, {})
        with structlog.testing.capture_logs() as logs:
            runner = asyncio.create_task(run_until_idle(tq, **_GRACES))
            await asyncio.wait_for(started.wait(), 5)
            assert await tq.client.cancel(job.id)
            await asyncio.wait_for(runner, 10)
        row = await tq.client.get(job.id)
        events = await tq.client.get_events(job.id)
    assert backend.lost == 0  # the reply was lost
    assert row is not None and row.status is JobStatus.CANCELLED
    assert [e.kind for e in events if e.kind == "late_outcome"] == []
    assert "taskq.ownership-lost" not in [e["event"] for e in logs]


async def test_an_escalation_whose_reply_was_lost_still_forces_the_task() -> None:
    # Phase 2 committed but its reply was lost: the controller's own write, tried again,
    # finds phase 2 stored and changes nothing. Only the stored phase (fast-advance)
    # tells it the escalation is done; without it the task was never cancelled and the
    # job stayed running for as long as its actor ignored its cancel_event.
    from taskq.backend.memory import InMemoryBackend

    class LostReply(InMemoryBackend):
        lost = 1

        async def write_cancel_escalation(self, *args: Any, **kwargs: Any) -> bool:
            written = await super().write_cancel_escalation(*args, **kwargs)
            if self.lost:
                self.lost -= 1
                raise ConnectionResetError("the reply was lost")
            return written

    started = asyncio.Event()

    @actor(name="ignores_its_cancel_event")
    async def ignores(payload: dict[str, Any]) -> None:
        started.set()
        await asyncio.Event().wait()  # only a cancelled task ends it

    backend = LostReply()
    tq = TaskQ("memory://", backend=backend, actors=[ignores])
    async with tq:
        job = await tq.client.enqueue(ignores, {})
        runner = asyncio.create_task(run_until_idle(tq, **_GRACES))
        await asyncio.wait_for(started.wait(), 5)
        assert await tq.client.cancel(job.id)
        await asyncio.wait_for(runner, 10)
        row = await tq.client.get(job.id)
    assert backend.lost == 0  # the escalation's reply was lost
    assert row is not None and row.status is JobStatus.CANCELLED and row.cancel_phase == 2


class _HeldFirstRow:
    """A write on the first of two jobs fails (its row held by another transaction) until
    the second job reaches ``until``'s state; ``refused`` counts the failures."""

    def __init__(self, until: Callable[[JobRow], bool], *, hangs: bool = False) -> None:
        self.ids: dict[str, Any] = {}
        self.until = until
        self.refused = 0
        self.hangs = hangs
        """Held without an answer (until a bound cuts it) rather than refused."""

    def backend(self, method: str) -> Backend:
        """An in-memory backend whose ``method`` (a write taking the job id first) fails
        on the first job as said."""
        from taskq.backend.memory import InMemoryBackend

        held = self

        class HeldRowBackend(InMemoryBackend):
            pass

        async def write(backend: InMemoryBackend, job_id: Any, *args: Any, **kwargs: Any) -> Any:
            second = await backend.get(held.ids["second"])
            if job_id == held.ids["first"] and (second is None or not held.until(second)):
                held.refused += 1
                if held.hangs:
                    await asyncio.sleep(3600)
                raise ConnectionResetError("the row is held by another transaction")
            return await getattr(InMemoryBackend, method)(backend, job_id, *args, **kwargs)

        setattr(HeldRowBackend, method, write)
        return HeldRowBackend()


async def _cancel_two(backend: Backend, held: _HeldFirstRow, stubborn: bool) -> list[JobRow]:
    """Run two jobs that ignore their cancel event (``stubborn``: every cancellation for
    3 s too), cancel both, and return their rows once the worker is idle."""
    started = {"first": asyncio.Event(), "second": asyncio.Event()}

    @actor(name="ignores_cancel_events")
    async def ignores(payload: dict[str, Any]) -> None:
        started[payload["n"]].set()
        loop = asyncio.get_running_loop()
        end = loop.time() + 3
        while not stubborn or loop.time() < end:
            try:
                await asyncio.sleep(0.02)
            except asyncio.CancelledError:
                if not stubborn:
                    raise

    tq = TaskQ("memory://", backend=backend, actors=[ignores])
    async with tq:
        for name in ("first", "second"):
            held.ids[name] = (await tq.client.enqueue(ignores, {"n": name})).id
        runner = asyncio.create_task(run_until_idle(tq, concurrency=2, **_GRACES))
        for event in started.values():
            await asyncio.wait_for(event.wait(), 5)
        for name in ("first", "second"):
            assert await tq.client.cancel(held.ids[name])
        await asyncio.wait_for(runner, 10)
        return [row for name in ("first", "second") if (row := await tq.client.get(held.ids[name]))]


async def test_one_escalation_write_failing_every_tick_does_not_hold_back_the_others() -> None:
    # The controller wrote the jobs' phase 2 one after the other and gave up the tick at
    # the first failure: a job whose write failed each tick (its row held by another
    # transaction) kept every job after it cooperative, their tasks never cancelled.
    held = _HeldFirstRow(until=lambda second: second.cancel_phase == 2)
    rows = await _cancel_two(held.backend("write_cancel_escalation"), held, stubborn=False)
    assert held.refused >= 1
    assert [r.status for r in rows] == [JobStatus.CANCELLED] * 2


async def test_one_abandonment_write_failing_every_tick_does_not_hold_back_the_others() -> None:
    # The post-tick wrote its queued abandonments in order and stopped at the first that
    # failed, which stayed first: every abandonment queued behind it waited, the tasks
    # written off holding their slots.
    held = _HeldFirstRow(until=lambda second: second.status is JobStatus.ABANDONED)
    rows = await _cancel_two(held.backend("mark_abandoned"), held, stubborn=True)
    assert held.refused >= 1
    assert [r.status for r in rows] == [JobStatus.ABANDONED] * 2


async def test_one_abandonment_write_held_every_tick_does_not_hold_back_the_others() -> None:
    # One whose write hung until the tick's bound cut it stayed first in the queue: the
    # abandonments behind it were never tried, their slots held.
    held = _HeldFirstRow(until=lambda second: second.status is JobStatus.ABANDONED, hangs=True)
    rows = await _cancel_two(held.backend("mark_abandoned"), held, stubborn=True)
    assert held.refused >= 1
    assert [r.status for r in rows] == [JobStatus.ABANDONED] * 2


async def test_abandonments_are_written_while_an_escalation_write_fails_every_tick() -> None:
    # A tick whose escalation write failed skipped the post-tick: the abandonments
    # queued meanwhile waited for as long as that write kept failing.
    held = _HeldFirstRow(until=lambda second: second.status is JobStatus.ABANDONED)
    rows = await _cancel_two(held.backend("write_cancel_escalation"), held, stubborn=True)
    assert held.refused >= 1
    assert [r.status for r in rows] == [JobStatus.ABANDONED] * 2


async def test_a_stop_forces_every_job_without_waiting_on_one_escalation_write() -> None:
    # FORCING stored each user-cancelled job's phase 2 one by one, and cancelled each
    # task after its own write: with a slow database every write cost a command timeout
    # before the next job was forced, the other jobs (interrupted ones too) waited
    # behind them, and the stop's cleanup grace went to the writes. Here each
    # escalation write answers only once the other is in flight and the interrupted
    # job's task was cancelled: one by one, the first gave up (a timeout) first.
    import structlog.testing

    from taskq import WorkerSettings
    from taskq.backend.memory import InMemoryBackend
    from taskq.worker import Worker
    from taskq_testing import TEST_SETTINGS

    interrupted_stopped = asyncio.Event()

    class SlowEscalations(InMemoryBackend):
        entered = 0
        all_in = asyncio.Event()

        async def write_cancel_escalation(self, *args: Any, **kwargs: Any) -> bool:
            self.entered += 1
            if self.entered == 2:
                self.all_in.set()
            async with asyncio.timeout(3):  # the command timeout of this fake database
                await self.all_in.wait()
                await interrupted_stopped.wait()
            return await super().write_cancel_escalation(*args, **kwargs)

    started: dict[str, asyncio.Event] = {n: asyncio.Event() for n in ("a", "b", "plain")}

    @actor(name="stops_only_when_its_task_is_cancelled")
    async def ignores(payload: dict[str, Any]) -> None:
        started[payload["n"]].set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            if payload["n"] == "plain":
                interrupted_stopped.set()
            raise

    backend = SlowEscalations()
    tq = TaskQ("memory://", backend=backend, actors=[ignores])
    async with tq:
        jobs = {n: await tq.client.enqueue(ignores, {"n": n}) for n in ("a", "b", "plain")}
        # The heartbeat sees the cancels (phase 1) but leaves the forcing to the stop.
        graces = {"cancellation_grace_period": "60s", "cleanup_grace_period": "5s"}
        stop = {"drain_grace_period": "60s", "termination_grace_period": "10s"}
        settings = {**TEST_SETTINGS, **graces, **stop, "queues": ["default"], "concurrency": 3}
        worker = Worker(tq, WorkerSettings.load(settings, env={}))
        running = asyncio.create_task(worker.run())
        for event in started.values():
            await asyncio.wait_for(event.wait(), 5)
        with structlog.testing.capture_logs() as logs:
            for n in ("a", "b"):
                assert await tq.client.cancel(jobs[n].id)
            for _ in range(500):
                if sum(e["event"] == "taskq.cancel-observed" for e in logs) == 2:
                    break
                await asyncio.sleep(0.01)
        worker.stop()
        worker.escalate()  # no drain nor cooperative wait: straight to FORCING
        await asyncio.wait_for(running, 10)
        rows = {n: await tq.client.get(job.id) for n, job in jobs.items()}
    assert backend.entered == 2
    for n in ("a", "b"):  # phase 2 stored for both, each before its task was cancelled
        row = rows[n]
        assert row is not None and row.status is JobStatus.CANCELLED and row.cancel_phase == 2
    plain = rows["plain"]
    assert plain is not None and plain.status is JobStatus.PENDING  # handed back


async def test_a_stop_forces_a_user_cancelled_job_whose_escalation_write_raised() -> None:
    # FORCING gathers the phase 2 writes; one raising an error that is not transient
    # (a bug, a refused statement) went out of the gather before its task was cancelled:
    # the job the user asked to cancel ran on, the stop itself failed, and the jobs
    # after it in the gather were left to chance.
    import structlog.testing

    from taskq import WorkerSettings
    from taskq.backend.memory import InMemoryBackend
    from taskq.worker import Worker
    from taskq_testing import TEST_SETTINGS

    forced: set[str] = set()

    class RefusedEscalation(InMemoryBackend):
        async def write_cancel_escalation(self, *args: Any, **kwargs: Any) -> bool:
            raise RuntimeError("not a transient error")

    started: dict[str, asyncio.Event] = {n: asyncio.Event() for n in ("a", "b")}

    @actor(name="stops_only_when_forced")
    async def ignores(payload: dict[str, Any]) -> None:
        started[payload["n"]].set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            forced.add(payload["n"])
            raise

    tq = TaskQ("memory://", backend=RefusedEscalation(), actors=[ignores])
    async with tq:
        jobs = {n: await tq.client.enqueue(ignores, {"n": n}) for n in started}
        graces = {"cancellation_grace_period": "60s", "cleanup_grace_period": "5s"}
        stop = {"drain_grace_period": "60s", "termination_grace_period": "10s"}
        settings = {**TEST_SETTINGS, **graces, **stop, "queues": ["default"], "concurrency": 2}
        worker = Worker(tq, WorkerSettings.load(settings, env={}))
        running = asyncio.create_task(worker.run())
        for event in started.values():
            await asyncio.wait_for(event.wait(), 5)
        with structlog.testing.capture_logs() as logs:
            for job in jobs.values():
                assert await tq.client.cancel(job.id)
            for _ in range(500):  # until the worker has seen both requests
                if sum(e["event"] == "taskq.cancel-observed" for e in logs) == 2:
                    break
                await asyncio.sleep(0.01)
            else:
                raise AssertionError("the worker never saw the cancels")
        worker.stop()
        worker.escalate()  # straight to FORCING
        await asyncio.wait_for(running, 10)
        rows = {n: await tq.client.get(job.id) for n, job in jobs.items()}
    assert forced == {"a", "b"}
    for row in rows.values():
        assert row is not None and row.status is JobStatus.CANCELLED


async def _cancelled_while_stubborn(
    backend: Backend,
    seconds: float,
    returned: asyncio.Event | None = None,
    **settings: Any,
) -> tuple[JobRow | None, list[Any]]:
    """A job cancelled once its actor runs, the actor ignoring every cancellation for
    ``seconds`` (then setting ``returned``), so that the cancel controller abandons it
    (short graces); its row and attempts once the worker is idle."""
    started = asyncio.Event()
    stubborn = _outlives_cancellation("stubborn", seconds, started, returned)
    tq = TaskQ("memory://", backend=backend, actors=[stubborn])
    async with tq:
        job = await tq.client.enqueue(stubborn, {})
        runner = asyncio.create_task(run_until_idle(tq, **_GRACES, **settings))
        await asyncio.wait_for(started.wait(), 5)
        assert await tq.client.cancel(job.id)
        await asyncio.wait_for(runner, 10)
        return await tq.client.get(job.id), await tq.client.get_attempts(job.id)


async def test_an_abandonment_write_cut_short_by_the_ticks_bound_is_written_next_tick() -> None:
    # The post-tick took the queued abandonment off its queue, then awaited its write:
    # the tick's bound cancelled it there, and the abandonment was never written.
    from taskq.backend.memory import InMemoryBackend

    class FirstAbandonHangs(InMemoryBackend):
        calls = 0

        async def mark_abandoned(self, *args: Any, **kwargs: Any) -> bool:
            FirstAbandonHangs.calls += 1
            if FirstAbandonHangs.calls == 1:
                await asyncio.sleep(3600)  # cut short by the heartbeat tick's bound
            return await super().mark_abandoned(*args, **kwargs)

    row, _ = await _cancelled_while_stubborn(
        FirstAbandonHangs(), 3, dispatcher_command_timeout="300ms"
    )
    assert FirstAbandonHangs.calls >= 2
    assert row is not None and row.status is JobStatus.ABANDONED


async def test_a_written_off_job_whose_task_ended_is_not_handed_back_as_unheard() -> None:
    # The abandonment's write failed until the stubborn task had returned, and its
    # entry was gone: the next renewal found the job locked for this worker and unknown
    # to it, and the producer handed it back as unstarted. The job whose code had run,
    # written off, ended "cancelled" with an "unstarted" attempt (or, not yet cancelled
    # by its user, ran again).
    from taskq.backend.memory import InMemoryBackend

    returned, looked = asyncio.Event(), asyncio.Event()

    class AbandonFailsAWhile(InMemoryBackend):
        async def held_jobs(self, *args: Any, **kwargs: Any) -> Any:
            if returned.is_set():
                looked.set()
            return await super().held_jobs(*args, **kwargs)

        async def mark_abandoned(self, *args: Any, **kwargs: Any) -> bool:
            if not returned.is_set():
                raise ConnectionResetError("the database is away")
            await looked.wait()  # the producer looked for unheard jobs meanwhile
            return await super().mark_abandoned(*args, **kwargs)

    row, attempts = await _cancelled_while_stubborn(AbandonFailsAWhile(), 1, returned)
    assert row is not None and row.status is JobStatus.ABANDONED
    assert [a.outcome for a in attempts] == ["abandoned"]


async def test_a_late_outcome_whose_write_landed_as_the_tick_was_cut_is_not_kept_twice() -> None:
    # A late outcome leaves its queue only once written: one whose write landed as the
    # tick's bound cut it (its reply lost) was written again at the next tick, and the
    # job's history said twice that the attempt came late.
    from taskq.backend.memory import InMemoryBackend

    class ReplyLost(InMemoryBackend):
        calls = 0

        async def record_late_outcome(self, *args: Any, **kwargs: Any) -> bool:
            ReplyLost.calls += 1
            landed = await super().record_late_outcome(*args, **kwargs)
            if ReplyLost.calls == 1:
                await asyncio.sleep(3600)  # written; the tick's bound cuts the reply
            return landed

    backend = ReplyLost()
    await backend.open()
    worker, [job] = await dispatched(backend)
    old = past_its_limit(job)
    controller = worker_state(backend, worker, old).cancel
    await controller.run_tick([])  # past its limit: written off at the post-tick
    old.lost = True  # reclaimed meanwhile: the write-off is refused, kept as late
    await controller.run_post_tick()
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.5):
            await controller.write_late_outcomes()
    await controller.write_late_outcomes()
    assert old.task is not None  # started by past_its_limit
    old.task.cancel()
    late = [e for e in await backend.get_events(job.id) if e.kind == "late_outcome"]
    assert len(late) == 1


async def test_a_late_outcome_is_written_while_another_write_off_fails_every_tick() -> None:
    # Late outcomes were written by the post-tick before it raised the write that
    # failed; moved after it (and after the reservation leases), a write-off failing
    # every tick (its row held by another transaction) kept every late outcome unwritten.
    from taskq.backend.memory import InMemoryBackend
    from taskq.worker.heartbeat import heartbeat_once

    held: set[Any] = set()
    reclaimed: set[Any] = set()

    class HeldRow(InMemoryBackend):
        async def mark_failed_or_retry(self, job_id: Any, *args: Any, **kwargs: Any) -> Any:
            if job_id in held:
                raise ConnectionResetError("the row is held by another transaction")
            if job_id in reclaimed:  # the write-off refused: the job runs again elsewhere
                row = await self.get(job_id)
                assert row is not None
                return row.model_copy(update={"attempt": row.attempt + 1})
            return await super().mark_failed_or_retry(job_id, *args, **kwargs)

    backend = HeldRow()
    await backend.open()
    worker, rows = await dispatched(backend, 2)
    actives = {row.id: past_its_limit(row) for row in rows}
    late_job, stuck_job = (row.id for row in rows)
    held.add(stuck_job)
    state = worker_state(backend, worker, *actives.values())
    reclaimed.add(late_job)  # its write-off refused: kept as a late outcome
    try:
        for _ in range(2):
            with pytest.raises(ConnectionResetError):
                await heartbeat_once(state)
    finally:
        for active in actives.values():
            assert active.task is not None
            active.task.cancel()
    late = [e for e in await backend.get_events(late_job) if e.kind == "late_outcome"]
    assert len(late) == 1


async def test_a_late_outcome_queued_as_the_worker_stops_is_still_written() -> None:
    # The stop ends the heartbeat once every slot is freed: a write-off refused at its
    # last tick freed its slot, and the heartbeat, cancelled at its next await (the
    # reservation leases' extension, a round trip), never wrote the late outcome.
    from taskq.backend.memory import InMemoryBackend
    from taskq.worker.heartbeat import heartbeat_loop

    extending = asyncio.Event()

    class Reclaimed(InMemoryBackend):
        async def mark_failed_or_retry(self, job_id: Any, *args: Any, **kwargs: Any) -> Any:
            row = await self.get(job_id)  # refused: the job runs again elsewhere
            assert row is not None
            return row.model_copy(update={"attempt": row.attempt + 1})

        async def extend_reservation_leases(self, *args: Any, **kwargs: Any) -> int:
            extending.set()
            await asyncio.sleep(0.5)  # a round trip
            return await super().extend_reservation_leases(*args, **kwargs)

    backend = Reclaimed()
    await backend.open()
    worker, [job] = await dispatched(backend)
    freed = asyncio.Event()
    active = past_its_limit(job, release=freed.set)
    state = worker_state(backend, worker, active)
    heartbeat = asyncio.create_task(heartbeat_loop(state))
    try:
        await asyncio.wait_for(freed.wait(), 5)  # the slot freed: the stop ends the loops
        await asyncio.wait_for(extending.wait(), 5)
        heartbeat.cancel()
        await asyncio.wait({heartbeat})
    finally:
        heartbeat.cancel()
        assert active.task is not None  # started by past_its_limit
        active.task.cancel()
    late = [e for e in await backend.get_events(job.id) if e.kind == "late_outcome"]
    assert len(late) == 1


async def test_a_tick_cut_by_its_bound_does_not_go_on_to_the_post_ticks_writes() -> None:
    # The post-tick ran in a `finally` of the cancel step: when the tick's bound cut that
    # step (a cancel poll held up), the queued writes were tried after the bound had
    # fired, with none left, and one held up there held the heartbeat for as long. Left
    # queued (8d163f0), they are written at the next tick.
    from taskq.backend.memory import InMemoryBackend
    from taskq.worker.heartbeat import heartbeat_once

    held = {"poll": False, "abandon": False}

    class HeldUp(InMemoryBackend):
        async def poll_cancel_flags(self, *args: Any, **kwargs: Any) -> Any:
            if held["poll"]:
                await asyncio.sleep(3600)
            return await super().poll_cancel_flags(*args, **kwargs)

        async def mark_abandoned(self, *args: Any, **kwargs: Any) -> bool:
            if held["abandon"]:
                await asyncio.sleep(3600)
            return await super().mark_abandoned(*args, **kwargs)

    backend = HeldUp()
    await backend.open()
    worker, [job] = await dispatched(backend)
    active = await forced_past_cleanup(backend, worker, job)
    state = worker_state(backend, worker, active)
    loop = asyncio.get_running_loop()
    try:
        held.update(poll=True, abandon=True)
        began = loop.time()
        async with asyncio.timeout(2):  # else the test would hang: the tick ran on
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.3):  # the tick's bound, as heartbeat_loop's
                    await state.cancel.run_tick([])  # queued for abandonment
                    await heartbeat_once(state)
        assert loop.time() - began < 1
        held.update(poll=False, abandon=False)
        async with asyncio.timeout(2):
            await heartbeat_once(state)  # the abandonment, written at the next tick
    finally:
        assert active.task is not None  # started by past_its_limit
        active.task.cancel()
    current = await backend.get(job.id)
    assert current is not None and current.status is JobStatus.ABANDONED
