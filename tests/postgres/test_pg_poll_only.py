"""Poll-only mode: no NOTIFY sent, no LISTEN opened, and workers still get every job."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any
from uuid import uuid4

import asyncpg
import pytest

from taskq import EnqueueArgs, JobStatus, TaskQ, WorkerSettings, actor
from taskq.worker import Worker
from taskq_postgres import PostgresBackend
from taskq_postgres.channels import wake_channel
from taskq_testing.postgres import PgSchema

pytestmark = pytest.mark.postgres


async def _notify_connections(backend: PostgresBackend) -> int:
    conn = await asyncpg.connect(backend.dsn)
    try:
        count = await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
            f"taskq-notify/{backend.instance_id}",
        )
    finally:
        await conn.close()
    return int(count)


@pytest.fixture
async def listener(pg_pooled_schema: PgSchema) -> AsyncIterator[asyncpg.Connection[Any]]:
    conn: asyncpg.Connection[Any] = await asyncpg.connect(pg_pooled_schema.dsn)
    yield conn
    await conn.close()


@pytest.mark.parametrize("poll_only", [True, False])
async def test_no_enqueue_path_notifies_in_poll_only_mode(
    pg_pooled_schema: PgSchema, listener: asyncpg.Connection[Any], poll_only: bool
) -> None:
    wakes: list[str] = []
    await listener.add_listener(
        wake_channel(pg_pooled_schema.name), lambda *args: wakes.append(args[2])
    )
    marker, seen = f"test_marker_{uuid4().hex[:12]}", asyncio.Event()
    await listener.add_listener(marker, lambda *_: seen.set())
    backend = PostgresBackend(
        pg_pooled_schema.dsn, schema=pg_pooled_schema.name, poll_only=poll_only
    )
    await backend.open()
    try:
        await backend.enqueue(EnqueueArgs(actor="a"))
        await backend.enqueue_batch([EnqueueArgs(actor="a"), EnqueueArgs(actor="a")])
        await backend.enqueue_batch_fast([EnqueueArgs(actor="a")])
        await backend.enqueue(EnqueueArgs(actor="a", singleton=True, identity_key="k"))
        async with backend.connection() as conn, conn.transaction():
            await backend.enqueue_with_conn(conn, EnqueueArgs(actor="a"))
    finally:
        await backend.close()  # sends any coalesced wake
    # Notifications arrive in commit order: once the marker is in, every wake is too.
    await listener.execute("SELECT pg_notify($1, '')", marker)
    await asyncio.wait_for(seen.wait(), 10)
    assert (wakes == []) is poll_only


async def test_subscriptions_open_no_listen_connection(pg_pooled_schema: PgSchema) -> None:
    backend = PostgresBackend(pg_pooled_schema.dsn, schema=pg_pooled_schema.name, poll_only=True)
    await backend.open()
    try:
        async with backend.subscribe_wake() as wake, backend.subscribe_cancel_wake() as cancel:
            await backend.enqueue(EnqueueArgs(actor="a"))
            assert await _notify_connections(backend) == 0
            assert not wake.is_set() and not cancel.is_set()
    finally:
        await backend.close()


async def test_a_poll_only_worker_runs_jobs_enqueued_while_it_waits(
    pg_pooled_schema: PgSchema,
) -> None:
    @actor(name="noop")
    async def noop(payload: dict[str, Any]) -> str:
        return "done"

    # The worker settings switch the mode (TASKQ_POLL_ONLY), as in a deployment.
    settings = WorkerSettings.load(
        {"poll_interval": "100ms", "heartbeat_interval": "100ms", "lock_lease": "2s"},
        env={"TASKQ_POLL_ONLY": "true"},
    )
    tq = TaskQ(
        pg_pooled_schema.dsn,
        schema=pg_pooled_schema.name,
        actors=[noop],
        **settings.backend_options(),
    )
    backend = tq.backend
    assert isinstance(backend, PostgresBackend) and backend.poll_only
    async with tq:
        worker = Worker(tq, settings)
        run = asyncio.create_task(worker.run())
        try:
            jobs = [await tq.client.enqueue(noop, {}) for _ in range(3)]
            for job in jobs:
                assert await tq.client.wait_for_result(job.id, timeout=10) == "done"
            assert await _notify_connections(backend) == 0
        finally:
            worker.stop()
            await asyncio.wait_for(run, 10)
        for job in jobs:
            row = await tq.client.get(job.id)
            assert row is not None and row.status is JobStatus.SUCCEEDED
