"""The conformance suite on PostgresBackend: the same tests as the in-memory backend,
on a real server with a real clock."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import asyncpg
import pytest
import pytest_asyncio

from taskq_postgres import PostgresBackend
from taskq_testing.conformance import AdvanceTime, BackendConformance
from taskq_testing.postgres import PgSchema

pytestmark = pytest.mark.postgres


async def _sleep(delta: timedelta) -> None:
    await asyncio.sleep(delta.total_seconds())


class TestPostgresBackend(BackendConformance):
    """Each test gets an emptied schema of the session's pool and a backend opened on it;
    time passes for real."""

    @pytest_asyncio.fixture
    async def backend(self, pg_pooled_schema: PgSchema) -> AsyncIterator[PostgresBackend]:
        backend = PostgresBackend(
            pg_pooled_schema.dsn,
            schema=pg_pooled_schema.name,
            min_pool_size=1,
            max_pool_size=4,
            cancel_reclaim_headroom=timedelta(milliseconds=600),
            # Long enough to watch an event being held back, short enough to wait out.
            reclaim_event_visibility_delay=timedelta(milliseconds=500),
            # Wider than the default, so that the wake tests see enqueues coalesced.
            wake_coalesce_window=timedelta(milliseconds=50),
            # Far above a test's next statement, short enough to wait out.
            stale_batch_grace=timedelta(seconds=2),
        )
        await backend.open()
        yield backend
        await backend.close()

    @pytest.fixture
    def advance_time(self) -> AdvanceTime:
        return _sleep

    @pytest_asyncio.fixture
    async def transaction_conn(self, pg_pooled_schema: PgSchema) -> AsyncIterator[Any]:
        # A plain connection of the caller's own, with asyncpg's default codecs.
        conn: asyncpg.Connection[Any] = await asyncpg.connect(pg_pooled_schema.dsn)
        yield conn
        await conn.close()
