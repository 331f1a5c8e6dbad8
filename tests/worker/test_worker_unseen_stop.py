"""An actor that fails without having looked at a pending stop request (a user's
cancel, a shutdown) failed on its own: its attempt is recorded failed, with its error.
A cancelled job still ends cancelled; a shutdown's spends the attempt."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from taskq import FixedBackoff, JobStatus, TaskQ, actor
from taskq_testing import TEST_SETTINGS, run_until_idle
from tests.worker.running import running


def _failing(started: asyncio.Event) -> Any:
    @actor(name="fails_late", max_attempts=3, retry_backoff=FixedBackoff(timedelta(0)))
    async def fails_late(payload: dict[str, Any]) -> None:
        started.set()
        await asyncio.sleep(0.5)  # never looking at its cancel_event
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


async def test_an_actor_that_raised_during_a_stop_without_looking_spends_its_attempt() -> None:
    # Handed back as interrupted: the error dropped and the attempt given back
    # (max_attempts raised), so a job failing in every deploy never ran out.
    started = asyncio.Event()
    fails_late = _failing(started)
    tq = TaskQ("memory://", actors=[fails_late])
    graces = {"drain_grace_period": "50ms", "cancellation_grace_period": "10s"}
    async with tq:
        job = await tq.client.enqueue(fails_late, {})
        async with running(tq, {**TEST_SETTINGS, **graces}):
            await asyncio.wait_for(started.wait(), 5)
        row = await tq.client.get(job.id)
        [attempt] = await tq.client.get_attempts(job.id)
    assert row is not None and row.status is JobStatus.PENDING
    assert (row.attempt, row.max_attempts) == (1, 3)
    assert attempt.outcome == "failed"
    assert attempt.error is not None and attempt.error.message == "raised on its own"
