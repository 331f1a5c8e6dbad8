"""The record of the slotted leader loops' runs on Postgres (``maintenance_runs``): a
leader elected after a prune slot no leader ran runs it at once and records it."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from taskq import TaskQ
from taskq_postgres import PostgresBackend
from taskq_testing import TEST_SETTINGS, run_until_idle
from taskq_testing.postgres import PgSchema
from tests.apps import basic
from tests.worker.running import running

pytestmark = pytest.mark.postgres


async def test_a_leader_elected_after_a_missed_prune_runs_it_and_records_it(
    pg_schema: PgSchema,
) -> None:
    tq = TaskQ(pg_schema.dsn, schema=pg_schema.name, actors=basic.tq.actors.values())
    async with tq:
        backend = tq.backend
        assert isinstance(backend, PostgresBackend)
        # Today's slot passed two seconds ago (database clock) with no leader to run it.
        slot = (await backend.now()).replace(microsecond=0) - timedelta(seconds=2)
        assert await backend.record_maintenance_run("leader-prune", slot - timedelta(days=1))
        job = await tq.client.enqueue(basic.nap, basic.Sleep())
        await run_until_idle(tq)
        settings = {
            **TEST_SETTINGS,
            "prune_at": slot.time().isoformat(),
            "prune_retention_succeeded": "1ms",
        }
        async with running(tq, settings):
            async with asyncio.timeout(10):
                while await tq.client.get(job.id) is not None:  # noqa: ASYNC110 - polling the store
                    await asyncio.sleep(0.05)
                while await backend.last_maintenance_run("leader-prune") != slot:  # noqa: ASYNC110 - polling the store
                    await asyncio.sleep(0.05)
