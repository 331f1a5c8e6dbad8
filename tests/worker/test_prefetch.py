"""``prefetch``: the jobs a worker locks ahead of its consumers. ``auto`` (the default)
locks ahead what it expects to start within ``prefetch_horizon``: several per consumer
for short jobs, none for long ones."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import timedelta
from typing import Any
from uuid import UUID

import pytest
from structlog.testing import capture_logs

from taskq import TaskQ, actor
from taskq.backend import Backend
from taskq.backend.memory import InMemoryBackend
from taskq.models import BatchChildEnd, JobRow, JobStatus
from taskq.settings import MAX_PREFETCH, SettingsError, WorkerSettings
from taskq.worker.prefetch import MAX_AHEAD_PER_CONSUMER, Prefetch
from taskq_testing import TEST_SETTINGS, run_until_idle
from tests.worker.running import running


def test_a_fixed_prefetch_is_what_was_set_whatever_the_jobs() -> None:
    prefetch = Prefetch(concurrency=4, fixed=3, horizon=0.02)
    prefetch.held(10.0)
    assert not prefetch.adaptive
    assert prefetch.ahead([100.0]) == 3


def test_auto_locks_nothing_ahead_before_a_job_has_run() -> None:
    assert Prefetch(concurrency=16, fixed=None, horizon=0.02).ahead() == 0


def test_auto_locks_ahead_what_starts_within_the_horizon() -> None:
    # 16 consumers of 50 ms jobs start about 320 a second: 6.4 within 20 ms.
    prefetch = Prefetch(concurrency=16, fixed=None, horizon=0.02)
    prefetch.held(0.05)
    assert prefetch.ahead() == 6


def test_auto_locks_nothing_ahead_for_long_jobs() -> None:
    prefetch = Prefetch(concurrency=16, fixed=None, horizon=0.02)
    prefetch.held(1.0)
    assert prefetch.ahead() == 0


def test_auto_locks_at_most_its_cap_per_consumer_ahead() -> None:
    prefetch = Prefetch(concurrency=16, fixed=None, horizon=0.02)
    prefetch.held(0.0001)
    assert prefetch.ahead() == MAX_AHEAD_PER_CONSUMER * 16 == 512
    prefetch.held(0.0)
    assert prefetch.ahead() == 512


def test_auto_locks_no_more_ahead_than_a_fixed_prefetch_may() -> None:
    # 32 per consumer at concurrency 1,000 is 32,000 rows held in memory and renewed by
    # every heartbeat, past the most a fixed prefetch may ask for.
    prefetch = Prefetch(concurrency=1000, fixed=None, horizon=0.02)
    prefetch.held(0.0)
    assert prefetch.ahead() == MAX_PREFETCH == 10_000


def test_a_horizon_of_zero_locks_nothing_ahead_even_of_jobs_held_no_time() -> None:
    # A coarse clock (Windows' monotonic ticks 15.6 ms) reads 0 for a no-op job.
    prefetch = Prefetch(concurrency=4, fixed=None, horizon=0.0)
    prefetch.held(0.0)
    assert prefetch.ahead() == 0
    assert prefetch.ahead([0.0]) == 0


def test_jobs_that_turned_long_stop_the_lock_ahead_before_the_first_of_them_ends() -> None:
    prefetch = Prefetch(concurrency=4, fixed=None, horizon=0.02)
    for _ in range(20):
        prefetch.held(0.0001)
    assert prefetch.ahead([0.0, 0.001]) == 4 * MAX_AHEAD_PER_CONSUMER
    # Running 0.5 s on average: slots free about 8 times a second.
    assert prefetch.ahead([0.4, 0.6, 0.5, 0.5]) == 0


def test_auto_follows_jobs_that_turn_short_again() -> None:
    prefetch = Prefetch(concurrency=4, fixed=None, horizon=0.02)
    prefetch.held(2.0)
    assert prefetch.ahead() == 0
    for _ in range(40):
        prefetch.held(0.0001)
    assert prefetch.ahead() == 4 * MAX_AHEAD_PER_CONSUMER


class _RecordingBackend(InMemoryBackend):
    """Records how many jobs each dispatch asked for."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[int] = []

    async def dispatch_actors_batch(
        self,
        worker_id: UUID,
        queues: list[str],
        limit: int,
        lock_lease: timedelta,
        actors: Sequence[str],
    ) -> list[JobRow]:
        self.asked.append(limit)
        return await super().dispatch_actors_batch(worker_id, queues, limit, lock_lease, actors)


