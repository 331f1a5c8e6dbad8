"""Cancellation requests: immediate cancels, cancel flags, bulk cancel and the cancel wake."""

from __future__ import annotations

from datetime import timedelta
from typing import Literal
from uuid import UUID, uuid4

import pytest

from taskq.backend import (
    Backend,
    CancelPhase,
    JobStatus,
    SupportsUnstartedHandBack,
    SupportsWorkerCancelWake,
)
from taskq.models import CancelFlag, ErrorInfo, JobFilter, JobRow
from taskq_testing.conformance._support import (
    TICK,
    AdvanceTime,
    assert_close,
    assert_utc,
    covers,
    fetch,
    last_event,
    make_args,
    reach,
    running_job,
    wait_for_wake,
)


async def _requeue(backend: Backend, how: str, job: JobRow, worker: UUID) -> object:
    """Put a running job back in the queue the way ``how`` names; what the write says."""
    if how == "retry":
        row = await backend.mark_failed_or_retry(
            job.id, worker, ErrorInfo(error_class="Boom", message="again"), timedelta(0)
        )
        return row.status
    if how == "snooze":
        return await backend.mark_snoozed(job.id, worker, timedelta(hours=1))
    if how == "retry_after":
        return await backend.mark_retry_after(job.id, worker, timedelta(0))
    if not isinstance(backend, SupportsUnstartedHandBack):
        pytest.skip(f"{type(backend).__name__} does not implement SupportsUnstartedHandBack")
    return await backend.hand_back_unstarted(worker, [(job.id, job.attempt)])


