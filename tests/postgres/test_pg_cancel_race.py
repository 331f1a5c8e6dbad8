"""A cancel request that waits on the row lock of a concurrent status change acts on the
status that change committed, not on the one its statement's snapshot saw."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta
from uuid import uuid4

import asyncpg
import pytest

from taskq import EnqueueArgs, JobStatus
from taskq_postgres import PostgresBackend
from taskq_testing.postgres import PgSchema

pytestmark = pytest.mark.postgres


@pytest.fixture
async def backend(pg_pooled_schema: PgSchema) -> AsyncIterator[PostgresBackend]:
    backend = PostgresBackend(pg_pooled_schema.dsn, schema=pg_pooled_schema.name)
    await backend.open()
    yield backend
    await backend.close()


async def _blocked_on_a_lock(conn: asyncpg.Connection) -> None:
    for _ in range(500):
        # In a transaction the activity view is read once: read it afresh each time.
        await conn.execute("SELECT pg_stat_clear_snapshot()")
        waiting = await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE wait_event_type = 'Lock' AND application_name LIKE 'taskq-pool/%'"
            " AND datname = current_database()"
        )
        if waiting:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the cancel never waited for the row lock")


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        pytest.param(
            "status = 'running', attempt = 1, locked_by_worker = gen_random_uuid(),"
            " lock_expires_at = now() + interval '30 s', started_at = now()",
            (JobStatus.RUNNING, 1),
            id="dispatched-meanwhile",
        ),
        pytest.param(
            "status = 'scheduled', scheduled_at = now() + interval '1 h',"
            " locked_by_worker = NULL, lock_expires_at = NULL",
            (JobStatus.CANCELLED, 0),
            id="snoozed-meanwhile",
        ),
    ],
)
async def test_a_cancel_behind_a_status_change_acts_on_the_committed_status(
    backend: PostgresBackend,
    pg_pooled_schema: PgSchema,
    change: str,
    expected: tuple[JobStatus, int],
) -> None:
    job = await backend.enqueue(EnqueueArgs(actor="race"))
    if "scheduled" in change:  # a snooze changes a running job
        [job] = await backend.dispatch_batch(uuid4(), ["default"], 1, timedelta(seconds=30))
    conn = await asyncpg.connect(pg_pooled_schema.dsn)
    try:
        tx = conn.transaction()
        await tx.start()
        await conn.execute(
            f"UPDATE {pg_pooled_schema.name}.jobs SET {change} WHERE id = $1", job.id
        )
        cancel = asyncio.ensure_future(backend.write_cancel_request(job.id, "stop"))
        await _blocked_on_a_lock(conn)
        await tx.commit()
        # The job was live all along: the request is taken, never "already finished".
        assert await cancel
    finally:
        await conn.close()
    row = await backend.get(job.id)
    assert row is not None
    assert (row.status, row.cancel_phase) == expected
    assert row.cancel_reason == "stop"


async def test_a_cancel_postgres_breaks_out_of_a_deadlock_is_tried_again(
    backend: PostgresBackend, pg_pooled_schema: PgSchema
) -> None:
    # Operators' cancels against a worker's writes, each locking rows in its own order:
    # Postgres broke the deadlock by failing the cancel, whose caller got the driver's
    # DeadlockDetectedError.
    from taskq import JobFilter

    first, second = sorted(
        await backend.enqueue_batch([EnqueueArgs(actor="a"), EnqueueArgs(actor="a")]),
        key=lambda row: row.id,
    )
    jobs = f"{pg_pooled_schema.name}.jobs"
    rival: asyncpg.Connection = await asyncpg.connect(pg_pooled_schema.dsn)
    try:
        # The cancel's session detects the deadlock first (a second), and fails.
        await rival.execute("SET deadlock_timeout = '20s'")
        await rival.execute("BEGIN")
        await rival.execute(f"SELECT 1 FROM {jobs} WHERE id = $1 FOR UPDATE", second.id)
        cancel = asyncio.create_task(backend.cancel_where(JobFilter(actor="a"), "operator"))
        for _ in range(500):  # the cancel holds the first row and waits for the second
            await rival.execute("SELECT pg_stat_clear_snapshot()")
            if await rival.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND query LIKE $1",
                f"%{jobs}%FOR UPDATE OF j%",
            ):
                break
            await asyncio.sleep(0.01)
        await rival.execute(f"SELECT 1 FROM {jobs} WHERE id = $1 FOR UPDATE", first.id)
        await rival.execute("COMMIT")
        result = await asyncio.wait_for(cancel, 10)
    finally:
        await rival.close()
    assert sorted(result.cancelled) == [first.id, second.id]
