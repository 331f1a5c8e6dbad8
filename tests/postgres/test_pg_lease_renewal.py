"""A job row another transaction holds does not stop the renewal of the worker's other
leases: the heartbeat skips it instead of waiting, so the reclaim sweep does not take
(and run again) the jobs whose rows nobody held; nor does it take the held one, or any
job of a live worker after a table lock, once the lock ends."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any
from uuid import UUID, uuid4

import asyncpg
import pytest

from taskq import JobStatus, TaskQ, actor
from taskq.errors import JobFailedError
from taskq.models import EnqueueArgs
from taskq_postgres import PostgresBackend
from taskq_testing.postgres import PgSchema
from tests.worker.running import running

pytestmark = pytest.mark.postgres

LEASE = timedelta(minutes=5)


@pytest.fixture
async def backend(pg_schema: PgSchema) -> AsyncIterator[PostgresBackend]:
    backend = PostgresBackend(pg_schema.dsn, schema=pg_schema.name)
    await backend.open()
    yield backend
    await backend.close()


async def _hold_row(dsn: str, schema: str, job_id: UUID) -> asyncpg.Connection[Any]:
    """A connection in a transaction holding ``job_id``'s row (an operator's, say)."""
    rival: asyncpg.Connection[Any] = await asyncpg.connect(dsn)
    await rival.execute("BEGIN")
    await rival.execute(f"SELECT 1 FROM {schema}.jobs WHERE id = $1 FOR UPDATE", job_id)
    return rival


async def test_a_held_row_is_skipped_not_waited_for(
    backend: PostgresBackend, pg_schema: PgSchema
) -> None:
    await backend.enqueue_batch([EnqueueArgs(actor="a") for _ in range(3)])
    worker = uuid4()
    jobs = await backend.dispatch_batch(worker, ["default"], 3, LEASE)
    rival = await _hold_row(pg_schema.dsn, pg_schema.name, jobs[0].id)
    try:
        async with asyncio.timeout(5):  # it waited for the rival's commit
            renewed = await backend.renew_leases(worker, LEASE)
            assert await backend.heartbeat_jobs(worker, LEASE) == 2
        assert sorted(renewed) == sorted(job.id for job in jobs[1:])
    finally:
        await rival.close()  # its transaction ends with it
    assert sorted(await backend.renew_leases(worker, LEASE)) == sorted(job.id for job in jobs)


async def test_a_row_an_open_transaction_only_wrote_history_for_is_renewed(
    backend: PostgresBackend, pg_schema: PgSchema
) -> None:
    # An event row's foreign key takes KEY SHARE on its job's row, which FOR UPDATE
    # skipped: any open transaction that wrote a job's history held its renewal back.
    [job] = await backend.enqueue_batch([EnqueueArgs(actor="a")])
    worker = uuid4()
    await backend.dispatch_batch(worker, ["default"], 1, LEASE)
    rival: asyncpg.Connection[Any] = await asyncpg.connect(pg_schema.dsn)
    try:
        await rival.execute("BEGIN")
        await rival.execute(
            f"INSERT INTO {pg_schema.name}.job_events (job_id, kind) VALUES ($1, 'note')", job.id
        )
        assert await backend.renew_leases(worker, LEASE) == [job.id]
    finally:
        await rival.close()


RUNS: Counter[UUID] = Counter()


@actor(name="renewal.slow")
async def slow(payload: dict[str, Any], ctx: Any) -> None:
    RUNS[ctx.job_id] += 1
    await asyncio.sleep(payload["seconds"])


async def test_the_other_jobs_of_a_worker_are_not_reclaimed(pg_schema: PgSchema) -> None:
    # A 2 s lease, and one job's row held for 3 s: the heartbeat waited on that row,
    # renewed nothing, and the reclaim sweep took the worker's other job, which the
    # same live worker then ran again in full. Then the held one: its lease lapsed while
    # the row was held, and the sweep took it as crashed the moment the row was free.
    settings = {
        "poll_interval": "100ms",
        "heartbeat_interval": "100ms",
        "lock_lease": "2s",
        "maintenance_interval": "50ms",
    }
    tq = TaskQ(pg_schema.dsn, schema=pg_schema.name, actors=[slow])
    async with tq:
        held = await tq.client.enqueue(slow, {"seconds": 4})
        other = await tq.client.enqueue(slow, {"seconds": 4})
        async with running(tq, settings):
            async with asyncio.timeout(5):
                while RUNS[held.id] + RUNS[other.id] < 2:  # noqa: ASYNC110 - the actors' own count
                    await asyncio.sleep(0.02)
            rival = await _hold_row(pg_schema.dsn, pg_schema.name, held.id)
            try:
                await asyncio.sleep(3)
            finally:
                await rival.close()
            await tq.client.wait_for_result(other.id, timeout=10)
            await tq.client.wait_for_result(held.id, timeout=10)
        for job in (other, held):
            attempts = await tq.client.get_attempts(job.id)
            row = await tq.client.get(job.id)
            assert row is not None and row.status is JobStatus.SUCCEEDED
            assert [a.outcome for a in attempts] == ["succeeded"]
            assert RUNS[job.id] == 1


@pytest.mark.parametrize(
    ("table", "mode"),
    [("jobs", "EXCLUSIVE"), ("workers", "SHARE"), ("workers", "ACCESS EXCLUSIVE")],
    ids=["jobs", "workers-share", "workers-access-exclusive"],
)
async def test_a_table_locked_past_the_lease_reclaims_nothing(
    pg_schema: PgSchema, table: str, mode: str
) -> None:
    # A migration or an operator's LOCK TABLE stalls every renewal and every sweep;
    # once it ends, the sweep took every running job of the live workers as crashed.
    # On the workers table (a CREATE INDEX takes SHARE), a touch sent before the
    # renewal held it up: the job ran three times.
    settings = {
        "poll_interval": "100ms",
        "heartbeat_interval": "100ms",
        "lock_lease": "1s",
        "maintenance_interval": "50ms",
        "dispatcher_command_timeout": "200ms",
        "watchdog_enabled": False,  # the stalled ticks are the point here
    }
    tq = TaskQ(pg_schema.dsn, schema=pg_schema.name, actors=[slow])
    async with tq:
        jobs = [await tq.client.enqueue(slow, {"seconds": 3}) for _ in range(2)]
        async with running(tq, settings):
            # A safety net: dispatches bounded at 200 ms time out and retry on a loaded
            # machine, their jobs handed back first.
            async with asyncio.timeout(30):
                while sum(RUNS[job.id] for job in jobs) < 2:  # noqa: ASYNC110 - the actors' own count
                    await asyncio.sleep(0.02)
            rival: asyncpg.Connection[Any] = await asyncpg.connect(pg_schema.dsn)
            try:
                await rival.execute("BEGIN")
                await rival.execute(f"LOCK TABLE {pg_schema.name}.{table} IN {mode} MODE")
                await asyncio.sleep(1.5)
            finally:
                await rival.close()
            for job in jobs:
                await tq.client.wait_for_result(job.id, timeout=10)
        for job in jobs:
            attempts = await tq.client.get_attempts(job.id)
            # Ran once, never reclaimed. A dispatch that outlasted the 200 ms bound on a
            # loaded machine (before the lock) lost its reply: the worker handed those
            # jobs back unstarted, as it should, before running them.
            outcomes = [a.outcome for a in attempts]
            assert [o for o in outcomes if o != "unstarted"] == ["succeeded"], outcomes
            assert outcomes[-1] == "succeeded", outcomes
            assert RUNS[job.id] == 1


ACTIVE: Counter[UUID] = Counter()
OVERLAP: Counter[UUID] = Counter()


@actor(name="renewal.watched")
async def watched(payload: dict[str, Any], ctx: Any) -> None:
    ACTIVE[ctx.job_id] += 1
    OVERLAP[ctx.job_id] = max(OVERLAP[ctx.job_id], ACTIVE[ctx.job_id])
    try:
        await asyncio.sleep(payload["seconds"])
    finally:
        ACTIVE[ctx.job_id] -= 1


async def test_with_the_fence_a_job_whose_row_is_held_is_stopped_before_its_lease_ends(
    pg_schema: PgSchema,
) -> None:
    # Its lease was not renewed while its row was held, yet the worker counted it
    # renewed: the fence, which stops a job before its lease ends (and the sweep may
    # give it to another worker, to run alongside), let it run on past its lease.
    settings = {
        "poll_interval": "50ms",
        "heartbeat_interval": "500ms",
        "lock_lease": "2s",
        "dispatcher_command_timeout": "300ms",
        "maintenance_interval": "100ms",
        "lease_fence": True,
    }
    tq = TaskQ(pg_schema.dsn, schema=pg_schema.name, actors=[watched])
    async with tq:
        job = await tq.client.enqueue(watched, {"seconds": 6})
        async with running(tq, settings, stop_within=20):
            async with asyncio.timeout(5):
                while not ACTIVE[job.id]:  # noqa: ASYNC110 - the actor's own count
                    await asyncio.sleep(0.02)
            rival = await _hold_row(pg_schema.dsn, pg_schema.name, job.id)
            try:
                await asyncio.sleep(3)
            finally:
                await rival.close()
            await asyncio.sleep(1.5)  # the sweep's turn, and a dispatch after it
        outcomes = [a.outcome for a in await tq.client.get_attempts(job.id)]
    assert OVERLAP[job.id] == 1
    assert outcomes and outcomes[0] in {"failed", "crashed"}, outcomes


async def test_a_lock_on_reservation_slots_does_not_hold_up_cancellation(
    pg_schema: PgSchema,
) -> None:
    # The reservation leases were renewed before the cancel flags were read: while
    # reservation_slots was locked (a migration, an operator's LOCK TABLE), every tick
    # timed out there and no cancel request reached its job, though no job held a slot.
    settings = {
        "poll_interval": "100ms",
        "heartbeat_interval": "100ms",
        "dispatcher_command_timeout": "200ms",
        "cancellation_grace_period": "200ms",
        "watchdog_enabled": False,  # the stalled ticks are the point here
    }
    tq = TaskQ(pg_schema.dsn, schema=pg_schema.name, actors=[slow])
    async with tq:
        job = await tq.client.enqueue(slow, {"seconds": 30})
        async with running(tq, settings):
            async with asyncio.timeout(5):
                while not RUNS[job.id]:  # noqa: ASYNC110 - the actor's own count
                    await asyncio.sleep(0.02)
            rival: asyncpg.Connection[Any] = await asyncpg.connect(pg_schema.dsn)
            try:
                await rival.execute("BEGIN")
                await rival.execute(
                    f"LOCK TABLE {pg_schema.name}.reservation_slots IN ACCESS EXCLUSIVE MODE"
                )
                assert await tq.client.cancel(job.id, reason="test")
                with pytest.raises(JobFailedError) as ended:
                    await tq.client.wait_for_result(job.id, timeout=10)
                assert ended.value.row.status is JobStatus.CANCELLED
            finally:
                await rival.close()


async def test_only_the_reservation_slots_of_running_jobs_are_renewed(
    backend: PostgresBackend, pg_schema: PgSchema
) -> None:
    # Every slot bearing the worker's id was renewed: one whose job had ended (or been
    # reclaimed) stayed held for as long as the worker lived.
    worker = uuid4()
    await backend.enqueue_batch([EnqueueArgs(actor="a") for _ in range(3)])
    ended, running_job, reclaimed = await backend.dispatch_batch(worker, ["default"], 3, LEASE)
    admin: asyncpg.Connection[Any] = await asyncpg.connect(pg_schema.dsn)
    try:
        for slot, job in enumerate((ended, running_job, reclaimed)):
            await admin.execute(
                f"INSERT INTO {pg_schema.name}.reservation_slots VALUES "
                "('gpu', $1, $2, $3, clock_timestamp() + interval '1 second')",
                slot,
                job.id,
                worker,
            )
        assert await backend.mark_succeeded(ended.id, worker, None)
        # Reclaimed by the sweep and dispatched again to another worker.
        await admin.execute(
            f"UPDATE {pg_schema.name}.jobs SET locked_by_worker = $2 WHERE id = $1",
            reclaimed.id,
            uuid4(),
        )
        assert await backend.extend_reservation_leases(worker, LEASE) == 1
        renewed = await admin.fetch(
            f"SELECT job_id FROM {pg_schema.name}.reservation_slots "
            "WHERE lease_expires_at > clock_timestamp() + interval '1 minute'"
        )
    finally:
        await admin.close()
    assert [row["job_id"] for row in renewed] == [running_job.id]
