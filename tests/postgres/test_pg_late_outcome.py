"""A late outcome on Postgres: an attempt's outcome write refused because the reclaim
took the job meanwhile is kept as a ``late_outcome`` event, as on the in-memory backend
(tests/worker/test_worker_memory.py, ``_reclaimed_before``)."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import asyncpg
import pytest

from taskq import JobStatus, TaskQ, WorkerSettings, actor
from taskq.worker import Worker
from taskq_postgres import PostgresBackend
from taskq_testing import TEST_SETTINGS
from taskq_testing.postgres import PgSchema

pytestmark = pytest.mark.postgres


class _ReclaimedBeforeTheWriteOff(PostgresBackend):
    """The first ``mark_failed_or_retry`` meets the job reclaimed: its lease is made to
    have lapsed (the worker frozen or cut off) and the backend's own reclaim sweep takes
    it just before the write. The worker's lease renewals wait meanwhile, so none can
    renew the lease between the two. ``reclaimed`` counts the jobs the sweep took."""

    def __init__(self, schema: PgSchema) -> None:
        super().__init__(schema.dsn, schema=schema.name)
        self._pg = schema
        self._quiet = asyncio.Lock()
        self.reclaimed: int | None = None

    async def heartbeat_jobs(self, *args: Any, **kwargs: Any) -> Any:
        async with self._quiet:
            return await super().heartbeat_jobs(*args, **kwargs)

    async def renew_leases(self, *args: Any, **kwargs: Any) -> Any:
        async with self._quiet:
            return await super().renew_leases(*args, **kwargs)

    async def mark_failed_or_retry(self, *args: Any, **kwargs: Any) -> Any:
        if self.reclaimed is None:
            async with self._quiet:
                conn = await asyncpg.connect(self._pg.dsn)
                try:
                    await conn.execute(
                        f"UPDATE {self._pg.name}.jobs"
                        " SET lock_expires_at = clock_timestamp() - interval '1 hour'"
                        " WHERE id = $1 AND status = 'running'",
                        args[0],
                    )
                finally:
                    await conn.close()
                self.reclaimed = await self.reclaim_expired_locks(timedelta(0), timedelta(0))
        return await super().mark_failed_or_retry(*args, **kwargs)


async def test_a_failure_past_a_limit_refused_after_a_reclaim_is_kept_as_a_late_outcome(
    pg_pooled_schema: PgSchema,
) -> None:
    # The cancel controller's write-off of an attempt still running past its timeout,
    # refused: the reclaim ended the attempt crashed, and the worker's verdict is kept.
    started = asyncio.Event()

    @actor(name="late.pg_past_its_timeout", max_attempts=1, timeout=0.1)
    async def stubborn(payload: dict[str, Any]) -> str:
        started.set()
        loop = asyncio.get_running_loop()
        end = loop.time() + 1.0
        while loop.time() < end:
            try:
                await asyncio.sleep(0.02)
            except asyncio.CancelledError:
                continue  # ignores every cancellation for a second
        return "late"

    backend = _ReclaimedBeforeTheWriteOff(pg_pooled_schema)
    tq = TaskQ(
        pg_pooled_schema.dsn, schema=pg_pooled_schema.name, actors=[stubborn], backend=backend
    )
    settings = {
        **TEST_SETTINGS,
        "cancellation_grace_period": "100ms",
        "cleanup_grace_period": "100ms",
        "queues": ["default"],
        "until_idle": True,
    }
    async with tq:
        job = await tq.client.enqueue(stubborn, {})
        worker = Worker(tq, WorkerSettings.load(settings, env={}))
        await asyncio.wait_for(worker.run(), 20)
        await asyncio.gather(*worker.lingering_tasks())
        row = await tq.client.get(job.id)
        attempts = await tq.client.get_attempts(job.id)
        events = await tq.client.get_events(job.id)
    assert started.is_set()
    assert backend.reclaimed == 1
    assert row is not None and row.status is JobStatus.CRASHED  # the reclaim's verdict
    assert [a.outcome for a in attempts] == ["crashed"]
    [late] = [e.detail for e in events if e.kind == "late_outcome"]
    assert late["outcome"] == "failed" and late["error_class"] == "TimeoutError"
    assert "still running" in late["error_message"]
    assert (late["attempt"], late["worker_id"]) == (1, str(attempts[0].worker_id))
