"""taskq_testing's backend fixtures and ``run_until_idle``, as an application's tests use them."""

from __future__ import annotations

import asyncio
import threading
from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel

from taskq import Context, Snooze, TaskQ, actor
from taskq.backend import Backend
from taskq.backend.memory import InMemoryBackend
from taskq.models import JobStatus
from taskq_testing import TEST_SETTINGS, run_until_idle


class Square(BaseModel):
    n: int


@actor(queue="default")
async def square(payload: Square) -> int:
    return payload.n * payload.n


@actor(queue="elsewhere")
async def snooze_once(payload: dict[str, Any], ctx: Context) -> str:
    if ctx.attempt == 1:
        raise Snooze(0.05)  # the next run is attempt 2, without using up the budget
    return "woke"


@actor(queue="elsewhere")
async def forever(payload: dict[str, Any]) -> None:
    await asyncio.sleep(3600)


def _app(backend: Backend) -> TaskQ:
    # The URL is not used when a backend is given.
    return TaskQ("memory://", actors=[square, snooze_once, forever], backend=backend)


async def test_every_queue_of_the_app_is_run_to_the_end(taskq_backend: Backend) -> None:
    app = _app(taskq_backend)
    squares = [await app.client.enqueue(square, {"n": i}) for i in range(5)]
    snoozed = await app.client.enqueue(snooze_once, {})
    worker = await run_until_idle(app)
    assert worker.processed >= 6
    results = [await app.client.wait_for_result(job.id, timeout=1) for job in squares]
    assert results == [0, 1, 4, 9, 16]
    assert await app.client.wait_for_result(snoozed.id, timeout=1) == "woke"
    attempts = await app.client.get_attempts(snoozed.id)
    assert [a.outcome for a in attempts] == ["snoozed", "succeeded"]


async def test_queues_can_be_narrowed(memory_backend: Backend) -> None:
    app = _app(memory_backend)
    here = await app.client.enqueue(square, {"n": 3})
    there = await app.client.enqueue(snooze_once, {})
    await run_until_idle(app, queues="default")
    ran, left = await app.client.get(here.id), await app.client.get(there.id)
    assert ran is not None and ran.status is JobStatus.SUCCEEDED
    assert left is not None and left.status is JobStatus.PENDING


async def test_a_job_that_never_ends_times_out_with_a_reason(memory_backend: Backend) -> None:
    app = _app(memory_backend)
    await app.client.enqueue(forever, {})
    with pytest.raises(TimeoutError, match=r"still had jobs to run after 0.5 s"):
        await run_until_idle(app, timeout=0.5)


@actor(queue="elsewhere")
async def slow_side_effect(payload: dict[str, Any]) -> None:
    await _GO_ON[0].wait()
    _SIDE_EFFECTS.append(payload["n"])


_SIDE_EFFECTS: list[int] = []
_GO_ON: list[asyncio.Event] = []

# The timeouts of the tests that expect a job still running when they end: the
# worker's start and first dispatch took more than 0.3 s on a loaded machine, and the
# job was still pending then ("left: 1 pending", no actor to name).
_STARTED_BY = 2.0


async def test_a_timeout_cancels_the_actors_still_running(memory_backend: Backend) -> None:
    app = TaskQ("memory://", actors=[slow_side_effect], backend=memory_backend)
    await app.client.enqueue(slow_side_effect, {"n": 1})
    _GO_ON[:] = [asyncio.Event()]
    # No attempt ended (the count was read after the cancellation ended this one).
    with pytest.raises(
        TimeoutError, match=r"\(0 attempts ended; left: 1 running, of actors slow_side_effect\)"
    ):
        await run_until_idle(app, timeout=_STARTED_BY)
    _GO_ON[0].set()  # the actor's own end, had it been left running
    await asyncio.sleep(0.1)  # its wake-up, queued before this sleep's timer
    assert _SIDE_EFFECTS == []


_RELEASE = threading.Event()


@actor(queue="threads")
def blocked_in_a_thread(payload: dict[str, Any]) -> None:
    _RELEASE.wait(10)


async def test_a_timeout_names_the_sync_calls_it_cannot_stop(memory_backend: Backend) -> None:
    # A thread cannot be cancelled: it ran on after the test, unmentioned.
    app = TaskQ("memory://", actors=[blocked_in_a_thread], backend=memory_backend)
    await app.client.enqueue(blocked_in_a_thread, {})
    _RELEASE.clear()
    try:
        with pytest.raises(TimeoutError, match="1 sync actor call.s. still running in their"):
            await run_until_idle(app, timeout=_STARTED_BY)
    finally:
        _RELEASE.set()


async def test_a_timeout_names_jobs_due_later(taskq_backend: Backend) -> None:
    app = _app(taskq_backend)
    await app.client.enqueue(square, {"n": 2}, delay=timedelta(hours=1))
    with pytest.raises(TimeoutError, match="left: 1 scheduled, the first scheduled due at 20"):
        await run_until_idle(app, timeout=0.3)


