"""The Postgres enum ``{schema}.job_status`` mirrors ``JobStatus``."""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest

from taskq.backend.statemachine import JobStatus
from taskq.identifiers import check_identifier
from taskq_testing.postgres import PgSchema

pytestmark = pytest.mark.postgres


async def test_the_migrated_enum_has_exactly_the_statuses_of_the_state_machine(
    pg_schema: PgSchema,
) -> None:
    conn: asyncpg.Connection[Any] = await asyncpg.connect(pg_schema.dsn)
    try:
        labels = await conn.fetchval(
            f"SELECT enum_range(NULL::{check_identifier(pg_schema.name)}.job_status)::text[]"
        )
    finally:
        await conn.close()
    assert set(labels) == {status.value for status in JobStatus}
    assert len(labels) == len(JobStatus)
