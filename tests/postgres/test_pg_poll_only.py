"""Poll-only mode: no NOTIFY sent, no LISTEN opened, and workers still get every job."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from typing import Any
from uuid import uuid4

import asyncpg
import pytest

from taskq import EnqueueArgs, JobStatus, TaskQ, WorkerSettings, actor
from taskq.worker import Worker
from taskq_postgres import PostgresBackend
from taskq_postgres.channels import events_channel, wake_channel
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
        # The watchdogs off: in the test's process, a trip ends the whole pytest worker.
        {
            "poll_interval": "100ms",
            "heartbeat_interval": "100ms",
            "lock_lease": "2s",
            "watchdog_enabled": False,
        },
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


@pytest.mark.parametrize("poll_only", [True, False])
async def test_no_path_that_moves_jobs_notifies_in_poll_only_mode(
    pg_pooled_schema: PgSchema, listener: asyncpg.Connection[Any], poll_only: bool
) -> None:
    """Retries, sweeps, released finalizers and cancel requests notify like enqueues do:
    not at all when poll-only (and each of them does notify otherwise)."""
    heard: list[str] = []
    for channel in (wake_channel(pg_pooled_schema.name), events_channel(pg_pooled_schema.name)):
        await listener.add_listener(channel, lambda *args: heard.append(args[2]))
    marker, seen = f"test_marker_{uuid4().hex[:12]}", asyncio.Event()
    await listener.add_listener(marker, lambda *_: seen.set())

    async def notified_by(step: Callable[[], Awaitable[object]]) -> list[str]:
        """The channels ``step`` notified (notifications arrive in commit order)."""
        heard.clear()
        seen.clear()
        await step()
        await listener.execute("SELECT pg_notify($1, '')", marker)
        await asyncio.wait_for(seen.wait(), 10)
        return list(heard)

    backend = PostgresBackend(
        pg_pooled_schema.dsn,
        schema=pg_pooled_schema.name,
        poll_only=poll_only,
        stale_batch_grace=timedelta(0),  # the batch made just before is the sweep's
    )
    await backend.open()
    worker, lease, far = uuid4(), timedelta(minutes=5), timedelta(days=1)
    try:
        # retry_job: a cancelled job back to pending.
        retried = await backend.enqueue(EnqueueArgs(actor="a", queue="retry"))
        assert await backend.write_cancel_request(retried.id, "stop")
        # scheduled_to_pending: a due scheduled job promoted.
        await backend.enqueue(EnqueueArgs(actor="a", queue="due", delay=timedelta(milliseconds=1)))
        # reclaim_expired_locks: a running job whose lease ran out.
        await backend.enqueue(EnqueueArgs(actor="a", queue="expired"))
        assert (
            len(await backend.dispatch_batch(worker, ["expired"], 1, timedelta(milliseconds=1)))
            == 1
        )
        # write_cancel_request on a running job: its worker is told.
        running = await backend.enqueue(EnqueueArgs(actor="a", queue="running"))
        assert [running.id] == [
            r.id for r in await backend.dispatch_batch(worker, ["running"], 1, lease)
        ]
        # abort_batch and complete_stale_batches: a parked finalizer released.
        aborted, stale = uuid4(), uuid4()
        for batch_id in (aborted, stale):
            finalizer = await backend.enqueue(EnqueueArgs(actor="a", queue="fin", delay=far))
            await backend.create_batch(batch_id, "fin", 0, None, finalizer.id, None)
        await asyncio.sleep(0.05)  # the delay and the lease are over

        steps: dict[str, Callable[[], Awaitable[object]]] = {
            "retry_job": lambda: backend.retry_job(retried.id),
            "scheduled_to_pending": backend.scheduled_to_pending,
            "reclaim_expired_locks": lambda: backend.reclaim_expired_locks(
                timedelta(0), timedelta(0)
            ),
            "write_cancel_request": lambda: backend.write_cancel_request(running.id, "stop"),
            "abort_batch": lambda: backend.abort_batch(aborted),
            "complete_stale_batches": backend.complete_stale_batches,
        }
        heard_by = {name: await notified_by(step) for name, step in steps.items()}
    finally:
        await backend.close()
    if poll_only:
        assert heard_by == {name: [] for name in steps}
    else:
        assert all(heard_by.values()), heard_by
