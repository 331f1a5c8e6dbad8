"""The SQL floors: what plain asyncpg gets out of the same tables, with no framework.

They run on a TaskQ-migrated schema (same columns, indexes and trigger), so
each TaskQ figure can be read as a fraction of what Postgres allows here:

* ``insert_notify``: one INSERT of the columns TaskQ writes plus a
  ``pg_notify``, one statement per job;
* ``copy``: a transaction reading the clock and notifying, then COPY;
* ``drain``: per worker process, a dispatch loop claiming up to 100 jobs at a
  time (``FOR UPDATE SKIP LOCKED`` UPDATE), at most ``concurrency`` in flight,
  and a completer marking each batch of claimed jobs succeeded in one UPDATE;
* ``audit`` drain: the same, plus what TaskQ records per job in the
  completion's transaction: one ``job_attempts`` row and one ``job_events``
  row per transition (pending -> running, running -> succeeded).
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any, Final
from uuid import UUID, uuid4

import asyncpg
from bench._common import NAP_PAYLOAD, Loop, Result, drain_span

from taskq.identifiers import check_identifier

DISPATCH_BATCH: Final = 100

_COLUMNS: Final = (
    "id",
    "actor",
    "queue",
    "status",
    "priority",
    "payload",
    "scheduled_at",
    "created_at",
    "enqueued_at",
    "max_attempts",
    "metadata",
    "tags",
    "updated_at",
)
"""The columns a plain enqueue writes; the rest (all NULL for these jobs) take defaults."""


def _insert_notify_sql(schema: str) -> str:
    s = check_identifier(schema)
    return f"""
    WITH ins AS (
        INSERT INTO {s}.jobs ({", ".join(_COLUMNS)})
        VALUES ($1, 'nap', 'default', 'pending', 0, $2::jsonb, clock_timestamp(),
                clock_timestamp(), clock_timestamp(), 3, '{{}}', '{{}}', clock_timestamp())
        RETURNING id
    )
    SELECT id, pg_notify($3::text, '') FROM ins
    """


@asynccontextmanager
async def insert_notify(dsn: str, schema: str, channel: str) -> AsyncIterator[Loop]:
    """A loop inserting ``k`` jobs per call, one INSERT + NOTIFY statement each, on one
    connection."""
    conn = await asyncpg.connect(dsn)
    try:
        statement = await conn.prepare(_insert_notify_sql(schema))

        async def run(k: int) -> None:
            for _ in range(k):
                await statement.fetchrow(uuid4(), json.dumps(NAP_PAYLOAD), channel)

        yield run
    finally:
        await conn.close()


@asynccontextmanager
async def copy(dsn: str, schema: str, channel: str) -> AsyncIterator[Loop]:
    """A loop COPYing ``k`` jobs per call in one transaction (clock read + NOTIFY + COPY)."""
    conn = await asyncpg.connect(dsn)

    async def run(k: int) -> None:
        async with conn.transaction():
            now: datetime = await conn.fetchval(
                "SELECT clock_timestamp() FROM pg_notify($1::text, '')", channel
            )
            records: list[tuple[Any, ...]] = [
                (
                    uuid4(),
                    "nap",
                    "default",
                    "pending",
                    0,
                    json.dumps(NAP_PAYLOAD),
                    now,
                    now,
                    now,
                    3,
                    "{}",
                    [],
                    now,
                )
                for _ in range(k)
            ]
            await conn.copy_records_to_table(
                "jobs", schema_name=schema, columns=list(_COLUMNS), records=records
            )

    try:
        yield run
    finally:
        await conn.close()


def _claim_sql(schema: str) -> str:
    s = check_identifier(schema)
    return f"""
    UPDATE {s}.jobs j
    SET status = 'running', attempt = j.attempt + 1, locked_by_worker = $1,
        lock_expires_at = clock_timestamp() + interval '5 minutes',
        started_at = clock_timestamp(), updated_at = clock_timestamp()
    WHERE j.id = ANY(ARRAY(
        SELECT id FROM {s}.jobs
        WHERE status = 'pending' AND queue = 'default' AND actor = 'nap'
          AND scheduled_at <= clock_timestamp()
        ORDER BY priority DESC, scheduled_at, id
        LIMIT $2
        FOR UPDATE SKIP LOCKED
    ))
    RETURNING j.id
    """


def _complete_sql(schema: str, audit: bool) -> str:
    s = check_identifier(schema)
    done = f"""
    UPDATE {s}.jobs j
    SET status = 'succeeded', finished_at = clock_timestamp(), updated_at = clock_timestamp(),
        locked_by_worker = NULL, lock_expires_at = NULL, result = 'null'
    WHERE j.id = ANY($1::uuid[]) AND j.status = 'running' AND j.locked_by_worker = $2
    RETURNING j.id, j.attempt, j.started_at, j.finished_at
    """
    if not audit:
        return done
    return f"""
    WITH done AS ({done}),
    attempts AS (
        INSERT INTO {s}.job_attempts
            (job_id, attempt, worker_id, started_at, finished_at, duration_ms, outcome)
        SELECT id, attempt, $2, started_at, finished_at,
               greatest((extract(epoch FROM finished_at - started_at) * 1000)::bigint, 0),
               'succeeded'
        FROM done
    )
    INSERT INTO {s}.job_events (job_id, kind, detail)
    SELECT d.id, 'state_change', t.detail
    FROM done d CROSS JOIN (VALUES
        ('{{"from_state": "pending", "to_state": "running"}}'::jsonb),
        ('{{"from_state": "running", "to_state": "succeeded"}}'::jsonb)
    ) AS t (detail)
    """


async def _drain_worker(dsn: str, schema: str, concurrency: int, audit: bool) -> None:
    worker_id = uuid4()
    claim_conn = await asyncpg.connect(dsn)
    complete_conn = await asyncpg.connect(dsn)
    claim = await claim_conn.prepare(_claim_sql(schema))
    complete_sql = _complete_sql(schema, audit)
    claimed: asyncio.Queue[list[UUID] | None] = asyncio.Queue()
    free = concurrency
    freed = asyncio.Event()

    async def completer() -> None:
        nonlocal free
        stopping = False
        while not stopping:
            ids: list[UUID] = []
            batch = await claimed.get()
            while batch is not None:
                ids.extend(batch)
                if claimed.empty():
                    break
                batch = claimed.get_nowait()
            stopping = batch is None
            if ids:  # one statement: its own transaction
                await complete_conn.execute(complete_sql, ids, worker_id)
                free += len(ids)
                freed.set()

    completing = asyncio.create_task(completer())
    try:
        while True:
            if free == 0:
                freed.clear()
                await freed.wait()
                continue
            ids = [r["id"] for r in await claim.fetch(worker_id, min(DISPATCH_BATCH, free))]
            if ids:
                free -= len(ids)
                claimed.put_nowait(ids)
            elif free == concurrency:
                break  # nothing in flight and nothing left to claim
            else:
                freed.clear()
                await freed.wait()
    finally:
        claimed.put_nowait(None)
        await completing
        await claim_conn.close()
        await complete_conn.close()


def _drain_process(dsn: str, schema: str, concurrency: int, audit: bool) -> None:
    asyncio.run(_drain_worker(dsn, schema, concurrency, audit))


def drain_name(workers: int, concurrency: int, audit: bool) -> str:
    """The scenario name of a floor drain."""
    return f"{'audit' if audit else 'sql'}_floor_drain_w{workers}_c{concurrency}"


async def drain(
    dsn: str, schema: str, n: int, workers: int, concurrency: int, audit: bool, time_limit: float
) -> Result:
    """Drain the ``n`` pending jobs of ``schema`` with ``workers`` processes."""
    context = multiprocessing.get_context("spawn")
    processes = [
        context.Process(target=_drain_process, args=(dsn, schema, concurrency, audit))
        for _ in range(workers)
    ]
    for process in processes:
        process.start()
    extra: dict[str, Any] = {"workers": workers, "concurrency": concurrency}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + time_limit
    for process in processes:
        await loop.run_in_executor(None, process.join, max(0.0, deadline - loop.time()))
    for process in processes:
        if process.is_alive():
            process.kill()
            process.join()
            extra["error"] = f"timed out after {time_limit:.0f} s"
        elif process.exitcode != 0 and "error" not in extra:
            extra["error"] = f"worker exited with {process.exitcode}"
    done, span = await drain_span(dsn, schema)
    if done != n and "error" not in extra:
        extra["error"] = f"only {done} of {n} jobs succeeded"
    return Result(drain_name(workers, concurrency, audit), n, span, extra)
