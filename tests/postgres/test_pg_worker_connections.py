"""A worker's dispatches and batched successes each keep a pooled connection checked
out (pinned), as one-job enqueues do, where the pool can spare them."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from uuid import uuid4

import pytest

from taskq import EnqueueArgs
from taskq.models import SuccessWrite
from taskq_postgres import PostgresBackend
from taskq_testing.postgres import PgSchema

pytestmark = pytest.mark.postgres

LEASE = timedelta(minutes=1)


async def _held_by(backend: PostgresBackend, rounds: int) -> int:
    """How many more pool connections stay checked out after ``rounds`` dispatches
    and successes (the enqueue before them may pin its own)."""
    worker = uuid4()
    await backend.enqueue_batch([EnqueueArgs(actor="a") for _ in range(rounds)])
    idle = _idle(backend)
    for _ in range(rounds):
        (job,) = await backend.dispatch_batch(worker, ["default"], 1, LEASE)
        write = SuccessWrite(job_id=job.id, attempt=job.attempt)
        assert await backend.mark_succeeded_many(worker, [write]) == [True]
    return idle - _idle(backend)


def _backend(schema: PgSchema, *, pool_size: int) -> PostgresBackend:
    return PostgresBackend(
        schema.dsn, schema=schema.name, min_pool_size=pool_size, max_pool_size=pool_size
    )


def _idle(backend: PostgresBackend) -> int:
    return backend._require_pool().get_idle_size()


async def test_dispatch_and_success_each_keep_one_connection(pg_pooled_schema: PgSchema) -> None:
    backend = _backend(pg_pooled_schema, pool_size=5)
    await backend.open()
    try:
        assert await _held_by(backend, 3) == 2  # one for dispatches, one for successes
    finally:
        await asyncio.wait_for(backend.close(), 10)  # would wait forever on a held one
    await backend.open()  # and pins anew
    try:
        assert await _held_by(backend, 2) == 2
    finally:
        await asyncio.wait_for(backend.close(), 10)


async def test_a_small_pool_keeps_its_connections_for_everything_else(
    pg_pooled_schema: PgSchema,
) -> None:
    backend = _backend(pg_pooled_schema, pool_size=4)
    await backend.open()
    try:
        assert await _held_by(backend, 2) == 0
    finally:
        await asyncio.wait_for(backend.close(), 10)


async def test_a_credential_reload_replaces_the_pinned_connections(
    pg_pooled_schema: PgSchema,
) -> None:
    backend = _backend(pg_pooled_schema, pool_size=5)

    async def sessions() -> set[int]:
        """The sessions whose last statement was a dispatch or a batched success."""
        async with backend.connection() as conn:
            records = await conn.fetch(
                "SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND pid <> pg_backend_pid() "
                "AND (query LIKE '%plain head only%' OR query LIKE '%MARK_SUCCEEDED for a list%')",
                f"taskq-pool/{backend.instance_id}",
            )
        return {r["pid"] for r in records}

    await backend.open()
    try:
        await _held_by(backend, 2)
        before = await sessions()
        assert len(before) == 2
        await backend.reload_credentials()
        await _held_by(backend, 2)
        # The replaced sessions end a moment after their connections close.
        async with asyncio.timeout(10):
            while (after := await sessions()) & before:  # noqa: ASYNC110 - the server's view
                await asyncio.sleep(0.05)
        assert len(after) == 2
    finally:
        await asyncio.wait_for(backend.close(), 10)
