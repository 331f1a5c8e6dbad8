"""History: attempt rows and events, their order and ``write_attempt``."""

from __future__ import annotations

from datetime import timedelta, timezone
from uuid import UUID, uuid4

import pytest

from taskq.backend import (
    Backend,
    JobStatus,
    SupportsBatchedSuccess,
    SupportsLateOutcomes,
    SupportsUnstartedHandBack,
)
from taskq.models import AttemptRow, ErrorInfo, SuccessWrite
from taskq_testing.conformance._support import (
    ERROR,
    LONG_LEASE,
    SHORT_LEASE,
    AdvanceTime,
    assert_history_consistent,
    assert_utc,
    covers,
    enqueue_and_dispatch,
    expire_short_leases,
    fetch,
    make_args,
    running_job,
    transitions,
)

_ZERO = timedelta(0)


async def _path(backend: Backend, advance_time: AdvanceTime, path: str) -> UUID:
    """Take the job of one multi-step ``path`` through the protocol; its id."""
    worker = uuid4()
    cancel_phase = 1 if path.startswith("cancel-met-by-") else 0
    job = await running_job(
        backend,
        worker_id=worker,
        cancel_phase=cancel_phase,
        lease=SHORT_LEASE if path == "reclaim-late-retry" else LONG_LEASE,
        schedule_to_close=SHORT_LEASE if path == "hand-back-past-deadline" else None,
        max_attempts=1 if path == "reclaim-late-retry" else 3,
    )
    if path in ("hand-back", "hand-back-past-deadline", "cancel-met-by-hand-back"):
        if not isinstance(backend, SupportsUnstartedHandBack):
            pytest.skip(f"{type(backend).__name__} does not implement SupportsUnstartedHandBack")
        if path == "hand-back-past-deadline":
            await expire_short_leases(advance_time)
        assert await backend.hand_back_unstarted(worker, [(job.id, job.attempt)]) == 1
    elif path == "batched-success":
        if not isinstance(backend, SupportsBatchedSuccess):
            pytest.skip(f"{type(backend).__name__} does not implement SupportsBatchedSuccess")
        items = [SuccessWrite(job_id=job.id, attempt=job.attempt)]
        assert await backend.mark_succeeded_many(worker, items) == [True]
    elif path == "cancel-met-by-retry":
        await backend.mark_failed_or_retry(job.id, worker, ERROR, _ZERO)
    elif path == "cancel-met-by-snooze":
        assert await backend.mark_snoozed(job.id, worker, _ZERO) == "cancelled"
    elif path == "cancel-met-by-retry-after":
        assert await backend.mark_retry_after(job.id, worker, _ZERO) == "cancelled"
    elif path == "retry-then-run-again":
        await backend.mark_failed_or_retry(job.id, worker, ERROR, None)
        assert await backend.retry_job(job.id)
        [again] = await backend.dispatch_batch(worker, [job.queue], 1, LONG_LEASE)
        assert await backend.mark_succeeded(job.id, worker, None, attempt=again.attempt)
    elif path == "reclaim-late-retry":
        await expire_short_leases(advance_time)
        assert await backend.reclaim_expired_locks(_ZERO, _ZERO) == 1
        if isinstance(backend, SupportsLateOutcomes):
            assert await backend.record_late_outcome(job.id, 1, worker, "succeeded", None)
        assert await backend.retry_job(job.id)
        [again] = await backend.dispatch_batch(worker, [job.queue], 1, LONG_LEASE)
    return job.id


_PATHS = {
    # path: (the job's status, its transitions after the first dispatch, attempt outcomes)
    "hand-back": ("pending", [("running", "pending")], ["unstarted"]),
    "hand-back-past-deadline": ("failed", [("running", "failed")], ["unstarted"]),
    "batched-success": ("succeeded", [("running", "succeeded")], ["succeeded"]),
    "cancel-met-by-retry": ("cancelled", [("running", "cancelled")], ["failed"]),
    "cancel-met-by-snooze": ("cancelled", [("running", "cancelled")], ["snoozed"]),
    "cancel-met-by-retry-after": ("cancelled", [("running", "cancelled")], ["retry_after"]),
    "cancel-met-by-hand-back": ("cancelled", [("running", "cancelled")], ["unstarted"]),
    "retry-then-run-again": (
        "succeeded",
        [("running", "failed"), ("failed", "pending"), ("pending", "running")]
        + [("running", "succeeded")],
        ["failed", "succeeded"],
    ),
    "reclaim-late-retry": (
        "running",
        [("running", "crashed"), ("crashed", "pending"), ("pending", "running")],
        ["crashed"],
    ),
}


