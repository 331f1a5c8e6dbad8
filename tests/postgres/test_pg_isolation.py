"""Two TaskQ schemas in one database share nothing: not jobs, not wake-ups."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta
from uuid import uuid4

import pytest
import pytest_asyncio

from taskq.models import EnqueueArgs, JobFilter
from taskq_postgres import PostgresBackend
from taskq_testing.postgres import PgSchema

pytestmark = pytest.mark.postgres

LEASE = timedelta(minutes=5)
QUIET_S = 0.3
"""How long a wake that must not come is waited for."""


@pytest_asyncio.fixture
async def pair(
    pg_schema: PgSchema, pg_pooled_schema: PgSchema
) -> AsyncIterator[tuple[PostgresBackend, PostgresBackend]]:
    assert pg_schema.dsn == pg_pooled_schema.dsn and pg_schema.name != pg_pooled_schema.name
    first = PostgresBackend(pg_schema.dsn, schema=pg_schema.name)
    second = PostgresBackend(pg_pooled_schema.dsn, schema=pg_pooled_schema.name)
    await first.open()
    await second.open()
    yield first, second
    await first.close()
    await second.close()


async def test_jobs_stay_in_their_schema(pair: tuple[PostgresBackend, PostgresBackend]) -> None:
    first, second = pair
    shared = EnqueueArgs(actor="a", queue="q", idempotency_key="k")
    job = await first.enqueue(shared)
    # The same id and key are free in the other schema.
    twin = await second.enqueue(shared)
    assert (twin.id, twin.created_at != job.created_at) == (job.id, True)
    assert (await second.cancel_where(JobFilter(), "only mine")).cancelled == [twin.id]
    assert (await first.get(job.id)) == job
    assert await second.dispatch_batch(uuid4(), ["q"], 10, LEASE) == []
    assert await first.count_active_jobs(["q"]) == 1
    assert await second.count_active_jobs(["q"]) == 0
    [dispatched] = await first.dispatch_batch(uuid4(), ["q"], 10, LEASE)
    assert dispatched.id == job.id


async def test_a_wake_in_one_schema_does_not_wake_the_other(
    pair: tuple[PostgresBackend, PostgresBackend],
) -> None:
    first, second = pair
    async with first.subscribe_wake() as woken_first, second.subscribe_wake() as woken_second:
        await first.enqueue(EnqueueArgs(actor="a"))
        await asyncio.wait_for(woken_first.wait(), 5)
        await asyncio.sleep(QUIET_S)
        assert not woken_second.is_set()
        woken_first.clear()
        await second.enqueue(EnqueueArgs(actor="a"))
        await asyncio.wait_for(woken_second.wait(), 5)
        await asyncio.sleep(QUIET_S)
        assert not woken_first.is_set()


async def test_a_cancel_in_one_schema_does_not_wake_the_other(
    pair: tuple[PostgresBackend, PostgresBackend],
) -> None:
    first, second = pair
    await first.enqueue(EnqueueArgs(actor="a", queue="c"))
    [job] = await first.dispatch_batch(uuid4(), ["c"], 1, LEASE)
    async with first.subscribe_cancel_wake() as mine, second.subscribe_cancel_wake() as theirs:
        assert await first.write_cancel_request(job.id, None)
        await asyncio.wait_for(mine.wait(), 5)
        await asyncio.sleep(QUIET_S)
        assert not theirs.is_set()
