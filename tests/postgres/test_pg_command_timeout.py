"""The worker's dispatcher_command_timeout bounds statements on the pool."""

from __future__ import annotations

from datetime import timedelta

import pytest

from taskq_postgres import PostgresBackend
from taskq_testing.postgres import PgSchema

pytestmark = pytest.mark.postgres


async def test_a_stalled_statement_times_out_and_the_pool_stays_usable(
    pg_pooled_schema: PgSchema,
) -> None:
    backend = PostgresBackend(
        pg_pooled_schema.dsn,
        schema=pg_pooled_schema.name,
        command_timeout=timedelta(milliseconds=300),
    )
    await backend.open()
    try:
        async with backend.connection() as conn:
            with pytest.raises(TimeoutError):
                await conn.execute("SELECT pg_sleep(5)")
        assert await backend.count_active_jobs(["default"]) == 0
    finally:
        await backend.close()
