"""The maintenance leader's optional backend members: result expiry, stale batches,
fleet statistics, the worker registry, and pruning into the archive.

These members belong to optional protocols (``SupportsResultExpiry``,
``SupportsStaleBatchSweep``, ``SupportsFleetStats``, ``SupportsWorkerRegistry``,
``SupportsPrune``); a backend without one skips its tests.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from uuid import UUID, uuid4

import pytest

from taskq import JobsClient, ResultExpiredError
from taskq.backend import Backend, JobStatus
from taskq.backend._protocol import (
    SupportsFleetStats,
    SupportsPrune,
    SupportsResultExpiry,
    SupportsStaleBatchSweep,
    SupportsWorkerRegistry,
)
from taskq.models import ActorConfig, BatchRow, ErrorInfo
from taskq_testing.conformance._support import (
    ERROR,
    FAR,
    LONG_LEASE,
    TICK,
    AdvanceTime,
    TimeLimits,
    assert_close,
    assert_utc,
    covers,
    enqueue_and_dispatch,
    fetch,
    make_args,
    reach,
    skip_unless_can_wait,
)

_SHORT_TTL = timedelta(milliseconds=500)
_ZERO = timedelta(0)


def _result_expiry(backend: Backend) -> SupportsResultExpiry:
    if not isinstance(backend, SupportsResultExpiry):
        pytest.skip(f"{type(backend).__name__} does not implement SupportsResultExpiry")
    return backend


def _stale_batch_sweep(backend: Backend) -> SupportsStaleBatchSweep:
    if not isinstance(backend, SupportsStaleBatchSweep):
        pytest.skip(f"{type(backend).__name__} does not implement SupportsStaleBatchSweep")
    return backend


async def _past_batch_grace(backend: Backend, advance_time: AdvanceTime) -> None:
    """Let the stale-batch sweep's grace (``stale_batch_grace`` on TaskQ's backends; none
    on a backend without one) pass."""
    await advance_time(getattr(backend, "stale_batch_grace", _ZERO) + TICK)


def _fleet_stats(backend: Backend) -> SupportsFleetStats:
    if not isinstance(backend, SupportsFleetStats):
        pytest.skip(f"{type(backend).__name__} does not implement SupportsFleetStats")
    return backend


def _worker_registry(backend: Backend) -> SupportsWorkerRegistry:
    if not isinstance(backend, SupportsWorkerRegistry):
        pytest.skip(f"{type(backend).__name__} does not implement SupportsWorkerRegistry")
    return backend


def _prune(backend: Backend) -> SupportsPrune:
    if not isinstance(backend, SupportsPrune):
        pytest.skip(f"{type(backend).__name__} does not implement SupportsPrune")
    return backend


async def _reclaimed_job_ids(backend: Backend) -> set[UUID]:
    return {e.job_id for e in await backend.poll_reclaim_events(0, 1000, visibility_delay=_ZERO)}


# Short enough for a real clock, with room between "fresh" and "stale" for a slow CI.
_STALE_AFTER = timedelta(milliseconds=300)
_STEP = timedelta(milliseconds=600)


class MaintenanceTests(TimeLimits):
    """``sweep_expired_results``, ``complete_stale_batches``, the fleet statistics, the
    worker registry, ``prune_terminal_jobs`` and ``expire_archive``."""

    @covers("mark_succeeded", "sweep_expired_results")
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

    @covers("mark_succeeded", "now", "get")
    async def test_wait_for_result_tells_an_expired_result_from_a_none_returned(
        self, backend: Backend, advance_time: AdvanceTime
    ) -> None:
        sweeper = _result_expiry(backend)
        if not isinstance(backend, SupportsPrune):  # no clock to read: the row answers
            pytest.skip(f"{type(backend).__name__} does not implement SupportsPrune (now)")
        client = JobsClient(backend, {})
        worker = uuid4()
        short = await enqueue_and_dispatch(backend, worker_id=worker, result_ttl=_SHORT_TTL)
        kept = await enqueue_and_dispatch(backend, worker_id=worker)
        assert await backend.mark_succeeded(short.id, worker, {"answer": 42})
        assert await backend.mark_succeeded(kept.id, worker, None)
        assert await client.wait_for_result(short.id, timeout=0) == {"answer": 42}

        await advance_time(_SHORT_TTL * 2)
        # Past result_expires_at on the backend's clock, swept yet or not.
        with pytest.raises(ResultExpiredError, match="result expired at") as expired:
            await client.wait_for_result(short.id, timeout=0)
        assert expired.value.row.id == short.id
        assert await sweeper.sweep_expired_results() >= 1
        with pytest.raises(ResultExpiredError):
            await client.wait_for_result(short.id, timeout=0)
        assert await client.wait_for_result(kept.id, timeout=0) is None

    @covers("complete_batch", "enqueue_batch_atomic", "create_batch", "complete_stale_batches")
    async def test_complete_stale_batches_completes_only_batches_with_no_active_child(
        self, backend: Backend, advance_time: AdvanceTime
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

        await _past_batch_grace(backend, advance_time)
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

    @covers("complete_stale_batches", "increment_batch_failures", "create_batch")
    async def test_a_stale_batch_whose_streak_reached_its_threshold_is_aborted(
        self, backend: Backend, advance_time: AdvanceTime
    ) -> None:
        # Its children all ended, the last failure's abort was lost (the worker died):
        # the sweep completed it, and complete_batch itself leaves such a batch alone.
        sweeper = _stale_batch_sweep(backend)
        batch_id = uuid4()
        await backend.create_batch(batch_id, f"stale-{uuid4().hex[:8]}", 0, 2, None, None)
        await backend.increment_batch_failures(batch_id)
        await backend.increment_batch_failures(batch_id)
        await _past_batch_grace(backend, advance_time)
        assert await sweeper.complete_stale_batches() == 1
        batch = await backend.get_batch(batch_id)
        assert batch is not None and batch.status == "aborted" and batch.completed_at is not None

    @covers("complete_stale_batches", "enqueue_batch_atomic", "mark_failed_or_retry")
    async def test_a_stale_batch_whose_last_children_failed_is_aborted(
        self, backend: Backend, advance_time: AdvanceTime
    ) -> None:
        # Their hooks were lost (the worker died): the sweep ends the batch as
        # complete_batch would, by its children's failures since its last success.
        sweeper = _stale_batch_sweep(backend)
        queue, batch_id = f"stale-{uuid4().hex[:8]}", uuid4()
        await backend.enqueue_batch_atomic(
            [make_args(queue=queue) for _ in range(2)],
            batch_id=batch_id,
            queue=queue,
            batch_row=BatchRow(id=batch_id, queue=queue, expected_size=2, failure_threshold=2),
            finalizer_args=None,
        )
        error = ErrorInfo(error_class="RuntimeError", message="child failed")
        for _ in range(2):
            worker = uuid4()
            [child] = await backend.dispatch_batch(worker, [queue], 1, LONG_LEASE)
            await backend.mark_failed_or_retry(child.id, worker, error, None)
        await _past_batch_grace(backend, advance_time)
        assert await sweeper.complete_stale_batches() == 1
        batch = await backend.get_batch(batch_id)
        assert batch is not None and batch.status == "aborted"

    @covers("complete_stale_batches", "increment_batch_failures", "enqueue_batch_atomic")
    async def test_a_batch_whose_abort_was_lost_is_aborted_with_children_left(
        self, backend: Backend, advance_time: AdvanceTime
    ) -> None:
        # The failure that reached the threshold was counted, its abort lost (the worker
        # died, the database was away): the sweep waited for every child to end, so the
        # children the abort cancels all ran, and the finalizer waited for them.
        sweeper = _stale_batch_sweep(backend)
        queue, batch_id = f"stale-{uuid4().hex[:8]}", uuid4()
        finalizer = make_args(actor="conformance.finalizer", queue=queue)
        waiting = await backend.enqueue_batch_atomic(
            [make_args(queue=queue) for _ in range(2)],
            batch_id=batch_id,
            queue=queue,
            batch_row=BatchRow(id=batch_id, queue=queue, expected_size=2, failure_threshold=1),
            finalizer_args=finalizer,
        )
        assert (await backend.increment_batch_failures(batch_id))[:2] == (1, 1)
        await _past_batch_grace(backend, advance_time)
        assert await sweeper.complete_stale_batches() == 1
        batch = await backend.get_batch(batch_id)
        assert batch is not None and batch.status == "aborted"
        for child in waiting:
            row = await fetch(backend, child.id)
            assert row.status is JobStatus.CANCELLED
            assert row.error is not None and row.error.error_class == "BatchAborted"
        assert (await fetch(backend, finalizer.id)).status is JobStatus.PENDING

    @covers("complete_stale_batches", "increment_batch_failures", "mark_failed_or_retry")
    async def test_the_stale_batch_sweep_leaves_a_child_that_just_ended_to_the_workers_hook(
        self, backend: Backend, advance_time: AdvanceTime
    ) -> None:
        # A sweep between the last child's failure and the worker's hook completed the
        # batch, and the hook then found it ended: a failure that reached the threshold
        # released the finalizer of a "complete" batch instead of an aborted one.
        sweeper = _stale_batch_sweep(backend)
        queue, batch_id = f"stale-{uuid4().hex[:8]}", uuid4()
        await backend.enqueue_batch_atomic(
            [make_args(queue=queue)],
            batch_id=batch_id,
            queue=queue,
            batch_row=BatchRow(id=batch_id, queue=queue, expected_size=1, failure_threshold=1),
            finalizer_args=None,
        )
        await _past_batch_grace(backend, advance_time)  # an old batch: its child's end counts
        worker = uuid4()
        [child] = await backend.dispatch_batch(worker, [queue], 1, LONG_LEASE)
        error = ErrorInfo(error_class="RuntimeError", message="child failed")
        ended = await backend.mark_failed_or_retry(child.id, worker, error, None)
        assert ended is not None and ended.status is JobStatus.FAILED
        assert await sweeper.complete_stale_batches() == 0
        assert (await backend.increment_batch_failures(batch_id))[:2] == (1, 1)  # the hook
        assert await backend.abort_batch(batch_id) == 0
        batch = await backend.get_batch(batch_id)
        assert batch is not None and batch.status == "aborted"

    @covers("complete_stale_batches", "enqueue_batch_atomic")
    async def test_the_stale_batch_sweep_cancels_what_an_interrupted_abort_left_waiting(
        self, backend: Backend
    ) -> None:
        # An abort goes in turns (one statement would outlast a bound on a large
        # batch): a worker that died between them left children of an aborted batch
        # waiting, and they ran.
        sweeper = _stale_batch_sweep(backend)
        queue, batch_id = f"stale-{uuid4().hex[:8]}", uuid4()
        left = await backend.enqueue_batch_atomic(
            [make_args(queue=queue) for _ in range(2)],
            batch_id=batch_id,
            queue=queue,
            batch_row=BatchRow(
                id=batch_id,
                queue=queue,
                status="aborted",
                expected_size=2,
                completed_at=datetime(2026, 1, 1, tzinfo=UTC),  # any time: not compared
            ),
            finalizer_args=None,
        )
        await sweeper.complete_stale_batches()
        for child in left:
            row = await fetch(backend, child.id)
            assert row.status is JobStatus.CANCELLED
            assert row.error is not None and row.error.error_class == "BatchAborted"

    @covers("complete_stale_batches", "abort_batch", "mark_failed_or_retry")
    async def test_the_stale_batch_sweep_cancels_a_child_retried_after_its_batch_aborted(
        self, backend: Backend
    ) -> None:
        # The abort leaves a running child to run; failed with attempts left after the
        # abort (at any time later), it waits for its retry in a batch long aborted.
        sweeper = _stale_batch_sweep(backend)
        queue, batch_id = f"stale-{uuid4().hex[:8]}", uuid4()
        [child] = await backend.enqueue_batch_atomic(
            [make_args(queue=queue, max_attempts=3)],
            batch_id=batch_id,
            queue=queue,
            batch_row=BatchRow(id=batch_id, queue=queue, expected_size=1),
            finalizer_args=None,
        )
        worker = uuid4()
        [running] = await backend.dispatch_batch(worker, [queue], 1, LONG_LEASE)
        assert running.id == child.id
        assert await backend.abort_batch(batch_id) == 0
        await sweeper.complete_stale_batches()
        assert (await fetch(backend, child.id)).status is JobStatus.RUNNING
        retried = await backend.mark_failed_or_retry(child.id, worker, ERROR, FAR)
        assert retried.status is JobStatus.SCHEDULED
        await sweeper.complete_stale_batches()
        row = await fetch(backend, child.id)
        assert row.status is JobStatus.CANCELLED
        assert row.error is not None and row.error.error_class == "BatchAborted"

    @covers("complete_stale_batches", "create_batch")
    async def test_the_stale_batch_sweep_ends_a_quiet_batch_once_the_grace_passed(
        self, backend: Backend, advance_time: AdvanceTime
    ) -> None:
        # The hook that never came (the worker died): the sweep is the safety net.
        sweeper = _stale_batch_sweep(backend)
        batch_id = uuid4()
        await backend.create_batch(batch_id, f"stale-{uuid4().hex[:8]}", 0, None, None, None)
        grace = getattr(backend, "stale_batch_grace", _ZERO)
        if grace > _ZERO:
            assert await sweeper.complete_stale_batches() == 0  # just created
        await _past_batch_grace(backend, advance_time)
        assert await sweeper.complete_stale_batches() == 1
        batch = await backend.get_batch(batch_id)
        assert batch is not None and batch.status == "complete"

    @covers("enqueue", "dispatch_batch", "queue_depths")
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

    @covers("register_actors", "stranded_jobs")
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
        assert stranded[gone] == {"default": 2}
        assert known not in stranded
        assert busy not in stranded

    @covers("deregister_worker", "register_actors", "register_worker", "stranded_jobs")
    async def test_stranded_jobs_counts_waiting_jobs_of_actors_no_registered_worker_runs(
        self, backend: Backend
    ) -> None:
        stats, registry = _fleet_stats(backend), _worker_registry(backend)
        tag = uuid4().hex[:8]
        kept, removed, unknown = f"kept-{tag}", f"removed-{tag}", f"unknown-{tag}"
        # Workers of an earlier release ran both: their configs stay for good.
        await backend.register_actors([ActorConfig(actor=kept), ActorConfig(actor=removed)])
        await backend.enqueue(make_args(actor=kept))
        await backend.enqueue(make_args(actor=removed))
        await backend.enqueue(make_args(actor=removed, delay=FAR))
        await backend.enqueue(make_args(actor=unknown))
        # No worker registered: the configs are all there is to go by.
        assert await stats.stranded_jobs() == {unknown: {"default": 1}}

        current = uuid4()
        await registry.register_worker(current, "host-a", 1, ["default"], actors=[kept])
        assert await stats.stranded_jobs() == {removed: {"default": 2}, unknown: {"default": 1}}

        # A worker that does not say its actors (an older release's, mid-deploy) may run
        # any actor with a config: no false alarm while it lives.
        older = uuid4()
        await registry.register_worker(older, "host-b", 2, ["default"])
        assert await stats.stranded_jobs() == {unknown: {"default": 1}}
        await registry.deregister_worker(older)
        assert await stats.stranded_jobs() == {removed: {"default": 2}, unknown: {"default": 1}}

        # Registering again replaces the actors.
        await registry.register_worker(current, "host-a", 1, ["default"], actors=[removed, kept])
        assert await stats.stranded_jobs() == {unknown: {"default": 1}}
        await registry.register_worker(current, "host-a", 1, ["default"], actors=[kept])
        assert await stats.stranded_jobs() == {removed: {"default": 2}, unknown: {"default": 1}}

    @covers("deregister_worker", "register_actors", "register_worker", "stranded_jobs")
    async def test_stranded_jobs_counts_waiting_jobs_per_queue_no_worker_running_the_actor_works(
        self, backend: Backend
    ) -> None:
        stats, registry = _fleet_stats(backend), _worker_registry(backend)
        tag = uuid4().hex[:8]
        runs, other = f"runs-{tag}", f"other-{tag}"
        worked, unworked = f"worked-{tag}", f"unworked-{tag}"
        await backend.register_actors([ActorConfig(actor=runs), ActorConfig(actor=other)])
        await backend.enqueue(make_args(actor=runs, queue=worked))
        await backend.enqueue(make_args(actor=runs, queue=unworked))
        await backend.enqueue(make_args(actor=runs, queue=unworked, delay=FAR))
        await backend.enqueue(make_args(actor=other, queue=worked))
        # No worker registered: every actor has a config, nothing to go by for queues.
        assert await stats.stranded_jobs() == {}

        current = uuid4()
        await registry.register_worker(current, "host-a", 1, [worked], actors=[runs])
        # Its actor on its queue is served; the same actor on a queue nobody works is
        # not (a misspelt queue=), nor its queue's jobs of an actor it does not run.
        assert await stats.stranded_jobs() == {runs: {unworked: 2}, other: {worked: 1}}

        # A worker that does not say its actors runs any of them, on its queues only.
        older = uuid4()
        await registry.register_worker(older, "host-b", 2, [worked])
        assert await stats.stranded_jobs() == {runs: {unworked: 2}}
        # One working the queue but running another actor serves none of its jobs.
        elsewhere = uuid4()
        await registry.register_worker(elsewhere, "host-c", 3, [unworked], actors=[other])
        assert await stats.stranded_jobs() == {runs: {unworked: 2}}

        # Registering again replaces the queues.
        await registry.register_worker(current, "host-a", 1, [worked, unworked], actors=[runs])
        assert await stats.stranded_jobs() == {}
        await registry.deregister_worker(older)
        await registry.register_worker(current, "host-a", 1, [unworked], actors=[runs])
        assert await stats.stranded_jobs() == {runs: {worked: 1}, other: {worked: 1}}

    @covers("cleanup_stale_workers", "deregister_worker", "register_worker", "touch_worker")
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

    @covers(
        "get", "get_attempts", "get_events", "poll_reclaim_events", "enqueue", "prune_terminal_jobs"
    )
    async def test_prune_moves_only_terminal_jobs_past_their_status_retention(
        self, backend: Backend, advance_time: AdvanceTime
    ) -> None:
        pruner = _prune(backend)
        # First, while no other lease exists: reaching it reclaims every expired lease.
        crashed = await reach(backend, JobStatus.CRASHED, advance_time=advance_time)
        key = f"prune-{uuid4()}"
        done = [await reach(backend, JobStatus.SUCCEEDED, idempotency_key=key)]
        done += [await reach(backend, JobStatus.SUCCEEDED) for _ in range(2)]
        failed = await reach(backend, JobStatus.FAILED)
        cancelled = await reach(backend, JobStatus.CANCELLED)
        scheduled = await reach(backend, JobStatus.SCHEDULED)
        running = await reach(backend, JobStatus.RUNNING)
        pruned, kept = [crashed, *done], [failed, cancelled, scheduled, running]
        history = {
            job.id: (await backend.get_attempts(job.id), await backend.get_events(job.id))
            for job in pruned + kept
        }
        # Something to delete: every job to be pruned ran, so it has both.
        assert all(all(history[job.id]) for job in pruned)
        assert crashed.id in await _reclaimed_job_ids(backend)
        await advance_time(TICK)

        # failed: finished more recently than its retention; cancelled: not in the
        # mapping; scheduled and running: not terminal. Three succeeded jobs in
        # batches of two take a full batch and a partial one.
        retention = {"succeeded": _ZERO, "crashed": _ZERO, "failed": FAR}
        assert await pruner.prune_terminal_jobs(retention, archive_retention=FAR, batch_size=2) == 4
        for job in pruned:
            assert await backend.get(job.id) is None
            assert await backend.get_attempts(job.id) == []
            assert await backend.get_events(job.id) == []
        # The reclaim outbox is the jobs' events: the pruned job's reclaim left it too.
        assert crashed.id not in await _reclaimed_job_ids(backend)
        for job in kept:
            assert await fetch(backend, job.id) == job
            assert (await backend.get_attempts(job.id), await backend.get_events(job.id)) == (
                history[job.id]
            )
        # Idempotency holds only over the jobs table: once archived, the key is free.
        again = await backend.enqueue(make_args(idempotency_key=key))
        assert again.id != done[0].id
        assert again.status is JobStatus.PENDING
        assert await pruner.prune_terminal_jobs(retention, archive_retention=FAR, batch_size=2) == 0

        # Named with a retention they have outlived, the kept terminal jobs go too.
        retention = {"failed": _ZERO, "cancelled": _ZERO}
        assert await pruner.prune_terminal_jobs(retention, archive_retention=FAR) == 2
        assert await backend.get(failed.id) is None
        assert await backend.get(cancelled.id) is None
        assert await fetch(backend, scheduled.id) == scheduled
        assert await fetch(backend, running.id) == running

    @covers("mark_succeeded", "prune_terminal_jobs")
    async def test_prune_keeps_a_job_whose_result_has_not_expired(
        self, backend: Backend, advance_time: AdvanceTime
    ) -> None:
        # A result_ttl longer than the status's retention wins: the archive is not
        # readable, so a job archived before its result expired lost it early.
        pruner = _prune(backend)
        kept = await reach(backend, JobStatus.SUCCEEDED, result_ttl=FAR)
        short = await reach(backend, JobStatus.SUCCEEDED, result_ttl=_SHORT_TTL)
        # No result_ttl (nor a fallback): the result lives as long as its job.
        plain = [await reach(backend, JobStatus.SUCCEEDED) for _ in range(2)]
        await advance_time(TICK)
        retention = {"succeeded": _ZERO}
        # In batches of one, past the job kept ahead of them.
        assert await pruner.prune_terminal_jobs(retention, archive_retention=FAR, batch_size=1) == 2
        assert [await backend.get(job.id) for job in plain] == [None, None]
        assert (await fetch(backend, short.id)).result == {"ok": True}

        await advance_time(_SHORT_TTL * 2)
        assert await pruner.prune_terminal_jobs(retention, archive_retention=FAR) == 1
        assert await backend.get(short.id) is None
        still = await fetch(backend, kept.id)
        assert still.result == {"ok": True}
        assert still.result_expires_at is not None
        assert still.result_expires_at > await pruner.now()

    @covers("enqueue", "expire_archive", "prune_terminal_jobs")
    async def test_a_job_id_archived_twice_keeps_the_later_job(
        self, backend: Backend, advance_time: AdvanceTime
    ) -> None:
        # Explicit ids are free again once their job left the jobs table; archiving the
        # same id again must not fail the prune (it would fail every later one).
        pruner = _prune(backend)
        job_id = uuid4()
        await reach(backend, JobStatus.SUCCEEDED, id=job_id)
        await advance_time(TICK)
        assert await pruner.prune_terminal_jobs({"succeeded": _ZERO}, archive_retention=FAR) == 1
        again = await reach(backend, JobStatus.FAILED, id=job_id)
        assert again.id == job_id
        await advance_time(TICK)
        assert await pruner.prune_terminal_jobs({"failed": _ZERO}, archive_retention=_ZERO) == 1
        assert await backend.get(job_id) is None
        await advance_time(TICK)
        # One archived row for the id, the later job's: it expires with no retention.
        assert await pruner.expire_archive() == 1
        assert await pruner.expire_archive() == 0

    @covers("expire_archive", "prune_terminal_jobs")
    async def test_expire_archive_deletes_only_archived_jobs_past_expire_at(
        self, backend: Backend, advance_time: AdvanceTime
    ) -> None:
        pruner = _prune(backend)
        for _ in range(2):
            await reach(backend, JobStatus.SUCCEEDED)
        await advance_time(TICK)
        assert await pruner.prune_terminal_jobs({"succeeded": _ZERO}, archive_retention=FAR) == 2
        for _ in range(3):
            await reach(backend, JobStatus.SUCCEEDED)
        await advance_time(TICK)
        assert await pruner.prune_terminal_jobs({"succeeded": _ZERO}, archive_retention=_ZERO) == 3
        await advance_time(TICK)

        # The three archived with no retention expire, in batches of two; the two
        # archived for an hour do not.
        assert await pruner.expire_archive(batch_size=2) == 3
        assert await pruner.expire_archive(batch_size=2) == 0

    @covers("expire_archive", "prune_terminal_jobs")
    async def test_prune_and_expiry_refuse_an_empty_batch_size(self, backend: Backend) -> None:
        # A batch size of 0 would never end the batch loop.
        pruner = _prune(backend)
        with pytest.raises(ValueError, match="batch_size"):
            await pruner.prune_terminal_jobs(
                {"succeeded": _ZERO}, archive_retention=FAR, batch_size=0
            )
        with pytest.raises(ValueError, match="batch_size"):
            await pruner.expire_archive(batch_size=0)

    @covers("prune_terminal_jobs")
    async def test_prune_refuses_an_unknown_status_and_moves_nothing(
        self, backend: Backend
    ) -> None:
        # A misspelt status would keep its jobs for ever; checked before any batch.
        pruner = _prune(backend)
        job = await reach(backend, JobStatus.CANCELLED)
        with pytest.raises(ValueError, match=r"'cancelld'.*the terminal statuses are"):
            await pruner.prune_terminal_jobs(
                {"cancelled": _ZERO, "cancelld": _ZERO}, archive_retention=FAR
            )
        assert await backend.get(job.id) is not None

    @covers("now", "enqueue")
    async def test_now_reads_the_clock_the_backend_writes_its_times_with(
        self, backend: Backend, advance_time: AdvanceTime
    ) -> None:
        pruner = _prune(backend)
        job = await backend.enqueue(make_args())
        first = await pruner.now()
        assert_utc(first)
        assert first >= job.created_at
        await advance_time(_STEP)
        assert await pruner.now() >= first + _STEP
