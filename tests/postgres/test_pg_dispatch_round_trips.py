"""Which statements a dispatch runs: one for a busy strict-FIFO queue, the settings
lookup only when that statement found nothing or a queue is round robin."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from uuid import uuid4

import asyncpg
import pytest

from taskq.models import EnqueueArgs, QueueConfig
from taskq_postgres import PostgresBackend
from taskq_testing.postgres import PgSchema

pytestmark = pytest.mark.postgres

LEASE = timedelta(minutes=5)


@pytest.fixture
async def backend(pg_pooled_schema: PgSchema) -> AsyncIterator[PostgresBackend]:
    backend = PostgresBackend(
        pg_pooled_schema.dsn, schema=pg_pooled_schema.name, min_pool_size=2, max_pool_size=2
    )
    await backend.open()
    yield backend
    await backend.close()


@pytest.fixture
async def statements(backend: PostgresBackend) -> list[str]:
    """The names of the dispatch statements the backend's connections run, in order."""
    names = {
        backend._sql.dispatch_strict_fifo: "strict_fifo",
        backend._sql.dispatch_round_robin: "round_robin",
        backend._sql.queue_settings: "queue_settings",
    }
    ran: list[str] = []

    def log(query: asyncpg.connection.LoggedQuery) -> None:
        if query.query in names:
            ran.append(names[query.query])

    pool = backend._require_pool()
    held = [await pool.acquire() for _ in range(2)]  # every connection of the pool
    for conn in held:
        conn.add_query_logger(log)
    for conn in held:
        await pool.release(conn)
    return ran


async def test_a_busy_strict_fifo_dispatch_is_one_statement(
    backend: PostgresBackend, statements: list[str]
) -> None:
    await backend.enqueue_batch([EnqueueArgs(actor="a") for _ in range(3)])
    assert len(await backend.dispatch_batch(uuid4(), ["default"], 2, LEASE)) == 2
    assert statements == ["strict_fifo"]
    statements.clear()
    assert len(await backend.dispatch_batch(uuid4(), ["default"], 2, LEASE)) == 1
    assert statements == ["strict_fifo"]
    statements.clear()
    # Nothing due: the settings tell whether a round-robin queue held it back.
    assert await backend.dispatch_batch(uuid4(), ["default"], 2, LEASE) == []
    assert statements == ["strict_fifo", "queue_settings"]


async def test_a_round_robin_queue_is_dispatched_by_the_round_robin_statement(
    backend: PostgresBackend, statements: list[str]
) -> None:
    await backend.configure_queue(QueueConfig(queue="fair", mode="round_robin"))
    await backend.enqueue_batch(
        [EnqueueArgs(actor="a", queue="fair", fairness_key=k) for k in "xxxy"]
    )
    worker = uuid4()
    # The strict-FIFO statement locks nothing for a call naming a round-robin queue.
    first = await backend.dispatch_batch(worker, ["default", "fair"], 2, LEASE)
    assert sorted(row.fairness_key or "" for row in first) == ["x", "y"]
    assert statements == ["strict_fifo", "queue_settings", "round_robin"]
    statements.clear()
    # Remembered: the next call looks the settings up first.
    assert len(await backend.dispatch_batch(worker, ["default", "fair"], 2, LEASE)) == 2
    assert statements == ["queue_settings", "round_robin"]
    statements.clear()
    # Switched back to strict FIFO: seen in the settings, and strict FIFO runs again.
    await backend.configure_queue(QueueConfig(queue="fair", mode="strict_fifo"))
    await backend.enqueue(EnqueueArgs(actor="a", queue="fair"))
    assert len(await backend.dispatch_batch(worker, ["default", "fair"], 2, LEASE)) == 1
    assert statements == ["queue_settings", "strict_fifo"]
    statements.clear()
    await backend.enqueue(EnqueueArgs(actor="a", queue="fair"))
    assert len(await backend.dispatch_batch(worker, ["default", "fair"], 2, LEASE)) == 1
    assert statements == ["strict_fifo"]


async def test_queue_caps_are_read_by_the_strict_fifo_statement(
    backend: PostgresBackend, statements: list[str]
) -> None:
    await backend.configure_queue(QueueConfig(queue="small", max_concurrent=2))
    await backend.enqueue_batch([EnqueueArgs(actor="a", queue="small") for _ in range(5)])
    assert len(await backend.dispatch_batch(uuid4(), ["small"], 5, LEASE)) == 2
    assert statements == ["strict_fifo"]
