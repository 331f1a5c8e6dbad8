"""Sub-jobs on Postgres, written in the parent's success transaction: one the backend
refuses fails that attempt, retried as any failure is."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from taskq import Context, JobStatus, TaskQ, actor
from taskq.retry import FixedBackoff
from taskq_testing import run_until_idle
from taskq_testing.postgres import PgSchema

pytestmark = pytest.mark.postgres


@actor(name="subjobs.child")
async def child(payload: dict[str, Any]) -> None:
    return None


@actor(name="subjobs.parent", max_attempts=2, retry_backoff=FixedBackoff(timedelta(0)))
async def parent(payload: dict[str, Any], ctx: Context) -> str:
    ctx.enqueue(child, {}, singleton=True, identity_key="only-one")
    return "done"


async def test_a_refused_singleton_sub_job_fails_the_attempt_not_the_job(
    pg_schema: PgSchema,
) -> None:
    # It failed the parent for good, as an outcome that could not be recorded.
    tq = TaskQ(pg_schema.dsn, schema=pg_schema.name, actors=[parent, child])
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
