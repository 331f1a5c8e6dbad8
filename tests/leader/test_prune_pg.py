"""Sweeps 5 and 6 on Postgres: prune terminal jobs into the archive, then expire it."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from taskq import JobStatus, TaskQ
from taskq_testing.postgres import PgSchema
from tests.apps import basic
from tests.leader.conftest import Spawn

pytestmark = pytest.mark.postgres


async def test_prune_moves_exactly_the_eligible_jobs_and_expiry_deletes_them(
    pg_schema: PgSchema, spawn: Spawn
) -> None:
    tq = TaskQ(pg_schema.dsn, schema=pg_schema.name, actors=basic.tq.actors.values())
    async with tq:
        done = [await tq.client.enqueue(basic.nap, {"seconds": 0}) for _ in range(3)]
        failed = await tq.client.enqueue(basic.too_slow, {})
        worker = spawn("--until-idle")
        await asyncio.to_thread(worker.proc.wait, 60)
        assert worker.proc.returncode == 0
        waiting = await tq.client.enqueue(basic.nap, {}, delay=3600)
        backend = tq.backend
        s = pg_schema.name
        moved = await backend.prune_terminal_jobs(  # type: ignore[attr-defined]
            {"succeeded": timedelta(0)}, archive_retention=timedelta(0), batch_size=2
        )
        assert moved == 3
        async with backend.connection() as conn:  # type: ignore[attr-defined]
            archived = {r["id"] for r in await conn.fetch(f"SELECT id FROM {s}.jobs_archive")}
            attempts = await conn.fetchval(f"SELECT count(*) FROM {s}.job_attempts_archive")
        assert archived == {j.id for j in done}
        assert attempts == 3
        for job in done:
            assert await tq.client.get(job.id) is None
        kept = await tq.client.get(failed.id)
        assert kept is not None and kept.status is JobStatus.FAILED
        assert await tq.client.get(waiting.id) is not None

        assert await backend.expire_archive(batch_size=2) == 3  # type: ignore[attr-defined]
        async with backend.connection() as conn:  # type: ignore[attr-defined]
            assert await conn.fetchval(f"SELECT count(*) FROM {s}.jobs_archive") == 0
            assert await conn.fetchval(f"SELECT count(*) FROM {s}.job_attempts_archive") == 0
