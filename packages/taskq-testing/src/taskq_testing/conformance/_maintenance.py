"""The maintenance leader's optional backend sweeps: result expiry and stale batches.

These members belong to optional protocols (``SupportsResultExpiry``,
``SupportsStaleBatchSweep``); a backend without one skips its tests.
"""

from __future__ import annotations

from datetime import timedelta
from uuid import uuid4

import pytest

from taskq.backend import Backend, JobStatus
from taskq.backend._protocol import SupportsResultExpiry, SupportsStaleBatchSweep
from taskq.models import BatchRow
from taskq_testing.conformance._support import (
    FAR,
    LONG_LEASE,
    AdvanceTime,
    TimeLimits,
    assert_close,
    covers,
    enqueue_and_dispatch,
    fetch,
    make_args,
)

_SHORT_TTL = timedelta(milliseconds=500)


def _result_expiry(backend: Backend) -> SupportsResultExpiry:
    if not isinstance(backend, SupportsResultExpiry):
        pytest.skip(f"{type(backend).__name__} does not implement SupportsResultExpiry")
    return backend


def _stale_batch_sweep(backend: Backend) -> SupportsStaleBatchSweep:
    if not isinstance(backend, SupportsStaleBatchSweep):
        pytest.skip(f"{type(backend).__name__} does not implement SupportsStaleBatchSweep")
    return backend


class MaintenanceTests(TimeLimits):
    """``sweep_expired_results`` and ``complete_stale_batches``."""

    @covers("mark_succeeded")
    async def test_sweep_expired_results_clears_only_expired_results(
        self, backend: Backend, advance_time: AdvanceTime
    ) -> None:
        sweeper = _result_expiry(backend)
        worker = uuid4()
        short = await enqueue_and_dispatch(backend, worker_id=worker, result_ttl=_SHORT_TTL)
        long = await enqueue_and_dispatch(backend, worker_id=worker, result_ttl=FAR)
        for job in (short, long):
            assert await backend.mark_succeeded(job.id, worker, {"answer": 42})
        assert await sweeper.sweep_expired_results() == 0

        await advance_time(_SHORT_TTL * 2)
        before = await fetch(backend, short.id)
        events = await backend.get_events(short.id)
        assert await sweeper.sweep_expired_results() == 1
        cleared = await fetch(backend, short.id)
        assert cleared.result is None
        assert cleared.status is JobStatus.SUCCEEDED
        assert cleared.result_expires_at == before.result_expires_at
        assert (await fetch(backend, long.id)).result == {"answer": 42}
        assert await backend.get_events(short.id) == events  # not a transition
        # Idempotent: a cleared result is not counted again.
        assert await sweeper.sweep_expired_results() == 0

    @covers("complete_batch", "enqueue_batch_atomic", "create_batch")
    async def test_complete_stale_batches_completes_only_batches_with_no_active_child(
        self, backend: Backend
    ) -> None:
        sweeper = _stale_batch_sweep(backend)
        queue = f"stale-{uuid4().hex[:8]}"
        done_id, busy_id, empty_id = uuid4(), uuid4(), uuid4()
        finalizer = make_args(actor="conformance.finalizer", queue=queue)
        [done_child] = await backend.enqueue_batch_atomic(
            [make_args(queue=queue)],
            batch_id=done_id,
            queue=queue,
            batch_row=BatchRow(id=done_id, queue=queue, expected_size=1),
            finalizer_args=finalizer,
        )
        worker = uuid4()
        [running] = await backend.dispatch_batch(worker, [queue], 10, LONG_LEASE)
        assert running.id == done_child.id
        # The child finished but its terminal hook never ran: the batch stays active.
        assert await backend.mark_succeeded(done_child.id, worker, None)
        await backend.enqueue_batch_atomic(
            [make_args(queue=f"{queue}-busy")],
            batch_id=busy_id,
            queue=queue,
            batch_row=BatchRow(id=busy_id, queue=queue, expected_size=1),
            finalizer_args=None,
        )
        await backend.create_batch(empty_id, queue, 0, None, None, None)
        aborted_id = uuid4()
        await backend.create_batch(aborted_id, queue, 0, None, None, None)
        await backend.abort_batch(aborted_id)
        aborted = await backend.get_batch(aborted_id)

        assert await sweeper.complete_stale_batches() == 2
        done = await backend.get_batch(done_id)
        assert done is not None and done.status == "complete"
        released = await fetch(backend, finalizer.id)
        assert released.status is JobStatus.PENDING
        assert_close(released.scheduled_at, done.completed_at)
        empty = await backend.get_batch(empty_id)
        assert empty is not None and empty.status == "complete"
        busy = await backend.get_batch(busy_id)
        assert busy is not None and busy.status == "active"
        assert await backend.get_batch(aborted_id) == aborted
        assert await sweeper.complete_stale_batches() == 0