@actor(name="prefetch_quick")
async def quick(payload: dict[str, Any]) -> None:
    return None


@actor(name="prefetch_slow")
async def slow(payload: dict[str, Any]) -> None:
    await asyncio.sleep(0.15)


async def _asked(job: Any, jobs: int, **settings: Any) -> list[int]:
    backend = _RecordingBackend()
    tq = TaskQ("memory://", actors=[quick, slow], backend=backend)
    async with tq:
        for _ in range(jobs):
            await tq.client.enqueue(job, {})
        worker = await run_until_idle(tq, concurrency=1, **settings)
    assert worker.processed == jobs
    return backend.asked


async def test_a_worker_of_short_jobs_locks_ahead_at_most_its_cap_per_consumer() -> None:
    # A horizon no no-op job's hold comes near, however loaded the machine.
    asked = await _asked(quick, 60, prefetch_horizon="1s")
    assert asked[0] == 1  # nothing known of the jobs yet
    assert max(asked) == 1 + MAX_AHEAD_PER_CONSUMER


async def test_a_worker_of_long_jobs_locks_none_ahead_by_default() -> None:
    # 150 ms jobs start about 7 a second here: none within 20 ms. Another worker
    # takes the next job rather than it waiting locked here.
    assert max(await _asked(slow, 3)) == 1


async def test_prefetch_zero_locks_none_ahead_even_of_short_jobs() -> None:
    assert max(await _asked(quick, 30, prefetch=0)) == 1


async def test_a_longer_horizon_locks_ahead_the_jobs_that_start_within_it() -> None:
    # Jobs of at least 150 ms, one consumer: within 1 s at most 6 start (fewer when
    # a loaded machine stretches them).
    asked = await _asked(slow, 4, prefetch_horizon="1s")
    assert 1 < max(asked) <= 1 + 6


@pytest.mark.parametrize(("value", "taken"), [("auto", "auto"), (" AUTO ", "auto"), ("12", 12)])
def test_prefetch_takes_auto_or_a_number(value: str, taken: object) -> None:
    assert WorkerSettings.load({}, env={"TASKQ_PREFETCH": value}).prefetch == taken


@pytest.mark.parametrize("value", ["fast", "-1", "1.5", ""])
def test_a_prefetch_neither_auto_nor_a_number_is_refused_saying_what_it_takes(value: str) -> None:
    with pytest.raises(SettingsError, match="must be auto or a whole number of jobs"):
        WorkerSettings.load({}, env={"TASKQ_PREFETCH": value})


def test_prefetch_is_auto_by_default() -> None:
    settings = WorkerSettings.load({}, env={})
    assert settings.prefetch == "auto"
    assert settings.prefetch_horizon == timedelta(milliseconds=20)


def test_a_horizon_with_a_fixed_prefetch_is_said_to_do_nothing() -> None:
    env = {"TASKQ_PREFETCH": "4", "TASKQ_PREFETCH_HORIZON": "50ms"}
    inert = WorkerSettings.load({}, env=env).inert_settings()
    assert list(inert) == ["prefetch_horizon"] and "prefetch=auto" in inert["prefetch_horizon"]
    env["TASKQ_PREFETCH"] = "auto"
    assert WorkerSettings.load({}, env=env).inert_settings() == {}


def _long_job(started: asyncio.Event) -> Any:
    @actor(name="prefetch_long", max_attempts=1)  # a hand-back spends no attempt
    async def long_job(payload: dict[str, Any]) -> None:
        started.set()
        await asyncio.sleep(1.5)

    return long_job


