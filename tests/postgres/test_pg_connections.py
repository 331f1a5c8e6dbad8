"""TaskQ's own connections: named in pg_stat_activity, and never stuck in a transaction."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any
from uuid import uuid4

import asyncpg
import pytest
import pytest_asyncio

from taskq.models import EnqueueArgs
from taskq_postgres import PostgresBackend
from taskq_postgres._transient import TRANSIENT_PG_ERRORS, client_fault
from taskq_testing.postgres import PgSchema

pytestmark = pytest.mark.postgres

LEASE = timedelta(minutes=5)


@pytest_asyncio.fixture
async def conn(pg_pooled_schema: PgSchema) -> AsyncIterator[asyncpg.Connection[Any]]:
    connection: asyncpg.Connection[Any] = await asyncpg.connect(pg_pooled_schema.dsn)
    yield connection
    await connection.close()


async def _application_names(conn: asyncpg.Connection[Any], instance_id: str) -> list[str]:
    rows = await conn.fetch(
        "SELECT application_name FROM pg_stat_activity WHERE application_name LIKE $1 "
        "ORDER BY application_name",
        f"%/{instance_id}",
    )
    return [row["application_name"] for row in rows]


async def test_every_connection_names_its_role_and_instance(
    pg_pooled_schema: PgSchema, conn: asyncpg.Connection[Any]
) -> None:
    instance = f"test-{uuid4().hex[:8]}"
    backend = PostgresBackend(
        pg_pooled_schema.dsn, schema=pg_pooled_schema.name, min_pool_size=2, instance_id=instance
    )
    await backend.open()
    try:
        # The LISTEN connection is opened by the first subscription, not before.
        assert await _application_names(conn, instance) == [f"taskq-pool/{instance}"] * 2
        async with backend.subscribe_wake():
            assert await _application_names(conn, instance) == [
                f"taskq-notify/{instance}",
                *[f"taskq-pool/{instance}"] * 2,
            ]
    finally:
        await backend.close()
    # A server process outlives its closed client socket by a moment.
    for _ in range(100):
        if not await _application_names(conn, instance):
            break
        await asyncio.sleep(0.02)
    assert await _application_names(conn, instance) == []


async def test_a_stuck_transaction_cannot_hide_a_job_from_dispatch_for_long(
    pg_pooled_schema: PgSchema,
) -> None:
    backend = PostgresBackend(
        pg_pooled_schema.dsn,
        schema=pg_pooled_schema.name,
        # 2 s, not 300 ms: the dispatch right after the lock must come within it, and
        # a loaded machine's round trips could outlast 300 ms.
        idle_in_transaction_session_timeout=timedelta(seconds=2),
    )
    await backend.open()
    try:
        job = await backend.enqueue(EnqueueArgs(actor="a", queue="q"))
        async with backend.connection() as stuck:
            assert await stuck.fetchval("SHOW idle_in_transaction_session_timeout") == "2s"
            transaction = stuck.transaction()
            await transaction.start()
            await stuck.execute(
                f"SELECT 1 FROM {backend.schema}.jobs WHERE id = $1 FOR UPDATE", job.id
            )
            # The caller forgets about its transaction; its row lock hides the job...
            assert await backend.dispatch_batch(uuid4(), ["q"], 10, LEASE) == []
            # ...until the server ends the idle transaction and its session.
            async with asyncio.timeout(15):
                while not (rows := await backend.dispatch_batch(uuid4(), ["q"], 10, LEASE)):  # noqa: ASYNC110 - the server ends it
                    await asyncio.sleep(0.1)
            [row] = rows
            assert row.id == job.id
            with pytest.raises((asyncpg.PostgresError, asyncpg.InterfaceError)):
                await stuck.fetchval("SELECT 1")
    finally:
        await backend.close()


async def test_the_timeout_can_be_disabled(pg_pooled_schema: PgSchema) -> None:
    backend = PostgresBackend(
        pg_pooled_schema.dsn,
        schema=pg_pooled_schema.name,
        idle_in_transaction_session_timeout=None,
    )
    await backend.open()
    try:
        async with backend.connection() as pooled:
            assert await pooled.fetchval("SHOW idle_in_transaction_session_timeout") == "0"
    finally:
        await backend.close()


async def test_a_statement_on_a_connection_the_server_just_terminated_is_transient(
    pg_pooled_schema: PgSchema,
) -> None:
    # A Postgres restart terminates every pooled connection at once: a worker loop
    # using one before asyncpg has read the socket's end must see a transient error,
    # or five of them in a row end the worker (the loop guard's streak).
    admin = await asyncpg.connect(pg_pooled_schema.dsn)
    conn = await asyncpg.connect(pg_pooled_schema.dsn)
    try:
        await admin.execute("SELECT pg_terminate_backend($1)", conn.get_server_pid())
        # At once, asyncpg raises InternalClientError; a moment later, InterfaceError.
        with pytest.raises(TRANSIENT_PG_ERRORS) as raised:
            await conn.execute("SELECT 1")
        # The database's doing, not a bug of the calling code: the CLIs say it in one line.
        assert not client_fault(raised.value)
    finally:
        await conn.close()
        await admin.close()
