"""A rolling deploy on Postgres: workers of two releases share a queue, and each
dispatches only the jobs of the actors it runs (ADR 0006)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from taskq import TaskQ, actor
from taskq_testing.postgres import PgSchema
from tests.worker.running import running

pytestmark = pytest.mark.postgres

FAST = {"poll_interval": "50ms", "heartbeat_interval": "50ms", "lock_lease": "2s"}


@actor(name="deploy.old")
async def old(payload: dict[str, Any]) -> None:
    return None


@actor(name="deploy.new")
async def new(payload: dict[str, Any]) -> None:
    return None


async def test_a_new_actors_jobs_wait_for_a_worker_that_runs_it(pg_schema: PgSchema) -> None:
    old_release = TaskQ(pg_schema.dsn, schema=pg_schema.name, actors=[old])
    new_release = TaskQ(pg_schema.dsn, schema=pg_schema.name, actors=[old, new])
    async with old_release, new_release:
        async with running(old_release, FAST) as old_worker:
            jobs = [await new_release.client.enqueue(new, {}) for _ in range(5)]
            done = await old_release.client.enqueue(old, {})
            await new_release.client.wait_for_result(done.id, timeout=10)
            await asyncio.sleep(0.3)  # a few more of the old worker's dispatches
            # Not locked and handed back by a worker that cannot run them.
            for job in jobs:
                assert await new_release.client.get(job.id) == job
            async with running(new_release, FAST) as new_worker:
                for job in jobs:
                    await new_release.client.wait_for_result(job.id, timeout=10)
        for job in jobs:
            [attempt] = await new_release.client.get_attempts(job.id)
            assert (attempt.outcome, attempt.worker_id) == ("succeeded", new_worker.worker_id)
        # The old worker ran what it knows.
        [attempt] = await new_release.client.get_attempts(done.id)
        assert (attempt.outcome, attempt.worker_id) == ("succeeded", old_worker.worker_id)
