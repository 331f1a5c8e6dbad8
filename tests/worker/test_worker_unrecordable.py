"""An outcome the backend cannot record ends the job failed, saying why: it must not run
again and again (handed back unstarted, never spending an attempt), nor take down the
other jobs whose successes share its write."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from taskq import Context, TaskQ, actor
from taskq.backend import Backend
from taskq.models import JobStatus
from taskq_testing import run_until_idle


@actor(name="unrecordable.nan_result", max_attempts=3)
async def nan_result(payload: dict[str, Any]) -> dict[str, float]:
    return {"x": float("nan")}  # JSON has no NaN: no backend stores it


@actor(name="unrecordable.fine")
async def fine(payload: dict[str, Any]) -> int:
    return 1


def _broken_backoff(attempt: int) -> timedelta:
    raise RuntimeError("a bug in the backoff")


@actor(name="unrecordable.bad_backoff", max_attempts=3, retry_backoff=_broken_backoff)
async def bad_backoff(payload: dict[str, Any]) -> None:
    raise ValueError("the actor's own failure")


@actor(name="unrecordable.odd_message", max_attempts=1)
async def odd_message(payload: dict[str, Any]) -> None:
    # A lone surrogate cannot travel in a payload (JSON): the message is made here.
    raise ValueError({"nul": "nul\x00byte", "surrogate": "lone \udc80 surrogate"}[payload["kind"]])


def _app(backend: Backend) -> TaskQ:
    return TaskQ("memory://", actors=[nan_result, fine, bad_backoff, odd_message], backend=backend)


async def _ended_failed_once(tq: TaskQ, job_id: Any, cause: str) -> None:
    row = await tq.client.get(job_id)
    assert row is not None and row.status is JobStatus.FAILED, row
    assert row.attempt == 1  # no reruns
    assert row.error is not None and row.error.error_class.endswith("OutcomeNotRecorded")
    assert cause in row.error.message


async def test_a_backoff_that_raises_fails_the_job(taskq_backend: Backend) -> None:
    tq = _app(taskq_backend)
    job = await tq.client.enqueue(bad_backoff, {})
    await run_until_idle(tq, timeout=20)
    await _ended_failed_once(tq, job.id, "a bug in the backoff")


async def test_values_json_cannot_hold_fail_their_job_alone(taskq_backend: Backend) -> None:
    tq = _app(taskq_backend)
    bad = await tq.client.enqueue(nan_result, {})
    good = [await tq.client.enqueue(fine, {}) for _ in range(20)]
    # Concurrency 16: the good successes share batched writes with the bad one.
    await run_until_idle(tq, timeout=20, concurrency=16)
    await _ended_failed_once(tq, bad.id, "NaN is not a JSON number")
    rows = [await tq.client.get(job.id) for job in good]
    assert all(r is not None and r.status is JobStatus.SUCCEEDED for r in rows)


@actor(name="unrecordable.changes_its_progress")
async def changes_its_progress(payload: dict[str, Any], ctx: Context) -> int:
    state: dict[str, Any] = {"done": [1]}
    await ctx.progress(state)
    state["done"].append(float("nan"))  # changed after it was reported: not its progress
    return 1


async def test_progress_is_what_was_reported_not_what_the_actor_changed_since(
    taskq_backend: Backend,
) -> None:
    # The success stored the actor's dict as it was by then: a NaN put in later failed
    # the job for good on Postgres.
    tq = TaskQ("memory://", actors=[changes_its_progress], backend=taskq_backend)
    job = await tq.client.enqueue(changes_its_progress, {})
    await run_until_idle(tq, timeout=20)
    row = await tq.client.get(job.id)
    assert row is not None and row.status is JobStatus.SUCCEEDED
    assert row.progress_state == {"done": [1]}


@pytest.mark.parametrize("kind", ["nul", "surrogate"])
async def test_a_failure_whose_message_is_stored_cleaned_is_the_workers_own(
    taskq_backend: Backend, kind: str
) -> None:
    # The worker compared the row it wrote with the error it sent, not with the error as
    # stored (U+FFFD in place of the NUL): its own write looked like another's, it
    # recorded a late outcome and skipped the batch's failure hook.
    tq = _app(taskq_backend)
    job = await tq.client.enqueue(odd_message, {"kind": kind})
    await run_until_idle(tq, timeout=20)
    row = await tq.client.get(job.id)
    assert row is not None and row.status is JobStatus.FAILED
    assert row.error is not None and "\ufffd" in row.error.message
    assert [e.kind for e in await tq.client.get_events(job.id) if e.kind == "late_outcome"] == []


class _UnprintableError(Exception):
    def __str__(self) -> str:
        raise AttributeError("a bug in the exception's own __str__")


@actor(name="unrecordable.unprintable", max_attempts=2, retry_backoff=lambda attempt: 0)
async def unprintable(payload: dict[str, Any]) -> None:
    raise _UnprintableError


async def test_an_error_whose_str_raises_is_retried_and_named(taskq_backend: Backend) -> None:
    # Its message could not be read: the job failed at its first attempt, as an outcome
    # that could not be recorded, its attempts left unused and its error class lost.
    tq = TaskQ("memory://", actors=[unprintable], backend=taskq_backend)
    job = await tq.client.enqueue(unprintable, {})
    await run_until_idle(tq, timeout=20)
    row = await tq.client.get(job.id)
    assert row is not None and row.status is JobStatus.FAILED and row.attempt == 2
    attempts = await tq.client.get_attempts(job.id)
    assert [(a.outcome, a.error and a.error.error_class) for a in attempts] == [
        ("failed", f"{__name__}._UnprintableError"),
        ("failed", f"{__name__}._UnprintableError"),
    ]
    assert row.error is not None and row.error.message == (
        "<exception str() failed: AttributeError>"
    )
