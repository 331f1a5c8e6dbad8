"""Job ids the client makes for a batch: random version-4 UUIDs, one per job, ascending
within the batch."""

from __future__ import annotations

import pickle
from datetime import timedelta
from typing import Any
from uuid import RFC_4122, UUID, SafeUUID, uuid4

from taskq import EnqueueItem, TaskQ, actor
from taskq.backend import Backend


@actor(name="plain")
async def plain(payload: dict[str, Any]) -> None:
    return None


async def test_a_batch_gets_distinct_version_4_ids_and_keeps_an_id_an_item_names() -> None:
    own = uuid4()
    async with TaskQ("memory://", actors=[plain]) as tq:
        rows = await tq.client.enqueue_batch(
            [
                *[(plain, {}) for _ in range(300)],
                EnqueueItem(actor="plain", payload={}, options={"job_id": own}),
                EnqueueItem(actor="plain", payload={}, options={"priority": 2}),
            ]
        )
        copied = await tq.client.enqueue_batch_fast([(plain, {}) for _ in range(300)])
        assert copied == 300
        stored = await tq.client.list_jobs(limit=1000)
    ids = [row.id for row in rows]
    assert ids[300] == own
    made = [job.id for job in stored if job.id != own]
    assert len(made) == 601 and len(set(made)) == 601
    assert all(i.version == 4 and i.variant == RFC_4122 for i in made)


async def test_a_one_job_enqueue_gets_a_fresh_version_4_id_that_behaves_as_any_uuid() -> None:
    async with TaskQ("memory://", actors=[plain]) as tq:
        first = await tq.client.enqueue(plain, {})
        second = await tq.client.enqueue(plain, {})
    assert first.id != second.id
    for made in (first.id, second.id):
        assert made.version == 4 and made.variant == RFC_4122
        parsed = UUID(str(made))
        assert parsed == made and hash(parsed) == hash(made)
        assert pickle.loads(pickle.dumps(made)) == made
        assert made.is_safe is SafeUUID.unknown


async def test_a_batchs_jobs_run_in_the_order_given_on_a_fifo_queue(
    taskq_backend: Backend,
) -> None:
    # They share their enqueue time and the dispatch breaks the tie by id: with random
    # ids a batch ran shuffled (about half its pairs out of order).
    tq = TaskQ("memory://", actors=[plain], backend=taskq_backend)
    async with tq:
        rows = await tq.client.enqueue_batch([(plain, {"n": n}) for n in range(40)])
        assert await tq.client.enqueue_batch_fast([(plain, {"n": n}) for n in range(40, 80)]) == 40
        taken = await taskq_backend.dispatch_batch(uuid4(), ["default"], 80, timedelta(minutes=5))
    assert [row.payload["n"] for row in rows] == list(range(40))
    assert [row.payload["n"] for row in taken] == list(range(80))


def test_ascending_ids_are_distinct_version_4_ids_each_above_the_last() -> None:
    from taskq.args_builder import AscendingIds

    runs = [AscendingIds(), AscendingIds()]
    made = [[ids() for _ in range(500)] for ids in runs]
    for run in made:
        assert run == sorted(run) and len(set(run)) == len(run)
        assert all(i.version == 4 and i.variant == RFC_4122 for i in run)
        assert UUID(str(run[0])) == run[0] and run[0].is_safe is SafeUUID.unknown
    # Two sequences start apart: their random start is drawn afresh.
    assert made[0][0] != made[1][0]