@pytest.mark.parametrize("seconds", [0, -1.0, float("nan")])
async def test_a_timeout_must_be_positive(memory_backend: Backend, seconds: float) -> None:
    # NaN passed the check and hung the test: a NaN deadline stalls the loop's timers.
    with pytest.raises(ValueError, match="timeout must be positive"):
        await asyncio.wait_for(run_until_idle(_app(memory_backend), timeout=seconds), 5)


def test_a_blocked_event_loop_fails_slowly_but_never_ends_the_test_run(
    pytester: pytest.Pytester,
) -> None:
    # The watchdogs would end the process (exit 2): under pytest, the whole run.
    pytester.makepyfile(
        """
        import time

        import pytest

        from taskq import TaskQ, actor
        from taskq_testing import run_until_idle


        @actor()
        async def blocks(payload: dict) -> str:
            time.sleep(2.5)  # blocks the loop past the lag budget (half the 1 s lease)
            return "done"


        @pytest.mark.asyncio
        async def test_blocking(memory_backend):
            app = TaskQ("memory://", actors=[blocks], backend=memory_backend)
            job = await app.client.enqueue(blocks, {})
            await run_until_idle(app)
            assert await app.client.wait_for_result(job.id, timeout=1) == "done"
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q")
    result.assert_outcomes(passed=1)


def test_the_test_settings_keep_the_lease_above_four_heartbeats() -> None:
    # architecture.md, Key Invariants: lock_lease >= 4 x heartbeat_interval.
    from taskq.settings import WorkerSettings

    settings = WorkerSettings.load(dict(TEST_SETTINGS), env={})
    assert settings.lock_lease >= 4 * settings.heartbeat_interval


async def test_the_memory_fixture_is_an_open_backend_of_its_own(memory_backend: Backend) -> None:
    assert isinstance(memory_backend, InMemoryBackend)
    assert await memory_backend.count_active_jobs(["default"]) == 0


def test_the_postgres_fixtures_say_what_to_install_when_the_driver_is_missing(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(
        """
        import sys

        sys.modules["psycopg"] = None  # as if taskq-testing[postgres] were not installed
        """
    )
    pytester.makepyfile(
        """
        def test_needs_postgres(pg_backend):
            pass
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q")
    result.assert_outcomes(errors=1)
    assert "pip install 'taskq-testing[postgres]'" in result.stdout.str()


def test_tests_using_the_postgres_fixtures_can_be_deselected(pytester: pytest.Pytester) -> None:
    # Without a server at hand, a user's unit tests ran into the Postgres ones' errors.
    pytester.makepyfile(
        """
        def test_on_both(taskq_backend):
            pass

        def test_on_postgres(pg_schema):
            pass

        def test_in_memory(memory_backend):
            pass
        """
    )
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-q", "--strict-markers", "-m", "not taskq_postgres"
    )
    result.assert_outcomes(passed=2, deselected=2)
    result.stdout.fnmatch_lines(["*2 passed, 2 deselected*"])
    listed = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-q", "--co", "-m", "taskq_postgres"
    )
    listed.stdout.fnmatch_lines(
        ["*test_on_both?postgres?", "*test_on_postgres", "*2/4 tests collected (2 deselected)*"]
    )


@actor(name="stuck_behind_a_backlog", queue="stuck")
async def stuck(payload: dict[str, Any]) -> None:
    await asyncio.sleep(30)


async def test_jobs_left_are_counted_whatever_the_backlog_of_other_queues() -> None:
    # Read across every queue (the first 1,000 active jobs), a backlog elsewhere hid
    # them: "left: none".
    from taskq.models import EnqueueArgs

    tq = TaskQ("memory://", actors=[stuck])
    async with tq:
        await tq.backend.enqueue_batch(
            [EnqueueArgs(actor="other", queue="q2") for _ in range(1100)]
        )
        await tq.client.enqueue(stuck, {})
        with pytest.raises(
            TimeoutError, match=r"left: 1 running, of actors stuck_behind_a_backlog"
        ):
            await run_until_idle(tq, queues=["stuck"], timeout=_STARTED_BY)


_SWALLOWED_ENOUGH = threading.Event()


@actor(name="swallows_its_cancellation", queue="default")
async def swallows(payload: dict[str, Any]) -> None:
    # Until the test has its error (a fixed 5.5 s could end inside the 5 s that
    # run_until_idle waits for cancelled actors, when its timeout fired late).
    while not _SWALLOWED_ENOUGH.is_set():
        try:
            await asyncio.sleep(0.05)
        except asyncio.CancelledError:
            continue


async def test_an_actor_that_swallows_its_cancellation_is_named_in_the_timeout() -> None:
    # The error said only "left: 1 running"; the test then hung at its loop's end.
    tq = TaskQ("memory://", actors=[swallows])
    _SWALLOWED_ENOUGH.clear()
    async with tq:
        await tq.client.enqueue(swallows, {})
        try:
            with pytest.raises(
                TimeoutError, match=r"1 async actor\(s\) still running, having swallowed"
            ):
                await run_until_idle(tq, timeout=_STARTED_BY)
        finally:
            _SWALLOWED_ENOUGH.set()
