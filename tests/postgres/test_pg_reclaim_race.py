"""A terminal write and a reclaim of the same job racing: exactly one wins.

The regression peers had: a rescuer overwriting a job that completed in the
meantime. Here both writers are guarded (status and owner), so the loser's
statement matches no row and changes nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any
from uuid import UUID, uuid4

import asyncpg
import pytest

from taskq import EnqueueArgs, JobRow, JobStatus
from taskq.models import SuccessWrite
from taskq_postgres import PostgresBackend
from taskq_testing.postgres import PgSchema

pytestmark = pytest.mark.postgres


@pytest.fixture
async def backend(pg_pooled_schema: PgSchema) -> AsyncIterator[PostgresBackend]:
    backend = PostgresBackend(pg_pooled_schema.dsn, schema=pg_pooled_schema.name, max_pool_size=8)
    await backend.open()
    yield backend
    await backend.close()


async def _expired_leases(backend: PostgresBackend, rounds: int = 40) -> tuple[UUID, list[JobRow]]:
    """``rounds`` one-attempt jobs of one worker whose leases have all expired: both
    the owner's write and the reclaim sweep are now eligible."""
    worker = uuid4()
    for i in range(rounds):
        await backend.enqueue(EnqueueArgs(actor="race", queue=f"q{i}", max_attempts=1))
    jobs = []
    for i in range(rounds):
        (job,) = await backend.dispatch_batch(worker, [f"q{i}"], 1, timedelta(milliseconds=50))
        jobs.append(job)
    await asyncio.sleep(0.1)
    return worker, jobs


async def test_completion_and_reclaim_never_both_win(backend: PostgresBackend) -> None:
    worker, jobs = await _expired_leases(backend)
    rounds = len(jobs)

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


async def test_list_completion_and_reclaim_never_both_win(backend: PostgresBackend) -> None:
    """The batched success (the worker's completer) against the reclaim sweep, row by row."""
    worker, jobs = await _expired_leases(backend)
    rounds = len(jobs)
    writes = [SuccessWrite(job_id=job.id, attempt=job.attempt, result={"ok": True}) for job in jobs]
    reclaimed, flags = await asyncio.gather(
        backend.reclaim_expired_locks(timedelta(0), timedelta(0)),
        backend.mark_succeeded_many(worker, writes),
    )
    assert reclaimed + sum(flags) == rounds
    for job, won in zip(jobs, flags, strict=True):
        row = await backend.get(job.id)
        attempts = await backend.get_attempts(job.id)
        assert row is not None and len(attempts) == 1
        expected = JobStatus.SUCCEEDED if won else JobStatus.CRASHED
        assert row.status is expected and attempts[0].outcome == expected.value


async def _waiting_list_writes(conn: asyncpg.Connection[Any]) -> int:
    """Batched success statements of this database waiting for a row lock."""
    # In a transaction, the activity view would be read from one cached snapshot.
    await conn.execute("SELECT pg_stat_clear_snapshot()")
    count: int = await conn.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
        "AND query LIKE '%MARK_SUCCEEDED for a list%' AND datname = current_database()"
    )
    return count


async def test_list_completion_rechecks_a_row_changed_while_it_waited(
    backend: PostgresBackend, pg_pooled_schema: PgSchema
) -> None:
    """A success list meeting a row another transaction holds waits for it, then judges
    the row as that transaction left it: here reclaimed and dispatched to another
    worker meanwhile, so that job is not ours to finish and the rest of the list is."""
    worker, other = uuid4(), uuid4()
    for _ in range(2):
        await backend.enqueue(EnqueueArgs(actor="race"))
    taken, kept = await backend.dispatch_batch(worker, ["default"], 2, timedelta(minutes=1))
    schema = pg_pooled_schema.name
    rival = await asyncpg.connect(pg_pooled_schema.dsn)
    try:
        transaction = rival.transaction()
        await transaction.start()
        await rival.execute(
            f"UPDATE {schema}.jobs SET attempt = attempt + 1, locked_by_worker = $2 WHERE id = $1",
            taken.id,
            other,
        )
        writes = [SuccessWrite(job_id=job.id, attempt=job.attempt) for job in (taken, kept)]
        completing = asyncio.create_task(backend.mark_succeeded_many(worker, writes))
        async with asyncio.timeout(10):
            while not await _waiting_list_writes(rival):
                assert not completing.done()
                await asyncio.sleep(0.01)
        await transaction.commit()
        assert await completing == [False, True]
    finally:
        await rival.close()
    taken_row, kept_row = await backend.get(taken.id), await backend.get(kept.id)
    assert taken_row is not None and kept_row is not None
    assert taken_row.status is JobStatus.RUNNING and taken_row.locked_by_worker == other
    assert kept_row.status is JobStatus.SUCCEEDED
    assert await backend.get_attempts(taken.id) == []
    assert [a.outcome for a in await backend.get_attempts(kept.id)] == ["succeeded"]


async def test_progress_waiting_on_a_reclaim_does_not_land_on_the_reclaimed_job(
    backend: PostgresBackend, pg_pooled_schema: PgSchema
) -> None:
    # The ownership check read the row unlocked: a progress write that waited for the
    # row while a reclaim committed wrote a dead worker's progress on a crashed job,
    # and told it that it still owned the job.
    worker, [job] = await _expired_leases(backend, rounds=1)
    sweeper = await asyncpg.connect(pg_pooled_schema.dsn)
    try:
        reclaim = sweeper.transaction()
        await reclaim.start()
        moved = await sweeper.fetchrow(
            backend._sql.reclaim_expired_locks, timedelta(0), None, None, 10
        )
        assert moved is not None and moved["changed"] == 1
        writing = asyncio.create_task(
            backend.record_progress(job.id, worker, 9, {"step": 9}, attempt=job.attempt)
        )
        await asyncio.sleep(0.3)  # it has its snapshot and waits for the row
        assert not writing.done()
        await reclaim.commit()
        assert await asyncio.wait_for(writing, 10) is False
    finally:
        await sweeper.close()
    after = await backend.get(job.id)
    assert after is not None and after.status is JobStatus.CRASHED
    assert after.progress_seq == 0 and after.progress_state is None