class HistoryTests:
    """``get_attempts``, ``write_attempt`` and ``get_events``."""

    @pytest.mark.parametrize("path", sorted(_PATHS))
    @covers("get_attempts", "get_events", "retry_job", "mark_snoozed", "mark_retry_after")
    async def test_every_dispatch_is_closed_by_one_finished_attempt_on_each_path(
        self, backend: Backend, advance_time: AdvanceTime, path: str
    ) -> None:
        # Paths of several steps, or through the optional writes: each move out of
        # running leaves the attempt's row, finished, of the worker that held it, and
        # every event starts where the one before ended.
        job_id = await _path(backend, advance_time, path)
        status, moves, outcomes = _PATHS[path]
        job = await fetch(backend, job_id)
        assert job.status is JobStatus(status)
        assert transitions(await backend.get_events(job_id))[1:] == moves
        assert [a.outcome for a in await backend.get_attempts(job_id)] == outcomes
        await assert_history_consistent(backend, job_id)

    @covers("get_attempts")
    async def test_attempts_are_listed_by_attempt_number(self, backend: Backend) -> None:
        workers = [uuid4(), uuid4(), uuid4()]
        job = await enqueue_and_dispatch(backend, worker_id=workers[0], max_attempts=3)
        started = [job.started_at]
        for attempt, worker in enumerate(workers[:2], start=1):
            await backend.mark_failed_or_retry(job.id, worker, ERROR, timedelta(0), attempt=attempt)
            [again] = await backend.dispatch_batch(workers[attempt], [job.queue], 1, LONG_LEASE)
            started.append(again.started_at)
        assert await backend.mark_succeeded(job.id, workers[2], None, attempt=3)
        attempts = await backend.get_attempts(job.id)
        assert [(a.attempt, a.outcome) for a in attempts] == [
            (1, "failed"),
            (2, "failed"),
            (3, "succeeded"),
        ]
        assert [a.worker_id for a in attempts] == workers
        assert [a.started_at for a in attempts] == started
        assert [a.error for a in attempts] == [ERROR, ERROR, None]
        await assert_history_consistent(backend, job.id)

    @covers("write_attempt", "get_attempts")
    async def test_write_attempt_inserts_or_replaces_by_attempt_number(
        self, backend: Backend
    ) -> None:
        job = await backend.enqueue(make_args())
        # Times come from the backend (the job's own created_at), never the test's clock.
        at = job.created_at
        second = AttemptRow(
            job_id=job.id,
            attempt=2,
            worker_id=uuid4(),
            started_at=at,
            finished_at=at + timedelta(seconds=2),
            outcome="interrupted",
        )
        first = second.model_copy(update={"attempt": 1, "outcome": "crashed", "worker_id": None})
        await backend.write_attempt(second)
        await backend.write_attempt(first)
        assert await backend.get_attempts(job.id) == [first, second]
        replaced = second.model_copy(update={"outcome": "failed", "error": ERROR})
        await backend.write_attempt(replaced)
        assert await backend.get_attempts(job.id) == [first, replaced]

    @covers("write_attempt", "get_attempts", "mark_succeeded")
    async def test_a_terminal_write_replaces_the_row_write_attempt_stored_for_its_attempt(
        self, backend: Backend
    ) -> None:
        worker = uuid4()
        job = await enqueue_and_dispatch(backend, worker_id=worker)
        assert job.started_at is not None
        written = AttemptRow(
            job_id=job.id,
            attempt=1,
            worker_id=worker,
            started_at=job.started_at,
            finished_at=job.started_at,
            outcome="interrupted",
        )
        await backend.write_attempt(written)
        assert await backend.mark_succeeded(job.id, worker, None, attempt=1)
        [attempt] = await backend.get_attempts(job.id)
        assert (attempt.attempt, attempt.outcome) == (1, "succeeded")
        # And the other way round: the later write wins.
        await backend.write_attempt(written)
        assert await backend.get_attempts(job.id) == [written]

    @covers("write_attempt", "get_attempts")
    async def test_write_attempt_stores_as_every_write_does(self, backend: Backend) -> None:
        # The in-memory backend kept any job id, NULs and the caller's zone as given.
        job = await backend.enqueue(make_args())
        elsewhere = timezone(timedelta(hours=5))
        given = AttemptRow(
            job_id=job.id,
            attempt=1,
            worker_id=None,
            started_at=job.created_at.astimezone(elsewhere),
            finished_at=job.created_at.astimezone(elsewhere),
            outcome="failed",
            error=ErrorInfo(error_class="a\x00b", message="m\x00"),
        )
        await backend.write_attempt(given)
        [stored] = await backend.get_attempts(job.id)
        assert_utc(stored.started_at, stored.finished_at)
        assert stored.started_at == job.created_at
        assert stored.error == ErrorInfo(error_class="a\ufffdb", message="m\ufffd")
        with pytest.raises(KeyError):
            await backend.write_attempt(given.model_copy(update={"job_id": uuid4()}))

    @covers("get_events")
    async def test_event_ids_increase_across_the_whole_backend(self, backend: Backend) -> None:
        worker = uuid4()
        a = await enqueue_and_dispatch(backend, worker_id=worker)
        b = await enqueue_and_dispatch(backend, worker_id=worker)
        assert await backend.mark_succeeded(a.id, worker, None)
        assert await backend.write_cancel_request(b.id, None)
        assert await backend.mark_cancelled(b.id, worker)
        events_a = await backend.get_events(a.id)
        events_b = await backend.get_events(b.id)
        in_call_order = [events_a[0], events_b[0], events_a[1], *events_b[1:]]
        ids = [e.event_id for e in in_call_order]
        assert ids == sorted(set(ids)), ids
        assert [e.kind for e in events_b] == ["state_change", "cancel_requested", "state_change"]
        for event in in_call_order:
            assert_utc(event.occurred_at)

    @covers("get_attempts", "get_events")
    async def test_an_unknown_job_has_no_history(self, backend: Backend) -> None:
        await enqueue_and_dispatch(backend, worker_id=uuid4())
        assert await backend.get_attempts(uuid4()) == []
        assert await backend.get_events(uuid4()) == []

    @covers("record_late_outcome", "reclaim_expired_locks", "get_events")
    async def test_a_late_outcome_joins_the_history_and_changes_nothing_else(
        self, backend: Backend, advance_time: AdvanceTime
    ) -> None:
        # The first worker, frozen past its lease, finished after the reclaim: its
        # refused write left the history saying only "crashed".
        if not isinstance(backend, SupportsLateOutcomes):
            pytest.skip(f"{type(backend).__name__} does not implement SupportsLateOutcomes")
        first = uuid4()
        job = await enqueue_and_dispatch(backend, worker_id=first, lease=SHORT_LEASE)
        await expire_short_leases(advance_time)
        assert await backend.reclaim_expired_locks(timedelta(0), timedelta(0)) == 1
        assert not await backend.mark_succeeded(job.id, first, None, attempt=1)
        before = await backend.get(job.id)
        assert await backend.record_late_outcome(job.id, 1, first, "succeeded", None)
        error = ErrorInfo(error_class="ValueError", message="bad\x00input")
        assert await backend.record_late_outcome(job.id, 1, first, "failed", error)
        # Stored as every text of a detail is (Postgres's jsonb holds no NUL): the
        # in-memory backend kept the outcome's.
        assert await backend.record_late_outcome(job.id, 1, first, "odd\x00one", None)
        assert await backend.get(job.id) == before  # the job is as the reclaim left it
        late = [e for e in await backend.get_events(job.id) if e.kind == "late_outcome"]
        assert [e.detail for e in late] == [
            {"attempt": 1, "worker_id": str(first), "outcome": "succeeded"},
            {
                "attempt": 1,
                "worker_id": str(first),
                "outcome": "failed",
                "error_class": "ValueError",
                "error_message": "bad\ufffdinput",
            },
            {"attempt": 1, "worker_id": str(first), "outcome": "odd\ufffdone"},
        ]
        await assert_history_consistent(backend, job.id)
        assert not await backend.record_late_outcome(uuid4(), 1, first, "succeeded", None)

    @covers("record_late_outcome", "get_events")
    async def test_a_late_outcome_written_again_is_kept_once(
        self, backend: Backend, advance_time: AdvanceTime
    ) -> None:
        # A retry after a transient error whose first try had landed (its reply lost):
        # the history said twice that the attempt came late.
        if not isinstance(backend, SupportsLateOutcomes):
            pytest.skip(f"{type(backend).__name__} does not implement SupportsLateOutcomes")
        first, second = uuid4(), uuid4()
        job = await enqueue_and_dispatch(backend, worker_id=first, lease=SHORT_LEASE)
        await expire_short_leases(advance_time)
        assert await backend.reclaim_expired_locks(timedelta(0), timedelta(0)) == 1
        error = ErrorInfo(error_class="ValueError", message="bad")
        for _ in range(2):
            assert await backend.record_late_outcome(job.id, 1, first, "failed", error)
        # Another outcome, attempt or worker is another late outcome.
        assert await backend.record_late_outcome(job.id, 1, first, "abandoned", None)
        assert await backend.record_late_outcome(job.id, 2, first, "failed", error)
        assert await backend.record_late_outcome(job.id, 1, second, "failed", error)
        late = [e.detail for e in await backend.get_events(job.id) if e.kind == "late_outcome"]
        assert [(d["attempt"], d["worker_id"], d["outcome"]) for d in late] == [
            (1, str(first), "failed"),
            (1, str(first), "abandoned"),
            (2, str(first), "failed"),
            (1, str(second), "failed"),
        ]