async def test_jobs_locked_ahead_of_jobs_that_turned_long_are_handed_back_for_others() -> None:
    # Quick jobs taught the worker to lock 4 ahead; the two long jobs after them were
    # locked ahead too, the second waiting behind the first for 1.5 s while another
    # worker could have run it. Past ten horizons (200 ms) it is handed back.
    started = asyncio.Event()
    long_job = _long_job(started)
    tq = TaskQ("memory://", actors=[quick, long_job])
    async with tq:
        for _ in range(30):
            await tq.client.enqueue(quick, {})
        await tq.client.enqueue(long_job, {})
        second = await tq.client.enqueue(long_job, {})
        with capture_logs() as logs:
            runner = asyncio.create_task(run_until_idle(tq, concurrency=1))
            await asyncio.wait_for(started.wait(), 10)
            await asyncio.sleep(0.9)
            waiting = await tq.client.get(second.id)
            assert waiting is not None
            assert waiting.status is JobStatus.PENDING and waiting.locked_by_worker is None
            worker = await asyncio.wait_for(runner, 10)
        assert worker.processed == 32
        done = await tq.client.get(second.id)
        assert done is not None and done.status is JobStatus.SUCCEEDED
        # The audit trail says what happened: locked, handed back unstarted, then run.
        outcomes = [a.outcome for a in await tq.client.get_attempts(second.id)]
        assert outcomes == ["unstarted", "succeeded"]
    handed = [e for e in logs if e["event"] == "taskq.locked-ahead-handed-back"]
    assert handed and handed[0]["moved"] >= 1


async def test_a_fixed_prefetch_keeps_its_jobs_locked_ahead_however_long_they_wait() -> None:
    started = asyncio.Event()
    long_job = _long_job(started)
    tq = TaskQ("memory://", actors=[long_job])
    async with tq:
        await tq.client.enqueue(long_job, {})
        second = await tq.client.enqueue(long_job, {})
        runner = asyncio.create_task(run_until_idle(tq, concurrency=1, prefetch=1))
        await asyncio.wait_for(started.wait(), 10)
        await asyncio.sleep(0.9)
        waiting = await tq.client.get(second.id)
        assert waiting is not None and waiting.status is JobStatus.RUNNING
        await asyncio.wait_for(runner, 10)


class _HandBackWatch(InMemoryBackend):
    """Says when the worker hands a job back unstarted."""

    def __init__(self) -> None:
        super().__init__()
        self.handed_back = asyncio.Event()

    async def hand_back_unstarted(
        self,
        worker_id: UUID,
        jobs: Sequence[tuple[UUID, int | None]],
        *,
        batch_ends: list[BatchChildEnd] | None = None,
    ) -> int:
        self.handed_back.set()
        await asyncio.sleep(0)  # a round trip's turn of the loop, as a real database's
        return await super().hand_back_unstarted(worker_id, jobs, batch_ends=batch_ends)


async def test_a_job_held_for_a_free_consumer_is_not_handed_back_however_short_the_horizon() -> (
    None
):
    # Horizon 0: ten horizons are no wait at all. Every job the producer had just locked
    # for an idle consumer read as stale before that consumer's turn came, so each was
    # handed back, locked again and handed back, and none ever ran.
    backend = _HandBackWatch()
    tq = TaskQ("memory://", actors=[quick], backend=backend)
    async with tq:
        for _ in range(5):
            await tq.client.enqueue(quick, {})
        runner = asyncio.ensure_future(run_until_idle(tq, concurrency=2, prefetch_horizon="0s"))
        handed = asyncio.ensure_future(backend.handed_back.wait())
        try:
            await asyncio.wait([runner, handed], timeout=10, return_when=asyncio.FIRST_COMPLETED)
            assert not backend.handed_back.is_set()
            assert runner.done() and runner.result().processed == 5
        finally:
            handed.cancel()
            runner.cancel()
            await asyncio.gather(runner, return_exceptions=True)


async def test_a_job_locked_ahead_of_a_long_one_runs_on_an_idle_worker(
    taskq_backend: Backend,
) -> None:
    # The promise behind the hand-back: a job locked ahead on a worker whose jobs turned
    # long does not wait them out while another worker idles.
    started = asyncio.Event()
    long_job = _long_job(started)
    tq = TaskQ("memory://", actors=[quick, long_job], backend=taskq_backend)
    for _ in range(30):
        await tq.client.enqueue(quick, {})
    await tq.client.enqueue(long_job, {})
    second = await tq.client.enqueue(long_job, {})
    settings = {**TEST_SETTINGS, "concurrency": 1}
    async with running(tq, settings) as busy:
        await asyncio.wait_for(started.wait(), 10)
        held = await tq.client.get(second.id)
        assert held is not None and held.locked_by_worker == busy.worker_id  # locked ahead
        async with running(tq, {**settings, "prefetch": 0}) as idle:
            await tq.client.wait_for_result(second.id, timeout=10)  # raises unless it succeeds
    attempts = await tq.client.get_attempts(second.id)
    assert [(a.outcome, a.worker_id) for a in attempts] == [
        ("unstarted", busy.worker_id),
        ("succeeded", idle.worker_id),
    ]
