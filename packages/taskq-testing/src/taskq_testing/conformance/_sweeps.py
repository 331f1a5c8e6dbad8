"""Sweeps: promotion of due jobs, the deadline sweep and crash reclaim."""

from __future__ import annotations

import random
import string
from collections.abc import Awaitable, Callable
from datetime import timedelta
from uuid import uuid4

import pytest

from taskq.backend import Backend, JobStatus, SupportsWorkerRegistry
from taskq.models import MAX_KEY_BYTES, MAX_NAME_BYTES
from taskq_testing.conformance._support import (
    FAR,
    LONG_LEASE,
    SHORT_LEASE,
    STATUSES_WITHOUT_WAIT,
    AdvanceTime,
    TimeLimits,
    assert_close,
    backend_setting,
    cancel_reclaim_wait,
    covers,
    error_class_name,
    expire_short_leases,
    fetch,
    make_args,
    only_attempt,
    reach,
    running_job,
    skip_unless_can_wait,
    wait_for_wake,
)

_ZERO = timedelta(0)

_SWEEPS: dict[str, Callable[[Backend], Awaitable[int]]] = {
    "scheduled_to_pending": lambda b: b.scheduled_to_pending(),
    "deadline_sweep": lambda b: b.deadline_sweep(),
    "reclaim_expired_locks": lambda b: b.reclaim_expired_locks(_ZERO, _ZERO),
}


