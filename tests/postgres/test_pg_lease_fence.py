"""The lease fence on Postgres: a worker cut off by the network stops its job before
the leader reclaims it for another worker, so the job never runs twice at once."""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import urlsplit
from uuid import UUID

import pytest

from taskq import Context, JobRow, JobStatus, TaskQ, actor
from taskq_testing.faults import TcpProxy
from taskq_testing.postgres import PgSchema
from tests.worker.running import running

pytestmark = pytest.mark.postgres

SETTINGS = {
    "poll_interval": "50ms",
    "heartbeat_interval": "500ms",
    "lock_lease": "2s",
    "dispatcher_command_timeout": "300ms",
    "maintenance_interval": "100ms",
}


async def _until_succeeded(tq: TaskQ, job_id: UUID) -> JobRow:
    async with asyncio.timeout(15):
        while (row := await tq.client.get(job_id)) is None or row.status is not JobStatus.SUCCEEDED:  # noqa: ASYNC110 - the stored row
            await asyncio.sleep(0.05)
    return row


@pytest.mark.parametrize("fence", [True, False], ids=["fenced", "unfenced"])
async def test_a_cut_off_worker_stops_its_job_before_another_worker_runs_it(
    pg_schema: PgSchema, fence: bool
) -> None:
    spans: dict[int, list[float]] = {}  # attempt -> [started, ended]
    second_started = asyncio.Event()

    @actor(name="exclusive", max_attempts=3)
    async def exclusive(payload: dict[str, Any], ctx: Context) -> str:
        span = spans[ctx.attempt] = [asyncio.get_running_loop().time()]
        try:
            if ctx.attempt == 1:
                await asyncio.sleep(8)  # cut off meanwhile
            else:
                second_started.set()
            return "done"
        finally:
            span.append(asyncio.get_running_loop().time())

    with TcpProxy(urlsplit(pg_schema.dsn).port or 5432) as proxy:
        cut_off = TaskQ(proxy.through(pg_schema.dsn), schema=pg_schema.name, actors=[exclusive])
        healthy = TaskQ(pg_schema.dsn, schema=pg_schema.name, actors=[exclusive])
        async with healthy, cut_off:
            job = await healthy.client.enqueue(exclusive, {})
            async with running(cut_off, {**SETTINGS, "lease_fence": fence}, stop_within=20):
                async with asyncio.timeout(10):
                    while 1 not in spans:  # noqa: ASYNC110 - the actor's own record
                        await asyncio.sleep(0.02)
                proxy.cut()
                # The healthy worker leads once the cut one's session (and lock) is gone,
                # and reclaims the job when its lease has lapsed.
                async with running(healthy, SETTINGS, stop_within=20):
                    await asyncio.wait_for(second_started.wait(), 15)
                    row = await _until_succeeded(healthy, job.id)
                    if fence:
                        first_ended, second_began = spans[1][-1], spans[2][0]
                        assert len(spans[1]) == 2 and first_ended < second_began
                    else:  # the cut-off worker knows nothing yet: both ran at once
                        assert len(spans[1]) == 1
                proxy.restore()
        assert row.attempt == 2
