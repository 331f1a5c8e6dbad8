"""The leader's housekeeping loops on a real worker: result expiry, stale batches and
batch pruning after Sweep 5."""

from __future__ import annotations

from collections.abc import AsyncIterator
from uuid import uuid4

import pytest
import pytest_asyncio

from taskq import TaskQ
from taskq_testing.postgres import PgSchema
from tests.apps import basic
from tests.leader.conftest import Spawn, wait_until

pytestmark = pytest.mark.postgres


@pytest_asyncio.fixture
async def tq(pg_schema: PgSchema) -> AsyncIterator[TaskQ]:
    app = TaskQ(pg_schema.dsn, schema=pg_schema.name, actors=basic.tq.actors.values())
    async with app:
        yield app


async def test_the_leader_clears_expired_results_and_completes_stale_batches(
    tq: TaskQ, spawn: Spawn
) -> None:
    backend = tq.backend
    short = await tq.client.enqueue(basic.nap, {"tag": "short"}, result_ttl=0.5)
    kept = await tq.client.enqueue(basic.nap, {"tag": "kept"}, result_ttl=3600)
    # An empty tracked batch: no terminal hook will ever complete it.
    stale = uuid4()
    await backend.create_batch(stale, "default", 0, None, None, None)
    worker = spawn(
        env={
            "TASKQ_RESULT_EXPIRY_INTERVAL": "100ms",
            "TASKQ_STALE_BATCH_INTERVAL": "100ms",
            "TASKQ_STALE_BATCH_GRACE": "200ms",
        }
    )

    async def result_cleared() -> bool:
        row = await tq.client.get(short.id)
        return row is not None and row.finished_at is not None and row.result is None

    await wait_until(result_cleared)
    still = await tq.client.get(kept.id)
    assert still is not None and still.result == {"tag": "kept", "attempt": 1}

    async def batch_completed() -> bool:
        row = await backend.get_batch(stale)
        return row is not None and row.status == "complete"

    await wait_until(batch_completed)

    async def both_logged() -> bool:  # a sweep's log line follows its commit
        swept = {
            key
            for record in worker.events("taskq.leader-swept")
            for key in record
            if key in {"results_expired", "stale_batches_completed"}
        }
        return swept == {"results_expired", "stale_batches_completed"}

    await wait_until(both_logged, seconds=5)


async def test_prune_deletes_finished_batches_after_their_jobs(tq: TaskQ, spawn: Spawn) -> None:
    backend = tq.backend
    done, waiting = uuid4(), uuid4()
    for batch_id in (done, waiting):
        await backend.create_batch(batch_id, "default", 0, None, None, None)
    await backend.complete_batch(done)
    # A child still in the jobs table keeps its finished batch's row.
    child = await tq.client.enqueue(basic.nap, {}, delay=3600, metadata={"batch_id": str(waiting)})
    await backend.complete_batch(waiting)
    zero = {
        f"TASKQ_PRUNE_RETENTION_{status}": "0"
        for status in ("SUCCEEDED", "FAILED", "CANCELLED", "CRASHED", "ABANDONED")
    }
    worker = spawn(env={"TASKQ_PRUNE_INTERVAL": "100ms", **zero})

    async def pruned() -> bool:
        return await backend.get_batch(done) is None

    await wait_until(pruned)
    assert await backend.get_batch(waiting) is not None
    assert await tq.client.get(child.id) is not None

    async def logged() -> bool:  # the prune's log line follows its commit
        return any(r.get("batches_pruned") for r in worker.events("taskq.leader-swept"))

    await wait_until(logged, seconds=5)