class CancelTests:
    """``write_cancel_request``, ``cancel_where``, ``poll_cancel_flags``, ``subscribe_cancel_wake``."""

    @pytest.mark.parametrize("status", [JobStatus.PENDING, JobStatus.SCHEDULED])
    @covers("write_cancel_request")
    async def test_a_waiting_job_is_cancelled_at_once(
        self, backend: Backend, status: JobStatus
    ) -> None:
        job = await reach(backend, status)
        assert await backend.write_cancel_request(job.id, "no longer needed")
        after = await fetch(backend, job.id)
        assert after.status is JobStatus.CANCELLED
        assert after.cancel_reason == "no longer needed"
        [event] = await backend.get_events(job.id)
        assert event.kind == "state_change"
        assert event.detail["from_state"] == status
        assert event.detail["to_state"] == "cancelled"
        assert event.detail["reason"] == "no longer needed"
        assert_utc(after.finished_at, after.cancel_requested_at)
        assert_close(after.finished_at, event.occurred_at)
        assert_close(after.cancel_requested_at, event.occurred_at)
        assert await backend.get_attempts(job.id) == []

    @covers("write_cancel_request", "subscribe_cancel_wake")
    async def test_a_running_job_gets_a_cooperative_cancel_flag_and_a_wake(
        self, backend: Backend
    ) -> None:
        worker = uuid4()
        job = await running_job(backend, worker_id=worker)
        async with backend.subscribe_cancel_wake() as wake:
            assert await backend.write_cancel_request(job.id, "stop")
            await wait_for_wake(wake)
        after = await fetch(backend, job.id)
        assert (after.status, after.locked_by_worker) == (JobStatus.RUNNING, worker)
        assert after.cancel_phase == CancelPhase.COOPERATIVE
        assert after.cancel_reason == "stop"
        [_, requested] = await backend.get_events(job.id)
        assert (requested.kind, requested.detail) == ("cancel_requested", {"reason": "stop"})
        assert_utc(after.cancel_requested_at)
        assert_close(after.cancel_requested_at, requested.occurred_at)
        assert after.finished_at is None

    @pytest.mark.parametrize("how", ["one", "where"])
    @covers("write_cancel_request", "cancel_where", "subscribe_worker_cancel_wake")
    async def test_a_cancel_request_wakes_only_the_worker_holding_the_job(
        self, backend: Backend, how: str
    ) -> None:
        if not isinstance(backend, SupportsWorkerCancelWake):
            pytest.skip(f"{type(backend).__name__} does not implement SupportsWorkerCancelWake")
        holder, other = uuid4(), uuid4()
        job = await running_job(backend, worker_id=holder, tags=["held"])
        others = await running_job(backend, worker_id=other)
        async with (
            backend.subscribe_worker_cancel_wake(holder) as mine,
            backend.subscribe_worker_cancel_wake(other) as theirs,
        ):
            if how == "one":
                assert await backend.write_cancel_request(job.id, "stop")
            else:
                result = await backend.cancel_where(JobFilter(tags=("held",)), "stop")
                assert result.requested == [job.id]
            await wait_for_wake(mine)
            # Both would come from the same commit: by now the other one would be here.
            assert not theirs.is_set()
            assert await backend.write_cancel_request(others.id, "stop")
            await wait_for_wake(theirs)

    @pytest.mark.parametrize(
        ("how", "said", "outcome"),
        [
            ("retry", JobStatus.CANCELLED, "failed"),
            ("snooze", "cancelled", "snoozed"),
            ("retry_after", "cancelled", "retry_after"),
            ("hand_back", 1, "unstarted"),
        ],
    )
    @covers(
        "write_cancel_request",
        "mark_failed_or_retry",
        "mark_snoozed",
        "mark_retry_after",
        "hand_back_unstarted",
    )
    async def test_a_job_whose_cancel_was_requested_is_never_put_back_in_the_queue(
        self, backend: Backend, how: str, said: object, outcome: str
    ) -> None:
        # The request can land between the worker's cancel polls (the attempt then fails
        # or snoozes as if none came), or meet a shutdown's hand-back: requeued, the job
        # ran again, and could even succeed, with "cancel requested" on its row.
        worker = uuid4()
        job = await running_job(backend, worker_id=worker)
        assert await backend.write_cancel_request(job.id, "stop")
        assert await _requeue(backend, how, job, worker) == said
        after = await fetch(backend, job.id)
        assert (after.status, after.locked_by_worker) == (JobStatus.CANCELLED, None)
        assert_utc(after.finished_at)
        [attempt] = await backend.get_attempts(job.id)
        assert attempt.outcome == outcome
        event = await last_event(backend, job.id)
        assert (event.kind, event.detail["to_state"]) == ("state_change", "cancelled")
        assert event.detail["reason"] == "cancel_requested"  # not the retry it was asked for
        assert await backend.dispatch_batch(uuid4(), [job.queue], 10, timedelta(minutes=1)) == []

    @covers("mark_failed_or_retry")
    async def test_a_cancelled_jobs_last_attempt_failing_still_ends_failed(
        self, backend: Backend
    ) -> None:
        # Nothing is put back: the failure is what happened.
        worker = uuid4()
        job = await running_job(backend, worker_id=worker, max_attempts=1)
        assert await backend.write_cancel_request(job.id, "stop")
        error = ErrorInfo(error_class="Boom", message="last")
        row = await backend.mark_failed_or_retry(job.id, worker, error, timedelta(0))
        assert row.status is JobStatus.FAILED

    @covers("write_cancel_request")
    async def test_a_request_without_a_reason_records_none(self, backend: Backend) -> None:
        job = await running_job(backend, worker_id=uuid4())
        assert await backend.write_cancel_request(job.id, None)
        [_, requested] = await backend.get_events(job.id)
        assert (requested.kind, requested.detail) == ("cancel_requested", {})
        assert (await fetch(backend, job.id)).cancel_reason is None

    @pytest.mark.parametrize("phase", [CancelPhase.COOPERATIVE, CancelPhase.FORCED])
    @covers("write_cancel_request")
    async def test_a_repeated_request_keeps_the_first_timestamp_and_phase(
        self, backend: Backend, advance_time: AdvanceTime, phase: CancelPhase
    ) -> None:
        job = await running_job(backend, worker_id=uuid4(), cancel_phase=phase)
        await advance_time(TICK)
        assert await backend.write_cancel_request(job.id, "again")
        after = await fetch(backend, job.id)
        assert after.status is JobStatus.RUNNING
        assert after.cancel_phase == phase
        assert after.cancel_requested_at == job.cancel_requested_at

    @pytest.mark.parametrize(
        "status",
        [JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.ABANDONED],
    )
    @covers("write_cancel_request")
    async def test_a_finished_job_cannot_be_cancelled(
        self, backend: Backend, status: JobStatus
    ) -> None:
        job = await reach(backend, status)
        events = await backend.get_events(job.id)
        assert not await backend.write_cancel_request(job.id, "too late")
        assert await backend.get(job.id) == job
        assert await backend.get_events(job.id) == events

    @covers("write_cancel_request")
    async def test_cancelling_an_unknown_job_is_false(self, backend: Backend) -> None:
        assert not await backend.write_cancel_request(uuid4(), None)

    @covers("write_cancel_request", "cancel_where")
    async def test_a_reason_with_nul_characters_is_stored_with_replacements(
        self, backend: Backend
    ) -> None:
        waiting = await backend.enqueue(make_args())
        assert await backend.write_cancel_request(waiting.id, "why\x00")
        assert (await fetch(backend, waiting.id)).cancel_reason == "why\ufffd"
        running = await running_job(backend, worker_id=uuid4())
        await backend.cancel_where(JobFilter(queue=running.queue), "bulk\x00")
        assert (await fetch(backend, running.id)).cancel_reason == "bulk\ufffd"

    @covers("poll_cancel_flags")
    async def test_poll_cancel_flags_lists_the_workers_flagged_jobs(self, backend: Backend) -> None:
        worker, other = uuid4(), uuid4()
        requested = await running_job(backend, worker_id=worker, cancel_phase=1)
        forced = await running_job(backend, worker_id=worker, cancel_phase=2)
        await running_job(backend, worker_id=worker)
        await running_job(backend, worker_id=other, cancel_phase=1)
        honoured = await running_job(backend, worker_id=worker, cancel_phase=1)
        assert await backend.mark_cancelled(honoured.id, worker)
        flags = await backend.poll_cancel_flags(worker)
        expected = [
            CancelFlag(
                job_id=job.id,
                cancel_phase=job.cancel_phase,
                cancel_requested_at=job.cancel_requested_at,
                reason=job.cancel_reason,
            )
            for job in (requested, forced)
            if job.cancel_requested_at is not None
        ]
        assert sorted(flags, key=lambda f: f.job_id) == sorted(expected, key=lambda f: f.job_id)
        assert {f.cancel_phase for f in flags} == {CancelPhase.COOPERATIVE, CancelPhase.FORCED}

    @covers("poll_cancel_flags")
    async def test_poll_cancel_flags_lists_the_oldest_request_first(
        self, backend: Backend, advance_time: AdvanceTime
    ) -> None:
        worker = uuid4()
        # Enqueued in id order, their cancels requested in the reverse order: neither
        # the jobs' ids nor their age give the order of the requests.
        ids = sorted(uuid4() for _ in range(3))
        jobs = [await running_job(backend, worker_id=worker, id=job_id) for job_id in ids]
        for job in reversed(jobs):
            assert await backend.write_cancel_request(job.id, None)
            await advance_time(TICK)
        flags = await backend.poll_cancel_flags(worker)
        assert [f.job_id for f in flags] == list(reversed(ids))

    @covers("poll_cancel_flags")
    async def test_poll_cancel_flags_without_requests_is_empty(self, backend: Backend) -> None:
        worker = uuid4()
        await running_job(backend, worker_id=worker)
        assert await backend.poll_cancel_flags(worker) == []

    @covers("cancel_where")
    async def test_cancel_where_cancels_or_flags_everything_selected(
        self, backend: Backend
    ) -> None:
        worker = uuid4()
        # Jobs that go through a dispatch first, so no waiting job is dispatched instead.
        running = await running_job(backend, worker_id=worker, queue="bulk")
        finished = await reach(backend, JobStatus.SUCCEEDED, queue="bulk")
        pending = await reach(backend, JobStatus.PENDING, queue="bulk")
        scheduled = await reach(backend, JobStatus.SCHEDULED, queue="bulk")
        elsewhere = await reach(backend, JobStatus.PENDING, queue="other")
        # The filter's limit bounds list pages, not what gets cancelled.
        result = await backend.cancel_where(JobFilter(queue="bulk", limit=1), "bulk stop")
        assert sorted(result.cancelled) == sorted([pending.id, scheduled.id])
        assert result.requested == [running.id]
        for job in (pending, scheduled):
            after = await fetch(backend, job.id)
            assert (after.status, after.cancel_reason) == (JobStatus.CANCELLED, "bulk stop")
        flagged = await fetch(backend, running.id)
        assert (flagged.status, flagged.cancel_phase) == (
            JobStatus.RUNNING,
            CancelPhase.COOPERATIVE,
        )
        assert (await last_event(backend, running.id)).kind == "cancel_requested"
        assert await backend.get(finished.id) == finished
        assert await backend.get(elsewhere.id) == elsewhere

    @pytest.mark.parametrize("order", ["asc", "desc"])
    @covers("cancel_where")
    async def test_cancel_where_works_in_the_filters_order(
        self, backend: Backend, order: Literal["asc", "desc"]
    ) -> None:
        worker = uuid4()
        # Running ones first: a later dispatch would take an older waiting job.
        for _ in range(2):
            await running_job(backend, worker_id=worker, queue="ordered")
        for _ in range(2):
            await reach(backend, JobStatus.PENDING, queue="ordered")
        selected = JobFilter(queue="ordered", order=order)
        jobs = await backend.list_jobs(selected)
        listed = [job.id for job in jobs]
        running = [job.id for job in jobs if job.status is JobStatus.RUNNING]
        result = await backend.cancel_where(selected, "in order")
        # The ids, as list_jobs lists them (asc or desc), each list in that order ...
        assert result.requested == running
        assert result.cancelled == [job_id for job_id in listed if job_id not in running]
        # ... and the events written in it too.
        event_ids = [(await last_event(backend, job_id)).event_id for job_id in listed]
        assert event_ids == sorted(event_ids), "events not written in the filter's order"

    @covers("cancel_where")
    async def test_cancel_where_honours_the_filter(self, backend: Backend) -> None:
        worker = uuid4()
        mine = await reach(backend, JobStatus.PENDING, actor="conformance.mine")
        theirs = await reach(backend, JobStatus.PENDING, actor="conformance.theirs")
        running = await running_job(backend, worker_id=worker, actor="conformance.mine")
        result = await backend.cancel_where(
            JobFilter(actor="conformance.mine", status="pending"), None
        )
        assert (result.cancelled, result.requested) == ([mine.id], [])
        assert await backend.get(theirs.id) == theirs
        assert await backend.get(running.id) == running

    @covers("cancel_where")
    async def test_cancel_where_selecting_nothing_does_nothing(self, backend: Backend) -> None:
        job = await reach(backend, JobStatus.PENDING)
        result = await backend.cancel_where(JobFilter(status=[]), "nothing")
        assert (result.cancelled, result.requested) == ([], [])
        assert await backend.get(job.id) == job
