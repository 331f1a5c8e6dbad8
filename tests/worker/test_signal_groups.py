"""Snooze and RetryAfter raised inside an exception group (an actor's asyncio.TaskGroup)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from datetime import timedelta
from typing import Any

import pytest

from taskq import JobRow, JobStatus, RetryAfter, Snooze, TaskQ, actor
from taskq.backend.memory import InMemoryBackend
from taskq.models import AttemptOutcome
from taskq.retry import FixedBackoff
from taskq_testing import run_until_idle


class AskedDelays(InMemoryBackend):
    """Records the delay of every snooze and retry-after the worker writes."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[tuple[str, timedelta]] = []

    async def mark_snoozed(self, job_id: Any, worker_id: Any, delay: timedelta, **kw: Any) -> Any:
        self.asked.append(("snooze", delay))
        return await super().mark_snoozed(job_id, worker_id, delay, **kw)

    async def mark_retry_after(
        self, job_id: Any, worker_id: Any, delay: timedelta, **kw: Any
    ) -> Any:
        self.asked.append(("retry_after", delay))
        return await super().mark_retry_after(job_id, worker_id, delay, **kw)


def _raises(error: BaseException) -> Callable[[], Coroutine[Any, Any, None]]:
    async def child() -> None:
        raise error

    return child


async def _in_a_task_group(errors: list[BaseException], nested: list[BaseException]) -> None:
    """Every child raises: the group holds each error (``nested`` in an inner group)."""
    async with asyncio.TaskGroup() as tg:
        for error in errors:
            tg.create_task(_raises(error)())
        if nested:
            tg.create_task(_in_a_task_group(nested, []))


async def _first_attempt_raises(
    errors: list[BaseException], nested: list[BaseException] | None = None
) -> tuple[AskedDelays, list[AttemptOutcome], JobRow | None]:
    runs: list[int] = []

    @actor(name="grouped", max_attempts=3, retry_backoff=FixedBackoff(timedelta(0)))
    async def grouped(payload: dict[str, Any]) -> str:
        runs.append(1)
        if len(runs) == 1:
            await _in_a_task_group(errors, nested or [])
        return "done"

    backend = AskedDelays()
    tq = TaskQ("memory://", actors=[grouped], backend=backend)
    async with tq:
        job = await tq.client.enqueue(grouped, {})
        await run_until_idle(tq)
        assert await tq.client.wait_for_result(job.id, timeout=1) == "done"
        outcomes = [a.outcome for a in await tq.client.get_attempts(job.id)]
        row = await tq.client.get(job.id)
    return backend, outcomes, row


def _ms(n: int) -> timedelta:
    return timedelta(milliseconds=n)


async def test_a_group_of_snoozes_snoozes_by_the_longest_delay() -> None:
    backend, outcomes, row = await _first_attempt_raises(
        [Snooze(_ms(10)), Snooze(_ms(20))], nested=[Snooze(_ms(50))]
    )
    assert backend.asked == [("snooze", _ms(50))]
    assert outcomes == ["snoozed", "succeeded"]
    assert row is not None and row.max_attempts == 3 + 1  # no attempt spent


async def test_a_group_of_retry_afters_retries_after_the_longest_delay() -> None:
    backend, outcomes, _ = await _first_attempt_raises([RetryAfter(_ms(40)), RetryAfter(_ms(10))])
    assert backend.asked == [("retry_after", _ms(40))]
    assert outcomes == ["retry_after", "succeeded"]


async def test_a_group_of_snoozes_and_retry_afters_retries_after_the_longest_of_all() -> None:
    # One part of the work failed and asked for a retry: an attempt is spent, and the
    # job comes back no sooner than every child asked.
    backend, outcomes, _ = await _first_attempt_raises([RetryAfter(_ms(10)), Snooze(_ms(30))])
    assert backend.asked == [("retry_after", _ms(30))]
    assert outcomes == ["retry_after", "succeeded"]


@pytest.mark.parametrize("nested", [False, True])
async def test_a_group_with_any_other_error_is_a_failure_of_the_groups_class(
    nested: bool,
) -> None:
    errors: list[BaseException] = [Snooze(_ms(10)), ValueError("upstream said no")]
    backend, outcomes, _ = await _first_attempt_raises(
        [errors[0]] if nested else errors, nested=[errors[1]] if nested else None
    )
    assert backend.asked == []
    assert outcomes == ["failed", "succeeded"]


async def test_a_mixed_groups_failure_is_recorded_with_the_groups_class() -> None:
    @actor(name="mixed", max_attempts=1)
    async def mixed(payload: dict[str, Any]) -> None:
        await _in_a_task_group([Snooze(_ms(10)), KeyError("k")], [])

    tq = TaskQ("memory://", actors=[mixed])
    async with tq:
        job = await tq.client.enqueue(mixed, {})
        await run_until_idle(tq)
        row = await tq.client.get(job.id)
    assert row is not None and row.status is JobStatus.FAILED
    assert row.error is not None and row.error.error_class == "ExceptionGroup"
    assert row.error.traceback is not None and "KeyError" in row.error.traceback


async def test_a_sync_actors_group_of_snoozes_snoozes() -> None:
    runs: list[int] = []

    @actor(name="grouped.sync", max_attempts=1)
    def grouped_sync(payload: dict[str, Any]) -> str:
        runs.append(1)
        if len(runs) == 1:
            raise ExceptionGroup("parts", [Snooze(_ms(5)), Snooze(_ms(15))])
        return "done"

    backend = AskedDelays()
    tq = TaskQ("memory://", actors=[grouped_sync], backend=backend)
    async with tq:
        job = await tq.client.enqueue(grouped_sync, {})
        await run_until_idle(tq)
        assert await tq.client.wait_for_result(job.id, timeout=1) == "done"
    assert backend.asked == [("snooze", _ms(15))]
