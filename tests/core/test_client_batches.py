"""The tracked batches API.md lists on ``JobsClient``, read through the client on every
backend."""

from __future__ import annotations

from typing import Any
from uuid import uuid4

import pytest

from taskq import BatchFilter, JobStatus, TaskQ, actor
from taskq.backend import Backend
from taskq.models import BatchRow, EnqueueArgs


@actor(name="batches.child", queue="jobs")
async def child(payload: dict[str, Any]) -> None:
    return None


async def test_tracked_batches_are_read_through_the_client(taskq_backend: Backend) -> None:
    tq = TaskQ("memory://", actors=[child], backend=taskq_backend)
    batch_id = uuid4()
    await taskq_backend.enqueue_batch_atomic(
        [EnqueueArgs(actor=child.name, queue="jobs", payload={}) for _ in range(2)],
        batch_id=batch_id,
        queue="jobs",
        batch_row=BatchRow(id=batch_id, queue="jobs", expected_size=2, failure_threshold=1),
        finalizer_args=None,
    )
    # Before, each was an AttributeError: API.md names them, only the backend had them.
    row = await tq.client.get_batch(str(batch_id))
    assert row is not None and (row.id, row.status) == (batch_id, "active")
    assert await tq.client.get_batch(uuid4()) is None
    [(listed, counts)] = await tq.client.list_batches(queue="jobs", active=True)
    assert listed == row
    assert (counts.total, counts.by_status[JobStatus.PENDING]) == (2, 2)
    assert await tq.client.list_batches(BatchFilter(active=False)) == []
    with pytest.raises(TypeError, match="a BatchFilter or filter keywords, not both"):
        await tq.client.list_batches(BatchFilter(), queue="jobs")
    with pytest.raises(TypeError, match="filters is a BatchFilter, not dict"):
        await tq.client.list_batches({"queue": "jobs"})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="is not a batch id"):
        await tq.client.get_batch("batch-1")
