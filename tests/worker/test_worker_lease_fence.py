"""The lease fence: a worker cut off from the database stops its jobs before their
leases can lapse (``lease_fence``), and only then."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any
from uuid import uuid4

import pytest

from taskq import Context, JobRow, JobStatus, TaskQ, WorkerSettings, actor
from taskq.backend.memory import InMemoryBackend
from taskq.worker import Worker
from taskq.worker._state import WorkerState
from taskq.worker.fence import fence_lapsing
from tests.worker.flaky_backend import CutOff
from tests.worker.running import running

LEASE = 2.0
SETTINGS = {
    "poll_interval": "50ms",
    "heartbeat_interval": "500ms",
    "lock_lease": f"{LEASE}s",
    "dispatcher_command_timeout": "300ms",
    # No sweep: nothing reclaims, so only this worker decides what happens to its jobs.
    "maintenance_interval": "1h",
    "lease_fence": "true",
}


def _no_wait(attempt: int) -> timedelta:
    """Retries due at once: the promotion of scheduled jobs is a leader sweep, off here."""
    return timedelta(0)


async def _until(tq: TaskQ, job: JobRow, status: JobStatus) -> JobRow:
    async with asyncio.timeout(10):
        while (row := await tq.client.get(job.id)) is None or row.status is not status:  # noqa: ASYNC110 - the stored row
            await asyncio.sleep(0.05)
    return row


async def test_a_running_job_is_stopped_before_its_lease_can_lapse_then_retried() -> None:
    runs: list[str] = []
    stopped_at: list[float] = []

    @actor(name="long", max_attempts=3, retry_backoff=_no_wait)
    async def long(payload: dict[str, Any]) -> str:
        runs.append("started")
        if len(runs) == 1:
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                stopped_at.append(asyncio.get_running_loop().time())
                raise
        return "done"

    backend = CutOff()
    tq = TaskQ("memory://", actors=[long], backend=backend)
    async with tq:
        job = await tq.client.enqueue(long, {})
        async with running(tq, SETTINGS):
            await _until(tq, job, JobStatus.RUNNING)
            backend.away = True
            cut = asyncio.get_running_loop().time()
            async with asyncio.timeout(10):
                while not stopped_at:  # noqa: ASYNC110 - waiting on the actor's own record
                    await asyncio.sleep(0.02)
            # Renewed last before the cut: the lease runs to cut + LEASE at the latest.
            assert stopped_at[0] < cut + LEASE
            await asyncio.sleep(0.2)
            backend.away = False
            row = await _until(tq, job, JobStatus.SUCCEEDED)
        assert runs == ["started", "started"] and row.attempt == 2
        first = (await tq.client.get_attempts(job.id))[0]
        assert first.outcome == "failed" and first.error is not None
        assert first.error.error_class.endswith("LeaseLost")
        assert "no confirmed renewal of this job's lease" in first.error.message


async def test_a_sync_actor_is_told_through_its_cancel_event() -> None:
    told = threading.Event()

    @actor(name="polling", max_attempts=2, retry_backoff=_no_wait)
    def polling(payload: dict[str, Any], ctx: Context) -> str:
        if ctx.attempt == 1:
            until = time.monotonic() + 10
            while not ctx.cancel_event.is_set() and time.monotonic() < until:
                time.sleep(0.02)  # a long computation that looks up now and then
            if ctx.cancel_event.is_set():
                told.set()
        return "done"

    backend = CutOff()
    tq = TaskQ("memory://", actors=[polling], backend=backend)
    async with tq:
        job = await tq.client.enqueue(polling, {})
        async with running(tq, SETTINGS):
            await _until(tq, job, JobStatus.RUNNING)
            backend.away = True
            assert await asyncio.to_thread(told.wait, 10)
            backend.away = False
            row = await _until(tq, job, JobStatus.SUCCEEDED)
        assert row.attempt == 2


async def test_a_job_a_stop_asked_to_stop_is_fenced_all_the_same() -> None:
    # A stop's CANCELLING phase only sets the cancel event: the job's code runs on
    # until FORCING, past the lease when the grace is long.
    stopped_at: list[float] = []

    @actor(name="deaf", max_attempts=3, retry_backoff=_no_wait)
    async def deaf(payload: dict[str, Any]) -> None:
        try:
            await asyncio.sleep(30)  # does not look at its cancel event
        except asyncio.CancelledError:
            stopped_at.append(asyncio.get_running_loop().time())
            raise

    backend = CutOff()
    tq = TaskQ("memory://", actors=[deaf], backend=backend)
    settings = {**SETTINGS, "drain_grace_period": "100ms", "cancellation_grace_period": "20s"}
    async with tq:
        job = await tq.client.enqueue(deaf, {})
        worker = Worker(tq, WorkerSettings.load(settings, env={}))
        run = asyncio.create_task(worker.run())
        await _until(tq, job, JobStatus.RUNNING)
        backend.away = True
        cut = asyncio.get_running_loop().time()
        worker.stop()
        async with asyncio.timeout(10):
            while not stopped_at:  # noqa: ASYNC110 - waiting on the actor's own record
                await asyncio.sleep(0.02)
        assert stopped_at[0] < cut + LEASE
        backend.away = False
        await asyncio.wait_for(run, 10)
        row = await _until(tq, job, JobStatus.PENDING)
        # Handed back, as the stop would have: its budget untouched.
        assert [a.outcome for a in await tq.client.get_attempts(job.id)] == ["interrupted"]
        assert row.attempt == 1


async def test_an_outcome_written_before_the_actor_starts_is_not_cut_short() -> None:
    # Cancelled by its user while it waited for a slot: the consumer only writes
    # ``cancelled``, which retries while the database is away; no code of the job runs,
    # so there is nothing to fence.
    release = asyncio.Event()

    @actor(name="step", max_attempts=3)
    async def step(payload: dict[str, Any]) -> None:
        await release.wait()

    backend = CutOff()
    tq = TaskQ("memory://", actors=[step], backend=backend)
    async with tq:
        first = await tq.client.enqueue(step, {})
        second = await tq.client.enqueue(step, {})
        async with running(tq, {**SETTINGS, "concurrency": "1", "prefetch": "1"}) as worker:
            await _until(tq, second, JobStatus.RUNNING)  # locked here, waiting for the slot
            await tq.client.cancel(second.id)
            assert worker._state is not None
            async with asyncio.timeout(5):  # seen by the worker's heartbeat
                while not (held := worker._state.active.get(second.id)) or not (  # noqa: ASYNC110
                    held.cancel_requested
                ):
                    await asyncio.sleep(0.02)
            backend.away = True
            release.set()  # the first returns; the second starts, only to write `cancelled`
            await asyncio.sleep(LEASE + 0.5)
            backend.away = False
            await _until(tq, first, JobStatus.SUCCEEDED)
            await _until(tq, second, JobStatus.CANCELLED)
        assert [a.outcome for a in await tq.client.get_attempts(second.id)] == ["cancelled"]


async def test_a_job_waiting_for_a_slot_is_let_go_unstarted_and_handed_back() -> None:
    bodies: list[str] = []
    release = asyncio.Event()

    @actor(name="step", max_attempts=3, retry_backoff=_no_wait)
    async def step(payload: dict[str, Any]) -> None:
        bodies.append(payload["name"])
        if payload["name"] == "first" and bodies.count("first") == 1:
            await asyncio.sleep(30)
        await release.wait()

    backend = CutOff()
    tq = TaskQ("memory://", actors=[step], backend=backend)
    async with tq:
        first = await tq.client.enqueue(step, {"name": "first"})
        second = await tq.client.enqueue(step, {"name": "second"})
        async with running(tq, {**SETTINGS, "concurrency": "1", "prefetch": "1"}):
            await _until(tq, second, JobStatus.RUNNING)  # locked here, waiting for the slot
            backend.away = True
            await asyncio.sleep(LEASE + 0.5)
            backend.away = False
            release.set()
            await _until(tq, first, JobStatus.SUCCEEDED)
            row = await _until(tq, second, JobStatus.SUCCEEDED)
        # Never started while cut off: handed back unstarted, its budget untouched.
        assert bodies.count("second") == 1 and row.status is JobStatus.SUCCEEDED
        outcomes = [a.outcome for a in await tq.client.get_attempts(second.id)]
        assert outcomes == ["unstarted", "succeeded"]
        assert bodies.count("first") == 2


async def test_jobs_whose_leases_are_renewed_run_on_for_many_leases() -> None:
    @actor(name="slow")
    async def slow(payload: dict[str, Any]) -> str:
        await asyncio.sleep(2.5 * LEASE)
        return "done"

    tq = TaskQ("memory://", actors=[slow])
    async with tq:
        jobs = [await tq.client.enqueue(slow, {}) for _ in range(2)]
        # The second waits a whole run for the slot, locked here all along.
        async with running(tq, {**SETTINGS, "concurrency": "1", "prefetch": "1"}):
            rows = [await _until(tq, job, JobStatus.SUCCEEDED) for job in jobs]
    assert [row.attempt for row in rows] == [1, 1]


async def test_off_by_default_a_cut_off_job_runs_on() -> None:
    stopped: list[str] = []

    @actor(name="long")
    async def long(payload: dict[str, Any]) -> str:
        try:
            await asyncio.sleep(LEASE + 1)
        except asyncio.CancelledError:
            stopped.append("stopped")
            raise
        return "done"

    backend = CutOff()
    tq = TaskQ("memory://", actors=[long], backend=backend)
    async with tq:
        job = await tq.client.enqueue(long, {})
        async with running(tq, {**SETTINGS, "lease_fence": "false"}):
            await _until(tq, job, JobStatus.RUNNING)
            backend.away = True
            await asyncio.sleep(LEASE + 0.5)
            backend.away = False
            row = await _until(tq, job, JobStatus.SUCCEEDED)
    assert not stopped and row.attempt == 1


@pytest.mark.parametrize("before", [True, False])
async def test_the_fence_falls_one_heartbeat_before_the_lease_ends(before: bool) -> None:
    @actor(name="noop")
    async def noop(payload: dict[str, Any]) -> None:
        return None

    tq = TaskQ("memory://", actors=[noop], backend=InMemoryBackend())
    async with tq:
        row = await tq.client.enqueue(noop, {})
        settings = WorkerSettings.load(SETTINGS, env={})
        with ThreadPoolExecutor(1) as executor:
            state = WorkerState(
                uuid4(), settings, tq.backend, tq.actors, tq.providers, tq.client, executor
            )
            state.hold(row, lease_from=100.0)
            interval = settings.heartbeat_interval.total_seconds()
            fence_at = 100.0 + LEASE - interval
            now = fence_at - 0.001 if before else fence_at
            due = fence_lapsing(state, now, interval)
        if before:
            assert due == fence_at and row.id in state.active
        else:
            assert due is None and row.id not in state.active


class _TouchHeldUp(InMemoryBackend):
    """Its registry row cannot be touched (a lock on the workers table, a failure);
    leases renew as ever."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how
        self.held = False

    async def touch_worker(self, worker_id: Any) -> bool:
        if self.held:
            if self.how == "hangs":
                await asyncio.sleep(3600)
            raise RuntimeError("the touch failed")
        return await super().touch_worker(worker_id)


@pytest.mark.parametrize("how", ["hangs", "fails"])
async def test_a_held_up_touch_of_the_worker_row_does_not_lose_the_renewals(how: str) -> None:
    # Awaited beside the renewal, a touch that hung or failed took the tick with it:
    # the renewals landed, yet the worker counted none, and the fence stopped the job.
    runs: list[str] = []

    @actor(name=f"outlives_a_held_up_touch_{how}", max_attempts=2)
    async def long(payload: dict[str, Any]) -> str:
        runs.append("started")
        await asyncio.sleep(LEASE * 2)
        return "done"

    backend = _TouchHeldUp(how)
    tq = TaskQ("memory://", actors=[long], backend=backend)
    async with tq:
        job = await tq.client.enqueue(long, {})
        async with running(tq, SETTINGS):
            await _until(tq, job, JobStatus.RUNNING)
            backend.held = True
            row = await _until(tq, job, JobStatus.SUCCEEDED)
            backend.held = False
    assert runs == ["started"] and row.attempt == 1
