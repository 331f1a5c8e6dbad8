"""A terminal write and a reclaim of the same job racing: exactly one wins.

The regression peers had: a rescuer overwriting a job that completed in the
meantime. Here both writers are guarded (status and owner), so the loser's
statement matches no row and changes nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta
from uuid import uuid4

import pytest

from taskq import EnqueueArgs, JobStatus
from taskq_postgres import PostgresBackend
from taskq_testing.postgres import PgSchema

pytestmark = pytest.mark.postgres


@pytest.fixture
async def backend(pg_pooled_schema: PgSchema) -> AsyncIterator[PostgresBackend]:
    backend = PostgresBackend(pg_pooled_schema.dsn, schema=pg_pooled_schema.name, max_pool_size=8)
    await backend.open()
    yield backend
    await backend.close()


async def test_completion_and_reclaim_never_both_win(backend: PostgresBackend) -> None:
    worker = uuid4()
    rounds = 40
    for i in range(rounds):
        await backend.enqueue(EnqueueArgs(actor="race", queue=f"q{i}", max_attempts=1))
    jobs = []
    for i in range(rounds):
        (job,) = await backend.dispatch_batch(worker, [f"q{i}"], 1, timedelta(milliseconds=50))
        jobs.append(job)
    await asyncio.sleep(0.1)  # every lease has expired: both writers are now eligible

    async def complete(job_id: object) -> bool:
        return await backend.mark_succeeded(job_id, worker, {"ok": True})  # type: ignore[arg-type]

    outcomes = await asyncio.gather(
        backend.reclaim_expired_locks(timedelta(0), timedelta(0)),
        *(complete(job.id) for job in jobs),
    )
    reclaimed, completed = outcomes[0], outcomes[1:]
    assert reclaimed + sum(completed) == rounds
    for job, won in zip(jobs, completed, strict=True):
        row = await backend.get(job.id)
        assert row is not None
        attempts = await backend.get_attempts(job.id)
        events = await backend.get_events(job.id)
        assert len(attempts) == 1  # one writer recorded the attempt, never both
        if won:
            assert row.status is JobStatus.SUCCEEDED and row.result == {"ok": True}
            assert attempts[0].outcome == "succeeded"
            assert not [e for e in events if e.kind == "reclaimed"]
        else:
            assert row.status is JobStatus.CRASHED and row.result is None
            assert attempts[0].outcome == "crashed"
            assert len([e for e in events if e.kind == "reclaimed"]) == 1
