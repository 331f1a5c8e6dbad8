"""Sub-jobs, written with the parent's success (one transaction on Postgres): one refused
(a singleton's taken identity, an actor past max_pending) fails that attempt, retried as
any failure is, and nothing is written."""

from __future__ import annotations

from datetime import timedelta
from typing import Any
from uuid import uuid4

import pytest

from taskq import Context, JobStatus, TaskQ, actor
from taskq.backend.memory import InMemoryBackend
from taskq.retry import FixedBackoff
from taskq_testing import run_until_idle

pytestmark = pytest.mark.postgres


@actor(name="subjobs.child")
async def child(payload: dict[str, Any]) -> None:
    return None


@actor(name="subjobs.parent", max_attempts=2, retry_backoff=FixedBackoff(timedelta(0)))
async def parent(payload: dict[str, Any], ctx: Context) -> str:
    ctx.enqueue(child, {}, singleton=True, identity_key="only-one")
    return "done"


async def test_a_refused_singleton_sub_job_fails_the_attempt_not_the_job(
    taskq_backend: Any,
) -> None:
    # It failed the parent for good, as an outcome that could not be recorded (Postgres);
    # in memory the parent succeeded and its sub-job was lost.
    tq = TaskQ("memory://", actors=[parent, child], backend=taskq_backend)
    async with tq:
        # The singleton's identity is taken, by a job on a queue no worker here serves.
        taken = await tq.client.enqueue(
            child, {}, singleton=True, identity_key="only-one", queue="elsewhere"
        )
        job = await tq.client.enqueue(parent, {})
        await run_until_idle(tq)
        row = await tq.client.get(job.id)
        attempts = await tq.client.get_attempts(job.id)
        children = await tq.client.list_jobs(actor="subjobs.child")
    assert row is not None and row.status is JobStatus.FAILED and row.error is not None
    assert row.error.error_class == "taskq.errors.SingletonCollisionError"
    assert [a.outcome for a in attempts] == ["failed", "failed"]  # retried, as failures are
    assert [c.id for c in children] == [taken.id]  # nothing written with the failures


@actor(name="subjobs.bounded", max_pending=2)
async def bounded(payload: dict[str, Any]) -> None:
    return None


@actor(name="subjobs.producer", max_attempts=1)
async def producer(payload: dict[str, Any], ctx: Context) -> None:
    for _ in range(payload["n"]):
        ctx.enqueue(bounded, {}, queue="elsewhere")


@pytest.mark.parametrize("n", [2, 3])
async def test_sub_jobs_past_max_pending_are_refused_as_an_enqueue_would_be(
    taskq_backend: Any, n: int
) -> None:
    # They went in unchecked: a parent enqueueing 12 left 17 waiting against 5.
    from taskq.errors import MaxPendingExceededError

    tq = TaskQ("memory://", actors=[producer, bounded], backend=taskq_backend)
    async with tq:
        job = await tq.client.enqueue(producer, {"n": n})
        await run_until_idle(tq)
        row = await tq.client.get(job.id)
        waiting = await tq.client.list_jobs(actor="subjobs.bounded")
    assert row is not None
    if n == 2:
        assert row.status is JobStatus.SUCCEEDED and len(waiting) == 2
    else:
        assert row.status is JobStatus.FAILED and row.error is not None
        assert row.error.error_class == f"taskq.errors.{MaxPendingExceededError.__name__}"
        assert "already has 0 waiting jobs and this call adds 3 (max_pending=2)" in (
            row.error.message
        )
        assert waiting == []


@actor(name="subjobs.refresh", max_pending=1, queue="elsewhere")
async def refresh(payload: dict[str, Any]) -> None:
    return None


@actor(name="subjobs.fan_in", max_attempts=3)
async def fan_in(payload: dict[str, Any], ctx: Context) -> str:
    ctx.enqueue(refresh, {}, idempotency_key="refresh-cache")
    return "done"


async def test_a_sub_job_whose_key_is_stored_does_not_count_against_max_pending() -> None:
    # As a client's enqueue past max_pending gets the stored job back: the parent was
    # refused on every attempt, and failed.
    tq = TaskQ("memory://", actors=[fan_in, refresh])
    async with tq:
        stored = await tq.client.enqueue(refresh, {}, idempotency_key="refresh-cache")
        job = await tq.client.enqueue(fan_in, {})
        await run_until_idle(tq, queues=["default"])
        row = await tq.client.get(job.id)
        waiting = await tq.client.list_jobs(actor="subjobs.refresh")
    assert row is not None and (row.status, row.result) == (JobStatus.SUCCEEDED, "done")
    assert [w.id for w in waiting] == [stored.id]


class _CountBlips(InMemoryBackend):
    """``count_pending_jobs`` fails once, as a database away for a moment."""

    blips = 1

    async def count_pending_jobs(self, *args: Any, **kwargs: Any) -> Any:
        if self.blips:
            self.blips -= 1
            raise ConnectionRefusedError("database away for a moment")
        return await super().count_pending_jobs(*args, **kwargs)


async def test_a_blip_in_the_sub_jobs_capacity_check_is_retried() -> None:
    # It failed the parent for good, as an outcome that could not be recorded.
    backend = _CountBlips()
    tq = TaskQ("memory://", actors=[producer, bounded], backend=backend)
    async with tq:
        job = await tq.client.enqueue(producer, {"n": 1})
        await run_until_idle(tq)
        row = await tq.client.get(job.id)
    assert backend.blips == 0
    assert row is not None and row.status is JobStatus.SUCCEEDED


CHAIN: list[int] = []


@actor(name="subjobs.tick", max_attempts=1)
async def tick(payload: dict[str, Any], ctx: Context) -> None:
    CHAIN.append(payload["n"])
    if payload["n"] < 3:
        ctx.enqueue(tick, {"n": payload["n"] + 1}, singleton=True, identity_key="tick")


async def test_a_singleton_enqueueing_its_own_next_run_is_no_collision(
    taskq_backend: Any,
) -> None:
    # Its success frees the identity before the sub-job is written (one transaction on
    # Postgres): the in-memory check first refused it, the parent still holding it.
    CHAIN.clear()
    tq = TaskQ("memory://", actors=[tick], backend=taskq_backend)
    async with tq:
        await tq.client.enqueue(tick, {"n": 1}, singleton=True, identity_key="tick")
        await run_until_idle(tq)
        rows = await tq.client.list_jobs(actor="subjobs.tick")
    assert CHAIN == [1, 2, 3]
    assert [r.status for r in rows] == [JobStatus.SUCCEEDED] * 3


@actor(name="subjobs.fan_out", max_attempts=1)
async def fan_out(payload: dict[str, Any], ctx: Context) -> None:
    for n in range(payload["n"]):
        ctx.enqueue(child, {"n": n}, queue="fifo-children")


async def test_a_jobs_sub_jobs_run_in_the_order_enqueued_on_a_fifo_queue(
    taskq_backend: Any,
) -> None:
    # Written together, they share their enqueue time and the dispatch breaks the tie by
    # id: with random ids they ran shuffled (about half their pairs out of order).
    tq = TaskQ("memory://", actors=[fan_out, child], backend=taskq_backend)
    async with tq:
        job = await tq.client.enqueue(fan_out, {"n": 40})
        await run_until_idle(tq)
        assert (row := await tq.client.get(job.id)) is not None
        assert row.status is JobStatus.SUCCEEDED
        taken = await taskq_backend.dispatch_batch(
            uuid4(), ["fifo-children"], 40, timedelta(minutes=5)
        )
    assert [t.payload.get("n") for t in taken] == list(range(40))
