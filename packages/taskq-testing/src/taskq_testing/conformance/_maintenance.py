"""The maintenance leader's optional backend members: result expiry, stale batches,
fleet statistics and the worker registry.

These members belong to optional protocols (``SupportsResultExpiry``,
``SupportsStaleBatchSweep``, ``SupportsFleetStats``, ``SupportsWorkerRegistry``);
a backend without one skips its tests.
"""

from __future__ import annotations

from datetime import timedelta
from uuid import uuid4

import pytest

from taskq.backend import Backend, JobStatus
from taskq.backend._protocol import (
    SupportsFleetStats,
    SupportsResultExpiry,
    SupportsStaleBatchSweep,
    SupportsWorkerRegistry,
)
from taskq.models import ActorConfig, BatchRow
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
    skip_unless_can_wait,
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


def _fleet_stats(backend: Backend) -> SupportsFleetStats:
    if not isinstance(backend, SupportsFleetStats):
        pytest.skip(f"{type(backend).__name__} does not implement SupportsFleetStats")
    return backend


def _worker_registry(backend: Backend) -> SupportsWorkerRegistry:
    if not isinstance(backend, SupportsWorkerRegistry):
        pytest.skip(f"{type(backend).__name__} does not implement SupportsWorkerRegistry")
    return backend


# Short enough for a real clock, with room between "fresh" and "stale" for a slow CI.
_STALE_AFTER = timedelta(milliseconds=300)
_STEP = timedelta(milliseconds=600)


class MaintenanceTests(TimeLimits):
    """``sweep_expired_results``, ``complete_stale_batches``, the fleet statistics and
    the worker registry."""

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

    @covers("enqueue", "dispatch_batch")
    async def test_queue_depths_counts_waiting_and_running_jobs_per_queue(
        self, backend: Backend
    ) -> None:
        stats = _fleet_stats(backend)
        queue, finished = f"depth-{uuid4().hex[:8]}", f"done-{uuid4().hex[:8]}"
        for _ in range(3):
            await backend.enqueue(make_args(queue=queue))
        await backend.enqueue(make_args(queue=queue, delay=FAR))
        worker = uuid4()
        assert len(await backend.dispatch_batch(worker, [queue], 1, LONG_LEASE)) == 1
        done = await enqueue_and_dispatch(backend, worker_id=worker, queue=finished)
        assert await backend.mark_succeeded(done.id, worker, None)

        depths = await stats.queue_depths()
        assert depths[queue] == {"pending": 2, "scheduled": 1, "running": 1}
        # A queue whose jobs all finished has no depth to report.
        assert finished not in depths

    @covers("register_actors")
    async def test_stranded_jobs_counts_waiting_jobs_of_unregistered_actors(
        self, backend: Backend
    ) -> None:
        stats = _fleet_stats(backend)
        tag = uuid4().hex[:8]
        known, gone, busy = f"known-{tag}", f"gone-{tag}", f"busy-{tag}"
        await backend.register_actors([ActorConfig(actor=known)])
        await backend.enqueue(make_args(actor=known))
        await backend.enqueue(make_args(actor=gone))
        await backend.enqueue(make_args(actor=gone, delay=FAR))
        # Already running: a worker that still has the actor took it, nothing is stranded.
        await enqueue_and_dispatch(backend, worker_id=uuid4(), actor=busy)

        stranded = await stats.stranded_jobs()
        assert stranded[gone] == 2
        assert known not in stranded
        assert busy not in stranded

    async def test_worker_registry_registers_touches_deregisters_and_sweeps(
        self, backend: Backend, advance_time: AdvanceTime
    ) -> None:
        registry = _worker_registry(backend)
        skip_unless_can_wait(_STEP, self.max_advance, "two stale-worker steps")
        live, dead, gone, again = uuid4(), uuid4(), uuid4(), uuid4()
        for worker in (live, dead, gone, again):
            await registry.register_worker(worker, "host-a", 4242, ["default", "other"])
        assert await registry.cleanup_stale_workers(FAR) == 0

        await advance_time(_STEP)
        assert await registry.touch_worker(live)
        await registry.deregister_worker(gone)
        # Registering again is an upsert that counts as being seen.
        await registry.register_worker(again, "host-b", 4343, [])
        assert await registry.cleanup_stale_workers(_STALE_AFTER) == 1  # dead only

        await advance_time(_STEP)
        assert await registry.cleanup_stale_workers(_STALE_AFTER) == 2  # live, again
        assert await registry.cleanup_stale_workers(_STALE_AFTER) == 0
        # Rows that are gone make the per-worker calls no-ops, not errors; a touch
        # says the row is gone, so that its worker can register again.
        assert not await registry.touch_worker(dead)
        await registry.deregister_worker(dead)
