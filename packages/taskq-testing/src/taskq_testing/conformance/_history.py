"""History: attempt rows and events, their order and ``write_attempt``."""

from __future__ import annotations

from datetime import timedelta, timezone
from uuid import uuid4

import pytest

from taskq.backend import Backend, SupportsLateOutcomes
from taskq.models import AttemptRow, ErrorInfo
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
    make_args,
)


class HistoryTests:
    """``get_attempts``, ``write_attempt`` and ``get_events``."""

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
        ]
        await assert_history_consistent(backend, job.id)
        assert not await backend.record_late_outcome(uuid4(), 1, first, "succeeded", None)
