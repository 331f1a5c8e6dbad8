"""Sweeps 5 and 6 on Postgres: where the pruned rows land.

Which jobs move and which archived jobs expire is specified once, for every
backend, by the conformance suite (``MaintenanceTests``); this checks the
Postgres archive tables behind it, on jobs a real worker ran.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from uuid import uuid4

import pytest

from taskq import EnqueueArgs, TaskQ
from taskq_postgres import PostgresBackend
from taskq_testing.postgres import PgSchema
from tests.apps import basic
from tests.leader.conftest import Spawn

pytestmark = pytest.mark.postgres

_ARCHIVE_RETENTION = timedelta(days=3)


async def test_pruned_jobs_and_attempts_land_in_the_archive_tables_until_expiry(
    pg_schema: PgSchema, spawn: Spawn
) -> None:
    tq = TaskQ(pg_schema.dsn, schema=pg_schema.name, actors=basic.tq.actors.values())
    async with tq:
        enqueued = [await tq.client.enqueue(basic.nap, {"seconds": 0}) for _ in range(3)]
        worker = spawn("--until-idle")
        await asyncio.to_thread(worker.proc.wait, 60)
        assert worker.proc.returncode == 0
        done = {job.id: await tq.client.get(job.id) for job in enqueued}
        backend = tq.backend
        assert isinstance(backend, PostgresBackend)
        s = pg_schema.name

        moved = await backend.prune_terminal_jobs(
            {"succeeded": timedelta(0)}, archive_retention=_ARCHIVE_RETENTION, batch_size=2
        )
        assert moved == 3
        async with backend.connection() as conn:
            archived = await conn.fetch(
                f"SELECT id, status::text, finished_at, archived_at, expire_at "
                f"FROM {s}.jobs_archive"
            )
            attempts = await conn.fetch(
                f"SELECT job_id, attempt, outcome FROM {s}.job_attempts_archive"
            )
            left = await conn.fetchval(
                f"SELECT (SELECT count(*) FROM {s}.job_attempts) "
                f"+ (SELECT count(*) FROM {s}.job_events)"
            )
        assert {r["id"] for r in archived} == set(done)
        for r in archived:
            job = done[r["id"]]
            assert job is not None
            assert r["status"] == "succeeded"
            assert r["finished_at"] == job.finished_at
            assert r["expire_at"] - r["archived_at"] == _ARCHIVE_RETENTION
        assert sorted((r["job_id"], r["attempt"], r["outcome"]) for r in attempts) == sorted(
            (job_id, 1, "succeeded") for job_id in done
        )
        assert left == 0  # events are not archived, and the attempts moved

        # Let the archive come due without waiting three days.
        async with backend.connection() as conn:
            await conn.execute(
                f"UPDATE {s}.jobs_archive SET expire_at = clock_timestamp() - interval '1 s'"
            )
        assert await backend.expire_archive(batch_size=2) == 3
        async with backend.connection() as conn:
            assert await conn.fetchval(f"SELECT count(*) FROM {s}.jobs_archive") == 0
            # By cascade.
            assert await conn.fetchval(f"SELECT count(*) FROM {s}.job_attempts_archive") == 0


async def test_an_id_archived_again_replaces_the_earlier_job_and_its_attempts(
    pg_schema: PgSchema,
) -> None:
    backend = PostgresBackend(pg_schema.dsn, schema=pg_schema.name)
    await backend.open()
    try:
        job_id, worker = uuid4(), uuid4()
        lease = timedelta(minutes=1)
        for outcome in ("first", "second"):
            await backend.enqueue(EnqueueArgs(id=job_id, actor="a", payload={"run": outcome}))
            (job,) = await backend.dispatch_batch(worker, ["default"], 1, lease)
            assert await backend.mark_succeeded(job.id, worker, outcome, attempt=job.attempt)
            assert (
                await backend.prune_terminal_jobs(
                    {"succeeded": timedelta(0)}, archive_retention=_ARCHIVE_RETENTION
                )
                == 1
            )
        s = pg_schema.name
        async with backend.connection() as conn:
            archived = await conn.fetch(f"SELECT id, result::text FROM {s}.jobs_archive")
            attempts = await conn.fetch(f"SELECT job_id, archived_at FROM {s}.job_attempts_archive")
            archived_at = await conn.fetchval(f"SELECT archived_at FROM {s}.jobs_archive")
        assert [(r["id"], r["result"]) for r in archived] == [(job_id, '"second"')]
        assert [(r["job_id"], r["archived_at"]) for r in attempts] == [(job_id, archived_at)]
    finally:
        await backend.close()
