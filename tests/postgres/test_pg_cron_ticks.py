"""Cron ticks on Postgres: a schedule per transaction, so a tick cut short keeps what it
fired, and a frozen leader's lock on a schedule ends with its session."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

import asyncpg
import psycopg
import pytest
import pytest_asyncio

from taskq.models import EnqueueArgs, JobFilter, ScheduleCreateArgs, ScheduleRecord
from taskq_postgres import PostgresBackend
from taskq_testing.conformance._support import make_args
from taskq_testing.postgres import PgSchema

pytestmark = pytest.mark.postgres

_CATCH_UP = timedelta(minutes=1)


def _slot_job(schedule: ScheduleRecord, slot: datetime) -> EnqueueArgs:
    return make_args(
        actor=schedule.actor, idempotency_key=f"schedule:{schedule.id}:{slot.isoformat()}"
    )


async def _behind(backend: PostgresBackend, n: int) -> list[UUID]:
    """``n`` per-second schedules, each five seconds behind (a leader gap)."""
    ids = []
    for i in range(n):
        record = await backend.create_schedule(
            ScheduleCreateArgs(name=f"s{i}", actor=f"a{i}", cron="* * * * * *")
        )
        ids.append(record.id)
    async with backend.connection() as conn:
        await conn.execute(
            f"UPDATE {backend.schema}.schedules "
            "SET next_fire_at = date_trunc('second', clock_timestamp()) - interval '5 s'"
        )
    return ids


async def _untouched(backend: PostgresBackend) -> set[str]:
    """The actors of the schedules still at the next_fire_at :func:`_behind` gave them
    (a per-second schedule fired comes due again a second later: "due" would not tell)."""
    async with backend.connection() as conn:
        rows = await conn.fetch(
            f"SELECT actor FROM {backend.schema}.schedules WHERE last_fired_at IS NULL"
        )
    return {row["actor"] for row in rows}


@pytest_asyncio.fixture
async def backend(pg_pooled_schema: PgSchema) -> AsyncIterator[PostgresBackend]:
    backend = PostgresBackend(
        pg_pooled_schema.dsn,
        schema=pg_pooled_schema.name,
        command_timeout=timedelta(milliseconds=500),
    )
    await backend.open()
    yield backend
    await backend.close()


async def test_a_tick_cut_short_keeps_the_schedules_it_fired(backend: PostgresBackend) -> None:
    # One transaction for the whole tick rolled back everything when the leader's bound
    # cut it short, and the next tick met the same backlog: no schedule fired again.
    await _behind(backend, 3)
    seen: list[str] = []

    def build(schedule: ScheduleRecord, slot: datetime) -> EnqueueArgs:
        if schedule.actor not in seen:
            seen.append(schedule.actor)
            if len(seen) == 2:  # the bound runs out while the second schedule fires
                task = asyncio.current_task()
                assert task is not None
                task.cancel()
        return _slot_job(schedule, slot)

    with pytest.raises(asyncio.CancelledError):
        await asyncio.create_task(backend.fire_due_schedules(build, catch_up=_CATCH_UP))
    assert await _untouched(backend) == {"a0", "a1", "a2"} - {seen[0]}
    fired = await backend.list_jobs(JobFilter(limit=100))
    assert {job.actor for job in fired} == {seen[0]}
    # The next tick fires the rest.
    assert await backend.fire_due_schedules(_slot_job, catch_up=_CATCH_UP) >= 2 * 5
    assert await _untouched(backend) == set()


async def test_a_frozen_leaders_schedule_lock_ends_with_its_session(
    backend: PostgresBackend, pg_pooled_schema: PgSchema
) -> None:
    # Held for the pool's minute-long idle-in-transaction limit, the lock of a leader
    # frozen mid-tick hid the schedule from the next leader until its slot had fallen
    # out of the catch-up window. The server now ends such a session after the command
    # timeout (500 ms here), while the leader is still frozen.
    await _behind(backend, 1)
    free_while_frozen: list[int] = []

    def frozen(schedule: ScheduleRecord, slot: datetime) -> EnqueueArgs:
        if not free_while_frozen:
            time.sleep(1.5)  # the whole process stops (SIGSTOP, a swap storm)
            # What another leader sees meanwhile (its own session; no loop runs here).
            with psycopg.connect(pg_pooled_schema.dsn, autocommit=True) as other:
                rows = other.execute(
                    f"SELECT id FROM {pg_pooled_schema.name}.schedules FOR UPDATE SKIP LOCKED"
                ).fetchall()
            free_while_frozen.append(len(rows))
        return _slot_job(schedule, slot)

    with pytest.raises((TimeoutError, asyncpg.PostgresConnectionError, asyncpg.InterfaceError)):
        await backend.fire_due_schedules(frozen, catch_up=_CATCH_UP)
    assert free_while_frozen == [1]
    assert await backend.list_jobs(JobFilter(limit=10)) == []  # nothing of that tick landed


def _freed_while_frozen(schema: PgSchema) -> bool:
    """Whether another leader could lock the schedule while this process stood still
    (SIGSTOP: no loop runs), asked until the server frees it (well within the pool's
    minute-long idle limit, which kept it otherwise)."""
    with psycopg.connect(schema.dsn, autocommit=True) as other:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            query = f"SELECT id FROM {schema.name}.schedules FOR UPDATE SKIP LOCKED"
            if other.execute(query).fetchall():
                return True
            time.sleep(0.05)
    return False


async def test_a_leader_frozen_as_it_takes_a_schedules_lock_holds_it_no_longer(
    backend: PostgresBackend, pg_pooled_schema: PgSchema, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The idle-in-transaction bound was set by a statement after the one that took the
    # lock: a leader frozen between the two held the schedule for the pool's minute.
    await _behind(backend, 1)
    transaction = backend._transaction
    free_while_frozen: list[bool] = []

    class FreezesOnceLocked:
        """The tick's transaction; the process stops as the lock is taken."""

        def __init__(self, tx: Any) -> None:
            self._tx = tx

        def __getattr__(self, name: str) -> Any:
            return getattr(self._tx, name)

        async def fetchrow(self, query: str, *args: Any) -> Any:
            record = await self._tx.fetchrow(query, *args)
            if record is not None and not free_while_frozen:
                free_while_frozen.append(_freed_while_frozen(pg_pooled_schema))
            return record

    @asynccontextmanager
    async def freezing(conn: object = None) -> AsyncIterator[Any]:
        async with transaction(conn) as tx:
            yield FreezesOnceLocked(tx)

    monkeypatch.setattr(backend, "_transaction", freezing)
    with pytest.raises((TimeoutError, asyncpg.PostgresConnectionError, asyncpg.InterfaceError)):
        await backend.fire_due_schedules(_slot_job, catch_up=_CATCH_UP)
    assert free_while_frozen == [True]
    assert await backend.list_jobs(JobFilter(limit=10)) == []  # nothing of that tick landed


