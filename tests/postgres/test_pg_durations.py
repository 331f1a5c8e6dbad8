"""Durations on Postgres are exact: a delay of N days is N x 24 hours whatever the
session's time zone.

asyncpg sends a timedelta's days as interval days, and Postgres adds interval days
as calendar days in the session's ``TimeZone``: 23 or 25 hours across a DST change.
TaskQ's own connections run in UTC; the enqueue statements, which may run on a
caller's connection, add durations as seconds.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit, urlunsplit
from uuid import uuid4
from zoneinfo import ZoneInfo

import asyncpg
import pytest
import pytest_asyncio

from taskq.models import EnqueueArgs, JobRow
from taskq_postgres import PostgresBackend
from taskq_testing.postgres import PgSchema

pytestmark = pytest.mark.postgres

ZONE = "America/New_York"


async def _across_a_dst_change(conn: Any) -> timedelta:
    """The fewest whole days from the database's now that cross a DST change in ``ZONE``."""
    now: datetime = (await conn.fetchval("SELECT clock_timestamp()")).astimezone(ZoneInfo(ZONE))
    days = next(
        d for d in range(1, 367) if (now + timedelta(days=d)).utcoffset() != now.utcoffset()
    )
    return timedelta(days=days)


def _in_zone(dsn: str) -> str:
    """``dsn`` with its sessions' ``TimeZone`` defaulting to ``ZONE`` (asyncpg passes
    unknown query parameters as server settings)."""
    parts = urlsplit(dsn)
    query = "&".join(q for q in (parts.query, f"TimeZone={ZONE}") if q)
    return urlunsplit(parts._replace(query=query))


@pytest_asyncio.fixture
async def backend(pg_pooled_schema: PgSchema) -> AsyncIterator[PostgresBackend]:
    backend = PostgresBackend(_in_zone(pg_pooled_schema.dsn), schema=pg_pooled_schema.name)
    await backend.open()
    yield backend
    await backend.close()


@pytest_asyncio.fixture
async def caller_conn(pg_pooled_schema: PgSchema) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(_in_zone(pg_pooled_schema.dsn))
    assert await conn.fetchval("SHOW TimeZone") == ZONE
    yield conn
    await conn.close()


def _args(**fields: object) -> EnqueueArgs:
    return EnqueueArgs.model_validate({"actor": "a", "queue": "q", **fields})


async def test_taskq_connections_run_in_utc(backend: PostgresBackend) -> None:
    async with backend.connection() as conn:
        assert await conn.fetchval("SHOW TimeZone") == "UTC"


_Enqueue = Callable[[PostgresBackend, asyncpg.Connection, EnqueueArgs], Awaitable[JobRow]]


async def _one(backend: PostgresBackend, conn: asyncpg.Connection, args: EnqueueArgs) -> JobRow:
    return await backend.enqueue_with_conn(conn, args)


async def _batch(backend: PostgresBackend, conn: asyncpg.Connection, args: EnqueueArgs) -> JobRow:
    rows = await backend.enqueue_batch([args, _args()], connection=conn)
    return rows[0]


@pytest.mark.parametrize("enqueue", [_one, _batch], ids=["one", "batch"])
@pytest.mark.parametrize("plain", [True, False], ids=["plain", "with-deadline"])
async def test_a_delay_of_days_is_exact_on_a_callers_connection_in_a_dst_zone(
    backend: PostgresBackend, caller_conn: asyncpg.Connection, enqueue: _Enqueue, plain: bool
) -> None:
    delay = await _across_a_dst_change(caller_conn)
    fields: dict[str, object] = {"delay": delay}
    if not plain:
        fields.update(schedule_to_close=delay * 2, tags=["t"])
    row = await enqueue(backend, caller_conn, _args(**fields))
    assert row.scheduled_at - row.created_at == delay
    if plain:
        assert row.deadline_at is None
    else:
        assert row.deadline_at is not None and row.deadline_at - row.created_at == delay * 2
    assert await backend.get(row.id) == row


async def test_a_snooze_of_days_is_exact_on_a_server_in_a_dst_zone(
    backend: PostgresBackend,
) -> None:
    job = await backend.enqueue(_args(queue=f"q-{uuid4().hex}"))
    worker = uuid4()
    [running] = await backend.dispatch_batch(worker, [job.queue], 1, timedelta(minutes=5))
    async with backend.connection() as conn:
        delay = await _across_a_dst_change(conn)
        before: datetime = await conn.fetchval("SELECT clock_timestamp()")
        assert await backend.mark_snoozed(running.id, worker, delay) == "scheduled"
        after: datetime = await conn.fetchval("SELECT clock_timestamp()")
    stored = await backend.get(job.id)
    assert stored is not None
    assert before + delay <= stored.scheduled_at <= after + delay
