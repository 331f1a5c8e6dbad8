"""An actor that fails without having looked at a pending user's cancel failed on its
own: its attempt is recorded failed, with its error, and the job still ends cancelled.
One that fails so during a stop is handed back (ADR 0004), its error logged."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import structlog.testing

from taskq import FixedBackoff, JobStatus, TaskQ, actor
from taskq_testing import TEST_SETTINGS, run_until_idle
from tests.worker.running import running


def _failing(started: asyncio.Event) -> Any:
    @actor(name="fails_late", max_attempts=3, retry_backoff=FixedBackoff(timedelta(0)))
    async def fails_late(payload: dict[str, Any]) -> None:
        started.set()
        await asyncio.sleep(1.5)  # never looking at its cancel_event (asked within it)
        raise RuntimeError("raised on its own")

    return fails_late


async def test_a_cancelled_actor_that_raised_without_looking_keeps_its_error() -> None:
    # The attempt read cancelled, with no error: the actor's own exception was nowhere.
    started = asyncio.Event()
    fails_late = _failing(started)
    tq = TaskQ("memory://", actors=[fails_late])
    async with tq:
        job = await tq.client.enqueue(fails_late, {})
        runner = asyncio.create_task(run_until_idle(tq, cancellation_grace_period="10s"))
        await asyncio.wait_for(started.wait(), 5)
        assert await tq.client.cancel(job.id)
        await asyncio.wait_for(runner, 10)
        row = await tq.client.get(job.id)
        [attempt] = await tq.client.get_attempts(job.id)
    assert row is not None and row.status is JobStatus.CANCELLED
    assert attempt.outcome == "failed"
    assert attempt.error is not None and attempt.error.message == "raised on its own"


async def test_an_actor_that_raised_during_a_stop_is_handed_back_and_its_error_logged() -> None:
    # A stop's error may be the stop's own (a SIGTERM that reached a child process):
    # handed back with its attempt given back (ADR 0004), but its error is said.
    started = asyncio.Event()
    fails_late = _failing(started)
    tq = TaskQ("memory://", actors=[fails_late])
    graces = {"drain_grace_period": "50ms", "cancellation_grace_period": "10s"}
    async with tq:
        job = await tq.client.enqueue(fails_late, {})
        with structlog.testing.capture_logs() as logs:
            async with running(tq, {**TEST_SETTINGS, **graces}):
                await asyncio.wait_for(started.wait(), 5)
        row = await tq.client.get(job.id)
        [attempt] = await tq.client.get_attempts(job.id)
    assert row is not None and row.status is JobStatus.PENDING
    assert (row.attempt, row.max_attempts, attempt.outcome) == (1, 4, "interrupted")
    [said] = [log for log in logs if log["event"] == "taskq.job-raised-during-stop"]
    assert "raised on its own" in said["error"]