async def test_slots_the_database_refuses_are_skipped_and_the_tick_goes_on(
    backend: PostgresBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A constraint refusing one schedule's rows failed the whole tick each time; the
    # loop guard then ended each leader in turn.
    await _behind(backend, 2)
    enqueue = backend._enqueue

    async def refusing(db: object, jobs: list[EnqueueArgs]) -> object:
        if jobs and jobs[0].actor == "a0":
            raise asyncpg.CheckViolationError("new row violates check constraint")
        return await enqueue(db, jobs)

    monkeypatch.setattr(backend, "_enqueue", refusing)
    fired = await backend.fire_due_schedules(_slot_job, catch_up=_CATCH_UP)
    assert fired >= 5  # the other schedule's slots
    assert await _untouched(backend) == set()  # both advanced past their slots
    assert {job.actor for job in await backend.list_jobs(JobFilter())} == {"a1"}


async def test_a_tick_fires_every_due_schedule_it_has_time_for(
    pg_pooled_schema: PgSchema, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A tick fired 100 schedules at most, then waited out the cron interval: 2,000 due
    # each minute fired up to 28 s late, 5,000 lost slots past the catch-up window.
    # The tick's time budget is widened: 120 schedules are about 0.4 s of work, but took
    # more than its 2 s on a loaded machine, and the tick rightly stopped there.
    from taskq_postgres import _backend

    monkeypatch.setattr(_backend, "_CRON_TICK_SECONDS", 60.0)
    backend = PostgresBackend(pg_pooled_schema.dsn, schema=pg_pooled_schema.name)
    await backend.open()
    try:
        await _behind(backend, 120)
        fired = await backend.fire_due_schedules(_slot_job, catch_up=_CATCH_UP)
        assert fired >= 120 * 5
        assert await _untouched(backend) == set()
    finally:
        await backend.close()