class SweepTests(TimeLimits):
    """``scheduled_to_pending``, ``deadline_sweep`` and ``reclaim_expired_locks``."""

    @pytest.mark.parametrize("status", STATUSES_WITHOUT_WAIT)
    @pytest.mark.parametrize("sweep", sorted(_SWEEPS))
    @covers(*_SWEEPS)
    async def test_a_sweep_with_nothing_due_changes_nothing(
        self, backend: Backend, sweep: str, status: JobStatus
    ) -> None:
        # Every job carries a deadline, a delay or a lease that is far off.
        job = await reach(backend, status, schedule_to_close=FAR + FAR)
        events = await backend.get_events(job.id)
        assert await _SWEEPS[sweep](backend) == 0
        assert await backend.get(job.id) == job
        assert await backend.get_events(job.id) == events

    @covers("scheduled_to_pending", "subscribe_wake")
    async def test_scheduled_to_pending_promotes_due_jobs_and_wakes(
        self, backend: Backend, advance_time: AdvanceTime
    ) -> None:
        due = await backend.enqueue(make_args(delay=SHORT_LEASE))
        later = await backend.enqueue(make_args(delay=FAR))
        await expire_short_leases(advance_time)
        async with backend.subscribe_wake() as wake:
            assert await backend.scheduled_to_pending() == 1
            await wait_for_wake(wake)
        assert (await fetch(backend, due.id)).status is JobStatus.PENDING
        [event] = await backend.get_events(due.id)
        assert event.kind == "state_change"
        assert (event.detail["from_state"], event.detail["to_state"]) == ("scheduled", "pending")
        assert await backend.get(later.id) == later
        assert len(await backend.dispatch_batch(uuid4(), ["default"], 10, LONG_LEASE)) == 1

    @covers("enqueue", "scheduled_to_pending", "dispatch_batch")
    async def test_the_longest_names_and_keys_are_promoted_and_dispatched(
        self, backend: Backend, advance_time: AdvanceTime
    ) -> None:
        # At the limits together (in UTF-8 bytes): on Postgres they share index entries,
        # and a delayed job whose entry could not be written stopped every promotion.
        # Random text, as a repeated character would be compressed to nothing there.
        rng = random.Random(7)

        def text(size: int, two_byte: bool = False) -> str:
            if two_byte:  # U+0100..U+07FF: two bytes each in UTF-8
                return "".join(chr(rng.randrange(0x100, 0x800)) for _ in range(size // 2))
            return "".join(rng.choices(string.ascii_letters + string.digits, k=size))

        queue = text(MAX_NAME_BYTES, two_byte=True)
        args = make_args(
            actor=text(MAX_NAME_BYTES),
            queue=queue,
            delay=SHORT_LEASE,
            idempotency_key=text(MAX_KEY_BYTES),
            identity_key=text(MAX_KEY_BYTES, two_byte=True),
            fairness_key=text(MAX_KEY_BYTES),
        )
        job = await backend.enqueue(args)
        await expire_short_leases(advance_time)
        assert await backend.scheduled_to_pending() == 1
        [running] = await backend.dispatch_batch(uuid4(), [queue], 1, LONG_LEASE)
        assert running.id == job.id
        assert (running.identity_key, running.fairness_key) == (
            args.identity_key,
            args.fairness_key,
        )

    @covers("deadline_sweep")
    async def test_deadline_sweep_fails_waiting_jobs_past_their_deadline(
        self, backend: Backend, advance_time: AdvanceTime
    ) -> None:
        pending = await backend.enqueue(make_args(schedule_to_close=SHORT_LEASE))
        scheduled = await backend.enqueue(make_args(delay=FAR, schedule_to_close=SHORT_LEASE))
        # The worker enforces deadlines on running jobs; the sweep leaves them be.
        running = await running_job(backend, worker_id=uuid4(), schedule_to_close=SHORT_LEASE)
        untouched = [
            running,
            await backend.enqueue(make_args(schedule_to_close=FAR)),
            await backend.enqueue(make_args()),
        ]
        await expire_short_leases(advance_time)
        assert await backend.deadline_sweep() == 2
        for job in (pending, scheduled):
            failed = await fetch(backend, job.id)
            assert failed.status is JobStatus.FAILED
            assert error_class_name(failed.error) == "DeadlineExceeded"
            [event] = await backend.get_events(job.id)
            assert event.kind == "state_change"
            assert event.detail == {
                "from_state": job.status,
                "to_state": "failed",
                "reason": "deadline_exceeded",  # a job failed by no attempt says why
            }
            assert_close(failed.finished_at, event.occurred_at)
        for job in untouched:
            assert await backend.get(job.id) == job

    @covers("reclaim_expired_locks", "subscribe_wake", "get_attempts", "get_events")
    async def test_reclaim_repends_or_crashes_by_attempts_left(
        self, backend: Backend, advance_time: AdvanceTime
    ) -> None:
        worker = uuid4()
        retry = await running_job(backend, worker_id=worker, max_attempts=3, lease=SHORT_LEASE)
        last = await running_job(backend, worker_id=worker, max_attempts=1, lease=SHORT_LEASE)
        healthy = await running_job(backend, worker_id=worker)
        await expire_short_leases(advance_time)
        async with backend.subscribe_wake() as wake:
            assert await backend.reclaim_expired_locks(_ZERO, _ZERO) == 2
            await wait_for_wake(wake)
        for job, status in ((retry, JobStatus.PENDING), (last, JobStatus.CRASHED)):
            after = await fetch(backend, job.id)
            assert after.status is status
            assert (after.locked_by_worker, after.lock_expires_at) == (None, None)
            attempt = only_attempt(await backend.get_attempts(job.id))
            assert (attempt.attempt, attempt.outcome, attempt.worker_id) == (1, "crashed", worker)
            assert attempt.started_at == job.started_at
            assert error_class_name(attempt.error) == "WorkerCrashed"
            # When its worker stopped is not known: the reclaim comes a lease or more
            # after the last renewal (it read as a run that long).
            assert attempt.duration is None
            # The job's error is its last attempt's, back to pending too (it kept an
            # earlier attempt's, or none).
            assert error_class_name(after.error) == "WorkerCrashed"
            event = (await backend.get_events(job.id))[-1]
            assert event.kind == "reclaimed"
            assert event.detail == {
                "from_state": "running",
                "to_state": status,
                "reason": "lock_expired",
                "worker_id": str(worker),
            }
            if status is JobStatus.PENDING:
                assert_close(after.scheduled_at, event.occurred_at)
                assert after.finished_at is None
            else:
                assert_close(after.finished_at, event.occurred_at)
        assert await backend.get(healthy.id) == healthy
        [again] = await backend.dispatch_batch(uuid4(), [retry.queue], 1, LONG_LEASE)
        assert (again.id, again.attempt) == (retry.id, 2)

    @covers("reclaim_expired_locks", "get_attempts")
    async def test_a_job_reclaimed_past_its_deadline_crashes_instead_of_retrying(
        self, backend: Backend, advance_time: AdvanceTime
    ) -> None:
        # It went back to pending, was dispatched again, and failed DeadlineExceeded in
        # an attempt that ran nothing.
        worker = uuid4()
        late = await running_job(
            backend,
            worker_id=worker,
            max_attempts=3,
            lease=SHORT_LEASE,
            schedule_to_close=SHORT_LEASE,
        )
        timely = await running_job(
            backend, worker_id=worker, max_attempts=3, lease=SHORT_LEASE, schedule_to_close=FAR
        )
        await expire_short_leases(advance_time)
        assert await backend.reclaim_expired_locks(_ZERO, _ZERO) == 2
        after = await fetch(backend, late.id)
        assert after.status is JobStatus.CRASHED
        assert error_class_name(after.error) == "WorkerCrashed"
        assert only_attempt(await backend.get_attempts(late.id)).outcome == "crashed"
        assert (await fetch(backend, timely.id)).status is JobStatus.PENDING

    @covers("reclaim_expired_locks", "heartbeat_jobs")
    async def test_a_heartbeat_keeps_a_job_from_being_reclaimed(
        self, backend: Backend, advance_time: AdvanceTime
    ) -> None:
        alive, dead = uuid4(), uuid4()
        kept = await running_job(backend, worker_id=alive, lease=SHORT_LEASE)
        lost = await running_job(backend, worker_id=dead, lease=SHORT_LEASE)
        assert await backend.heartbeat_jobs(alive, LONG_LEASE) == 1
        await expire_short_leases(advance_time)
        assert await backend.reclaim_expired_locks(_ZERO, _ZERO) == 1
        after = await fetch(backend, kept.id)
        assert (after.status, after.locked_by_worker) == (JobStatus.RUNNING, alive)
        assert (await fetch(backend, lost.id)).status is JobStatus.PENDING

    @covers("reclaim_expired_locks", "register_worker", "touch_worker")
    async def test_the_jobs_of_a_worker_seen_within_worker_silence_are_not_reclaimed(
        self, backend: Backend, advance_time: AdvanceTime
    ) -> None:
        # Its lease lapsed while another transaction held the row (or the table): the
        # worker, alive all along, renews it once it can.
        if not isinstance(backend, SupportsWorkerRegistry):
            pytest.skip(f"{type(backend).__name__} does not implement SupportsWorkerRegistry")
        seen, silent, unregistered = uuid4(), uuid4(), uuid4()
        for wid in (seen, silent):
            await backend.register_worker(wid, "host", 1, ["default"])
        jobs = {
            wid: await running_job(backend, worker_id=wid, lease=SHORT_LEASE)
            for wid in (seen, silent, unregistered)
        }
        await expire_short_leases(advance_time)
        assert await backend.touch_worker(seen)
        silence = timedelta(seconds=1)  # room for a slow machine between the steps
        assert await backend.reclaim_expired_locks(_ZERO, _ZERO, worker_silence=silence) == 1
        assert (await fetch(backend, jobs[unregistered].id)).status is JobStatus.PENDING
        assert await backend.get(jobs[seen].id) == jobs[seen]
        assert await backend.get(jobs[silent].id) == jobs[silent]  # seen at registration
        skip_unless_can_wait(silence, self.max_advance, "a worker's silence")
        await advance_time(silence)
        assert await backend.reclaim_expired_locks(_ZERO, _ZERO, worker_silence=silence) == 2
        # Without worker_silence a lapsed lease is enough, the worker seen or not.
        alive = await running_job(backend, worker_id=seen, lease=SHORT_LEASE)
        await expire_short_leases(advance_time)
        assert await backend.touch_worker(seen)
        assert await backend.reclaim_expired_locks(_ZERO, _ZERO) == 1
        assert (await fetch(backend, alive.id)).status is JobStatus.PENDING

    @covers("reclaim_expired_locks")
    async def test_a_cancel_in_progress_gets_both_graces_before_reclaim(
        self, backend: Backend, advance_time: AdvanceTime
    ) -> None:
        cancelling = await running_job(
            backend, worker_id=uuid4(), cancel_phase=1, lease=SHORT_LEASE
        )
        plain = await running_job(backend, worker_id=uuid4(), lease=SHORT_LEASE)
        await expire_short_leases(advance_time)
        assert await backend.reclaim_expired_locks(FAR, _ZERO) == 1
        assert (await fetch(backend, plain.id)).status is JobStatus.PENDING
        assert await backend.reclaim_expired_locks(_ZERO, FAR) == 0
        assert await backend.get(cancelling.id) == cancelling

    @covers("reclaim_expired_locks")
    async def test_a_cancel_in_progress_also_gets_the_backend_headroom(
        self, backend: Backend, advance_time: AdvanceTime
    ) -> None:
        headroom = backend_setting(backend, "cancel_reclaim_headroom")
        if headroom < timedelta(seconds=0.5):
            pytest.skip(
                f"cancel_reclaim_headroom is {headroom.total_seconds():g} s: too short to tell "
                f"apart from the time the test itself takes (needs at least 0.5 s)"
            )
        job = await running_job(backend, worker_id=uuid4(), cancel_phase=1, lease=SHORT_LEASE)
        await expire_short_leases(advance_time)
        assert await backend.reclaim_expired_locks(_ZERO, _ZERO) == 0
        assert await backend.get(job.id) == job

    @covers("reclaim_expired_locks")
    async def test_reclaiming_a_job_with_a_cancel_request_cancels_it(
        self, backend: Backend, advance_time: AdvanceTime
    ) -> None:
        # Whether or not attempts are left: the user's request is the honest outcome.
        wait = cancel_reclaim_wait(backend, self.max_advance)
        worker = uuid4()
        jobs = [
            await running_job(
                backend, worker_id=worker, cancel_phase=phase, max_attempts=n, lease=SHORT_LEASE
            )
            for phase, n in ((1, 3), (1, 1), (2, 3))
        ]
        await advance_time(wait)
        assert await backend.reclaim_expired_locks(_ZERO, _ZERO) == len(jobs)
        for job in jobs:
            after = await fetch(backend, job.id)
            assert after.status is JobStatus.CANCELLED
            attempt = only_attempt(await backend.get_attempts(job.id))
            assert attempt.outcome == "crashed"
            assert error_class_name(attempt.error) == "WorkerCrashed"
            event = (await backend.get_events(job.id))[-1]
            assert event.kind == "reclaimed"
            assert event.detail == {
                "from_state": "running",
                "to_state": "cancelled",
                "reason": "lock_expired",
                "worker_id": str(worker),
            }
            assert_close(after.finished_at, event.occurred_at)
