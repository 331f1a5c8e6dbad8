"""Terminal writes: ownership, attempt fencing, each write's outcome, and ``retry_job``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from uuid import UUID, uuid4

import pytest

from taskq.backend import (
    Backend,
    CancelPhase,
    Connection,
    JobStatus,
    SupportsBatchedSuccess,
    SupportsUnstartedHandBack,
)
from taskq.errors import RetryRefusedError, SingletonCollisionError
from taskq.models import (
    DEADLINE_EXCEEDED,
    INT32_MAX,
    MAX_DURATION,
    AttemptOutcome,
    ErrorInfo,
    JobRow,
    SuccessWrite,
)
from taskq_testing.conformance._support import (
    ERROR,
    FAR,
    LONG_LEASE,
    SHORT_LEASE,
    AdvanceTime,
    assert_close,
    assert_history_consistent,
    assert_utc,
    covers,
    enqueue_and_dispatch,
    error_class_name,
    expire_short_leases,
    fetch,
    last_event,
    make_args,
    only_attempt,
    reach,
    require_conn,
    running_job,
    wait_for_wake,
)

_Call = Callable[[Backend, Connection, UUID, UUID, int | None], Awaitable[object]]


@dataclass(frozen=True)
class _Write:
    """One ownership-guarded write and what it does when it acts."""

    name: str
    call: _Call
    to_status: JobStatus
    outcome: AttemptOutcome | None
    """The attempt row's outcome; None for a write that ends no attempt."""
    noop: object
    done: object
    cancel_phase: int = 0
    """The cancel phase the job needs for the write to act."""

    def __str__(self) -> str:
        return self.name


async def _succeed(
    b: Backend, conn: Connection, job: UUID, worker: UUID, attempt: int | None
) -> object:
    return await b.mark_succeeded(job, worker, {"ok": True}, attempt=attempt)


async def _succeed_conn(
    b: Backend, conn: Connection, job: UUID, worker: UUID, attempt: int | None
) -> object:
    return await b.mark_succeeded_with_conn(conn, job, worker, {"ok": True}, attempt=attempt)


def batched(backend: Backend) -> SupportsBatchedSuccess:
    """``backend`` as a ``SupportsBatchedSuccess``; skips the test when it is not one."""
    if not isinstance(backend, SupportsBatchedSuccess):
        pytest.skip(f"{type(backend).__name__} does not implement SupportsBatchedSuccess")
    return backend


async def _succeed_many(
    b: Backend, conn: Connection, job: UUID, worker: UUID, attempt: int | None
) -> object:
    [flag] = await batched(b).mark_succeeded_many(
        worker, [SuccessWrite(job_id=job, attempt=attempt, result={"ok": True})]
    )
    return flag


async def _fail(
    b: Backend, conn: Connection, job: UUID, worker: UUID, attempt: int | None
) -> object:
    return await b.mark_failed_or_retry(job, worker, ERROR, None, attempt=attempt)


async def _cancel(
    b: Backend, conn: Connection, job: UUID, worker: UUID, attempt: int | None
) -> object:
    return await b.mark_cancelled(job, worker, attempt=attempt)


async def _escalate(
    b: Backend, conn: Connection, job: UUID, worker: UUID, attempt: int | None
) -> object:
    return await b.write_cancel_escalation(job, worker, 2, attempt=attempt)


async def _abandon(
    b: Backend, conn: Connection, job: UUID, worker: UUID, attempt: int | None
) -> object:
    return await b.mark_abandoned(job, worker, attempt=attempt)


async def _snooze(
    b: Backend, conn: Connection, job: UUID, worker: UUID, attempt: int | None
) -> object:
    return await b.mark_snoozed(job, worker, FAR, attempt=attempt)


async def _retry_after(
    b: Backend, conn: Connection, job: UUID, worker: UUID, attempt: int | None
) -> object:
    return await b.mark_retry_after(job, worker, FAR, attempt=attempt)


def handing_back(backend: Backend) -> SupportsUnstartedHandBack:
    """``backend`` as a ``SupportsUnstartedHandBack``; skips the test when it is not one."""
    if not isinstance(backend, SupportsUnstartedHandBack):
        pytest.skip(f"{type(backend).__name__} does not implement SupportsUnstartedHandBack")
    return backend


async def _hand_back(
    b: Backend, conn: Connection, job: UUID, worker: UUID, attempt: int | None
) -> object:
    return await handing_back(b).hand_back_unstarted(worker, [(job, attempt)])


_RETURNS_ROW = object()
"""Marker: ``mark_failed_or_retry`` reports through the row it returns."""

_WRITES = [
    _Write("mark_succeeded", _succeed, JobStatus.SUCCEEDED, "succeeded", False, True),
    _Write(
        "mark_succeeded_with_conn", _succeed_conn, JobStatus.SUCCEEDED, "succeeded", False, True
    ),
    _Write("mark_succeeded_many", _succeed_many, JobStatus.SUCCEEDED, "succeeded", False, True),
    _Write("mark_failed_or_retry", _fail, JobStatus.FAILED, "failed", _RETURNS_ROW, _RETURNS_ROW),
    _Write("mark_cancelled", _cancel, JobStatus.CANCELLED, "cancelled", False, True),
    _Write("write_cancel_escalation", _escalate, JobStatus.RUNNING, None, False, True, 1),
    _Write("mark_abandoned", _abandon, JobStatus.ABANDONED, "abandoned", False, True, 2),
    _Write("mark_snoozed", _snooze, JobStatus.SCHEDULED, "snoozed", "noop", "scheduled"),
    _Write(
        "mark_retry_after", _retry_after, JobStatus.SCHEDULED, "retry_after", "noop", "scheduled"
    ),
    _Write("hand_back_unstarted", _hand_back, JobStatus.PENDING, "unstarted", 0, 1),
]
# ``covers`` names Backend members; optional-protocol writes are checked all the same.
_WRITE_NAMES = [w.name for w in _WRITES if hasattr(Backend, w.name)]

_NOT_RUNNING_WITHOUT_WAIT = [
    JobStatus.PENDING,
    JobStatus.SCHEDULED,
    JobStatus.SUCCEEDED,
    JobStatus.FAILED,
    JobStatus.CANCELLED,
    JobStatus.ABANDONED,
]


def _expected(value: object, row: JobRow | None) -> object:
    return row if value is _RETURNS_ROW else value


async def _snapshot(backend: Backend, job_id: UUID) -> tuple[object, ...]:
    return (
        await backend.get(job_id),
        await backend.get_attempts(job_id),
        await backend.get_events(job_id),
    )


async def _attempt_two(backend: Backend, worker: UUID, cancel_phase: int) -> JobRow:
    """A running job on its second attempt, held by the worker that ran the first."""
    first = await enqueue_and_dispatch(backend, worker_id=worker)
    retried = await backend.mark_failed_or_retry(first.id, worker, ERROR, timedelta(0))
    assert retried.status is JobStatus.PENDING
    [second] = await backend.dispatch_batch(worker, [first.queue], 1, LONG_LEASE)
    assert (second.id, second.attempt, second.locked_by_worker) == (first.id, 2, worker)
    if cancel_phase >= 1:
        assert await backend.write_cancel_request(first.id, "conformance")
    if cancel_phase >= 2:
        assert await backend.write_cancel_escalation(first.id, worker, 2)
    return await fetch(backend, first.id)


class TerminalWriteTests:
    """The ``mark_*`` family and ``write_cancel_escalation``; ``retry_job``."""

    # -- the state table: writes act only on running jobs ---------------------------

    @pytest.mark.parametrize("status", _NOT_RUNNING_WITHOUT_WAIT)
    @pytest.mark.parametrize("write", _WRITES, ids=str)
    @covers(*_WRITE_NAMES)
    async def test_a_write_to_a_job_that_is_not_running_changes_nothing(
        self, backend: Backend, transaction_conn: Connection, write: _Write, status: JobStatus
    ) -> None:
        if write.name == "mark_succeeded_with_conn":
            require_conn(backend, transaction_conn)
        worker = uuid4()
        job = await reach(backend, status, worker_id=worker)
        before = await _snapshot(backend, job.id)
        result = await write.call(backend, transaction_conn, job.id, worker, None)
        assert result == _expected(write.noop, job)
        assert await _snapshot(backend, job.id) == before

    @covers(*_WRITE_NAMES)
    async def test_writes_to_a_crashed_job_change_nothing(
        self, backend: Backend, transaction_conn: Connection, advance_time: AdvanceTime
    ) -> None:
        worker = uuid4()
        job = await reach(backend, JobStatus.CRASHED, worker_id=worker, advance_time=advance_time)
        before = await _snapshot(backend, job.id)
        can_use_conn = (
            transaction_conn is not None or type(backend).supports_transactional_simulation
        )
        for write in _WRITES:
            if write.name == "mark_succeeded_with_conn" and not can_use_conn:
                continue
            result = await write.call(backend, transaction_conn, job.id, worker, None)
            assert result == _expected(write.noop, job), write.name
            assert await _snapshot(backend, job.id) == before, write.name

    @pytest.mark.parametrize("write", _WRITES, ids=str)
    @covers(*_WRITE_NAMES)
    async def test_a_write_to_an_unknown_job_is_a_noop(
        self, backend: Backend, transaction_conn: Connection, write: _Write
    ) -> None:
        if write.name == "mark_succeeded_with_conn":
            require_conn(backend, transaction_conn)
        if write.noop is _RETURNS_ROW:
            # With no row to return, an unknown id is an error.
            with pytest.raises(KeyError):
                await write.call(backend, transaction_conn, uuid4(), uuid4(), None)
        else:
            assert await write.call(backend, transaction_conn, uuid4(), uuid4(), None) == write.noop

    # -- acting, ownership and fencing ----------------------------------------------

    @pytest.mark.parametrize("write", _WRITES, ids=str)
    @covers(*_WRITE_NAMES, "get_attempts", "get_events")
    async def test_the_owner_writes_once_with_one_attempt_row_and_one_event(
        self, backend: Backend, transaction_conn: Connection, write: _Write
    ) -> None:
        if write.name == "mark_succeeded_with_conn":
            require_conn(backend, transaction_conn)
        worker = uuid4()
        job = await running_job(backend, worker_id=worker, cancel_phase=write.cancel_phase)
        events_before = await backend.get_events(job.id)
        result = await write.call(backend, transaction_conn, job.id, worker, 1)
        after = await fetch(backend, job.id)
        assert result == _expected(write.done, after)
        assert after.status is write.to_status
        events = await backend.get_events(job.id)
        assert events[: len(events_before)] == events_before
        [event] = events[len(events_before) :]
        attempts = await backend.get_attempts(job.id)
        if write.outcome is None:
            # The escalation changes the phase, not the status: the lock and attempt stay.
            assert after.cancel_phase == CancelPhase.FORCED
            assert (after.locked_by_worker, after.lock_expires_at) == (
                worker,
                job.lock_expires_at,
            )
            assert attempts == []
            assert event.kind == "cancel_escalated"
            assert event.detail == {"from_phase": 1, "to_phase": 2}
            return
        assert after.locked_by_worker is None and after.lock_expires_at is None
        assert event.kind == "state_change"
        assert (event.detail["from_state"], event.detail["to_state"]) == (
            "running",
            write.to_status,
        )
        attempt = only_attempt(attempts)
        assert (attempt.job_id, attempt.attempt, attempt.outcome) == (job.id, 1, write.outcome)
        assert attempt.worker_id == worker
        assert attempt.started_at == job.started_at
        assert_utc(attempt.finished_at, event.occurred_at)
        assert_close(attempt.finished_at, event.occurred_at)
        if after.is_terminal:
            assert_close(after.finished_at, event.occurred_at)
        else:
            assert after.finished_at is None
        await assert_history_consistent(backend, job.id)

    @pytest.mark.parametrize("write", _WRITES, ids=str)
    @covers(*_WRITE_NAMES)
    async def test_another_worker_cannot_write(
        self, backend: Backend, transaction_conn: Connection, write: _Write
    ) -> None:
        if write.name == "mark_succeeded_with_conn":
            require_conn(backend, transaction_conn)
        owner = uuid4()
        job = await running_job(backend, worker_id=owner, cancel_phase=write.cancel_phase)
        before = await _snapshot(backend, job.id)
        result = await write.call(backend, transaction_conn, job.id, uuid4(), None)
        assert result == _expected(write.noop, job)
        assert await _snapshot(backend, job.id) == before
        # The owner still can: the refusal was about ownership alone.
        result = await write.call(backend, transaction_conn, job.id, owner, None)
        assert result == _expected(write.done, await fetch(backend, job.id))

    @pytest.mark.parametrize("write", _WRITES, ids=str)
    @covers(*_WRITE_NAMES)
    async def test_a_stale_attempt_number_cannot_write(
        self, backend: Backend, transaction_conn: Connection, write: _Write
    ) -> None:
        if write.name == "mark_succeeded_with_conn":
            require_conn(backend, transaction_conn)
        worker = uuid4()
        job = await _attempt_two(backend, worker, write.cancel_phase)
        before = await _snapshot(backend, job.id)
        result = await write.call(backend, transaction_conn, job.id, worker, 1)
        assert result == _expected(write.noop, job)
        assert await _snapshot(backend, job.id) == before
        result = await write.call(backend, transaction_conn, job.id, worker, 2)
        assert result == _expected(write.done, await fetch(backend, job.id))

    @covers("mark_succeeded", "reclaim_expired_locks", "dispatch_batch")
    async def test_a_reclaimed_job_redispatched_to_the_same_worker_fences_the_old_attempt(
        self, backend: Backend, advance_time: AdvanceTime
    ) -> None:
        # A paused worker's job is reclaimed and handed back to the same worker id (a
        # restarted process reusing it): only the attempt number tells the runs apart.
        worker = uuid4()
        first = await enqueue_and_dispatch(backend, worker_id=worker, lease=SHORT_LEASE)
        await expire_short_leases(advance_time)
        assert await backend.reclaim_expired_locks(timedelta(0), timedelta(0)) == 1
        [second] = await backend.dispatch_batch(worker, [first.queue], 1, LONG_LEASE)
        assert (second.attempt, second.locked_by_worker) == (2, worker)
        assert not await backend.mark_succeeded(first.id, worker, "stale", attempt=1)
        assert await backend.get(first.id) == second
        assert await backend.mark_succeeded(first.id, worker, "fresh", attempt=2)
        done = await fetch(backend, first.id)
        assert (done.status, done.result) == (JobStatus.SUCCEEDED, "fresh")

    # -- mark_succeeded ------------------------------------------------------------------

    @pytest.mark.parametrize(
        "result",
        [
            {"a": 1},
            [1, "two", None],
            "text",
            42,
            2.5,
            True,
            None,
            {"deep": {"list": [{"x": None}]}},
        ],
        ids=["object", "array", "string", "int", "float", "bool", "null", "nested"],
    )
    @covers("mark_succeeded")
    async def test_mark_succeeded_stores_any_json_result(
        self, backend: Backend, result: Any
    ) -> None:
        worker = uuid4()
        job = await running_job(backend, worker_id=worker)
        assert await backend.mark_succeeded(job.id, worker, result)
        assert (await fetch(backend, job.id)).result == result

    @covers("mark_failed_or_retry", "mark_succeeded", "get_attempts")
    async def test_nul_characters_in_errors_and_results_are_stored_as_replacement_characters(
        self, backend: Backend
    ) -> None:
        # Postgres text and jsonb cannot hold NUL; a terminal write must not fail over one.
        worker = uuid4()
        job = await running_job(backend, worker_id=worker)
        error = ErrorInfo(error_class="Boom\x00", message="bad\x00byte", traceback="tb\x00")
        retried = await backend.mark_failed_or_retry(job.id, worker, error, timedelta(0))
        clean = ErrorInfo(error_class="Boom\ufffd", message="bad\ufffdbyte", traceback="tb\ufffd")
        assert retried.error == clean
        assert (await backend.get_attempts(job.id))[0].error == clean

        [again] = await backend.dispatch_batch(worker, [job.queue], 1, LONG_LEASE)
        # A NUL escaped in the text itself (a backslash and "u0000") is no NUL: it stays.
        result = {"text": "a\x00b", "key\x00": ["\x00", "\\u0000 stays", "\\\\u0000"]}
        assert await backend.mark_succeeded(again.id, worker, result, 1, {"at": "\x00"})
        done = await fetch(backend, job.id)
        assert done.result == {
            "text": "a\ufffdb",
            "key\ufffd": ["\ufffd", "\\u0000 stays", "\\\\u0000"],
        }
        assert done.progress_state == {"at": "\ufffd"}

    @covers("mark_failed_or_retry", "get_attempts")
    async def test_lone_surrogates_in_errors_are_stored_as_replacement_characters(
        self, backend: Backend
    ) -> None:
        # What os.fsdecode makes of undecodable bytes (an exception naming a file):
        # Postgres refuses text that is not UTF-8, and the failure write must not fail.
        worker = uuid4()
        job = await running_job(backend, worker_id=worker)
        error = ErrorInfo(error_class="Boom", message="no /data/\udcff.csv", traceback="tb\udcff")
        retried = await backend.mark_failed_or_retry(job.id, worker, error, timedelta(0))
        clean = ErrorInfo(error_class="Boom", message="no /data/\ufffd.csv", traceback="tb\ufffd")
        assert retried.error == clean
        assert (await backend.get_attempts(job.id))[0].error == clean

    @pytest.mark.parametrize(
        ("bad", "error"),
        [
            (float("nan"), "is not a JSON number"),
            (float("inf"), "is not a JSON number"),
            (float("-inf"), "is not a JSON number"),
            (-(10**4300), "more than 4300 digits"),
            ("\udcff", "lone surrogate .* cannot be stored as JSON"),
        ],
        ids=["nan", "inf", "-inf", "long-int", "surrogate"],
    )
    @covers("mark_succeeded", "record_progress")
    async def test_numbers_json_cannot_hold_are_refused_and_change_nothing(
        self, backend: Backend, bad: float, error: str
    ) -> None:
        worker = uuid4()
        job = await running_job(backend, worker_id=worker)
        with pytest.raises(ValueError, match=error):
            await backend.mark_succeeded(job.id, worker, {"ratio": [1.0, bad]})
        with pytest.raises(ValueError, match=error):
            await backend.record_progress(job.id, worker, 1, {"ratio": bad})
        assert await fetch(backend, job.id) == job

    @covers(
        "record_progress",
        "mark_succeeded",
        "mark_succeeded_many",
        "mark_failed_or_retry",
        "mark_cancelled",
        "mark_abandoned",
        "mark_snoozed",
        "mark_retry_after",
    )
    async def test_a_value_json_cannot_hold_is_refused_even_where_it_would_not_be_stored(
        self, backend: Backend
    ) -> None:
        # Refused as an argument, not only when written: progress that is not newer, a
        # write that turns out a no-op (another worker's, a job past its guard) and a
        # batch whose other items are fine raise as Postgres does when it serializes the
        # call's values, and change nothing.
        worker, other = uuid4(), uuid4()
        job = await running_job(backend, worker_id=worker)
        assert await backend.record_progress(job.id, worker, 5, {"at": 5})
        job = await fetch(backend, job.id)
        bad = {"ratio": float("nan")}
        unstored = "is not a JSON number"
        with pytest.raises(ValueError, match=unstored):
            await backend.record_progress(job.id, worker, 3, bad)
        with pytest.raises(ValueError, match=unstored):
            await backend.record_progress(job.id, other, 9, bad)
        with pytest.raises(ValueError, match=unstored):
            await backend.mark_succeeded(job.id, worker, 1, progress_seq=1, progress_state=bad)
        with pytest.raises(ValueError, match=unstored):
            await backend.mark_succeeded(job.id, other, bad)
        with pytest.raises(ValueError, match=unstored):
            await backend.mark_failed_or_retry(
                job.id, worker, ERROR, None, progress_seq=1, progress_state=bad
            )
        with pytest.raises(ValueError, match=unstored):
            await backend.mark_cancelled(job.id, other, progress_seq=9, progress_state=bad)
        with pytest.raises(ValueError, match=unstored):
            await backend.mark_abandoned(job.id, other, progress_seq=9, progress_state=bad)
        with pytest.raises(ValueError, match=unstored):
            await backend.mark_snoozed(job.id, other, timedelta(0), metadata_update=bad)
        with pytest.raises(ValueError, match=unstored):
            await backend.mark_retry_after(
                job.id, worker, timedelta(0), progress_seq=1, progress_state=bad
            )
        assert await fetch(backend, job.id) == job
        assert await backend.get_attempts(job.id) == []
        if isinstance(backend, SupportsBatchedSuccess):
            with pytest.raises(ValueError, match=unstored):
                await backend.mark_succeeded_many(
                    worker,
                    [
                        SuccessWrite(job_id=job.id, result=1),
                        SuccessWrite(job_id=job.id, result=bad),
                    ],
                )
            assert await fetch(backend, job.id) == job
        assert await backend.mark_succeeded(job.id, worker, 1, attempt=job.attempt)

    @pytest.mark.parametrize(
        ("result_ttl", "fallback", "expected"),
        [
            (None, None, None),
            (timedelta(hours=1), None, timedelta(hours=1)),
            (None, timedelta(hours=2), timedelta(hours=2)),
            (timedelta(hours=1), timedelta(hours=2), timedelta(hours=1)),
        ],
        ids=["no-ttl", "job-ttl", "fallback-ttl", "job-ttl-wins"],
    )
    @pytest.mark.parametrize("method", ["mark_succeeded", "mark_succeeded_with_conn"])
    @covers("mark_succeeded", "mark_succeeded_with_conn")
    async def test_results_expire_after_the_job_ttl_else_the_fallback(
        self,
        backend: Backend,
        transaction_conn: Connection,
        method: str,
        result_ttl: timedelta | None,
        fallback: timedelta | None,
        expected: timedelta | None,
    ) -> None:
        worker = uuid4()
        job = await running_job(backend, worker_id=worker, result_ttl=result_ttl)
        if method == "mark_succeeded":
            assert await backend.mark_succeeded(job.id, worker, 1, fallback_result_ttl=fallback)
        else:
            require_conn(backend, transaction_conn)
            assert await backend.mark_succeeded_with_conn(
                transaction_conn, job.id, worker, 1, fallback_result_ttl=fallback
            )
        done = await fetch(backend, job.id)
        if expected is None:
            assert done.result_expires_at is None
        else:
            assert done.finished_at is not None
            assert_utc(done.result_expires_at)
            assert_close(done.result_expires_at, done.finished_at + expected)

    @pytest.mark.parametrize(
        ("seq", "kept"), [(2, True), (5, True), (7, False)], ids=["lower", "equal", "higher"]
    )
    @covers("mark_succeeded", "mark_failed_or_retry")
    async def test_progress_is_stored_only_when_its_sequence_grows(
        self, backend: Backend, seq: int, kept: bool
    ) -> None:
        worker = uuid4()
        job = await enqueue_and_dispatch(backend, worker_id=worker)
        retried = await backend.mark_failed_or_retry(
            job.id, worker, ERROR, timedelta(0), progress_seq=5, progress_state={"at": 5}
        )
        assert (retried.progress_seq, retried.progress_state) == (5, {"at": 5})
        await backend.dispatch_batch(worker, [job.queue], 1, LONG_LEASE)
        assert await backend.mark_succeeded(
            job.id, worker, None, progress_seq=seq, progress_state={"at": seq}
        )
        done = await fetch(backend, job.id)
        expected = (5, {"at": 5}) if kept else (seq, {"at": seq})
        assert (done.progress_seq, done.progress_state) == expected

    @pytest.mark.parametrize("write", ["mark_succeeded", "mark_succeeded_many"])
    @covers("mark_succeeded", "get_attempts", "mark_succeeded_many")
    async def test_a_success_after_a_failed_attempt_clears_the_jobs_error(
        self, backend: Backend, write: str
    ) -> None:
        worker = uuid4()
        job = await _attempt_two(backend, worker, cancel_phase=0)
        assert job.error is not None  # the first attempt's
        if write == "mark_succeeded":
            assert await backend.mark_succeeded(job.id, worker, "ok")
        else:
            success = SuccessWrite(job_id=job.id, attempt=job.attempt, result="ok")
            assert await batched(backend).mark_succeeded_many(worker, [success]) == [True]
        done = await fetch(backend, job.id)
        assert (done.status, done.error) == (JobStatus.SUCCEEDED, None)
        attempts = await backend.get_attempts(job.id)
        assert [a.outcome for a in attempts] == ["failed", "succeeded"]
        assert attempts[0].error is not None  # the history keeps it

    @covers("record_progress")
    async def test_record_progress_persists_while_running_and_never_rolls_back(
        self, backend: Backend
    ) -> None:
        worker = uuid4()
        job = await enqueue_and_dispatch(backend, worker_id=worker)
        assert await backend.record_progress(job.id, worker, 2, {"done": 20}, attempt=job.attempt)
        row = await fetch(backend, job.id)
        assert (row.status, row.progress_seq, row.progress_state) == (
            JobStatus.RUNNING,
            2,
            {"done": 20},
        )
        # an older write arriving late is accepted as the owner's but changes nothing
        assert await backend.record_progress(job.id, worker, 1, {"done": 10})
        row = await fetch(backend, job.id)
        assert (row.progress_seq, row.progress_state) == (2, {"done": 20})
        # not the owner, or a stale attempt: refused
        assert not await backend.record_progress(job.id, uuid4(), 3, {"done": 30})
        assert not await backend.record_progress(
            job.id, worker, 3, {"done": 30}, attempt=job.attempt + 1
        )
        assert (await fetch(backend, job.id)).progress_seq == 2
        assert await backend.mark_succeeded(job.id, worker, None)
        assert not await backend.record_progress(job.id, worker, 9, {"done": 90})
        done = await fetch(backend, job.id)
        assert (done.progress_seq, done.progress_state) == (2, {"done": 20})

    # -- mark_succeeded_many (SupportsBatchedSuccess) ---------------------------------

    @covers("mark_succeeded_many")
    async def test_mark_succeeded_many_judges_each_item_on_its_own(self, backend: Backend) -> None:
        many = batched(backend)
        worker = uuid4()
        fenced = await running_job(backend, worker_id=worker)
        unfenced = await running_job(backend, worker_id=worker)
        foreign = await running_job(backend, worker_id=uuid4())
        stale = await _attempt_two(backend, worker, 0)
        finished = await running_job(backend, worker_id=worker)
        assert await backend.mark_succeeded(finished.id, worker, "first")
        untouched = [foreign, stale, finished]
        before = [await _snapshot(backend, job.id) for job in untouched]
        flags = await many.mark_succeeded_many(
            worker,
            [
                SuccessWrite(job_id=fenced.id, attempt=1, result={"n": 1}),
                SuccessWrite(job_id=foreign.id, attempt=1, result="not yours"),
                SuccessWrite(job_id=stale.id, attempt=1, result="stale"),
                SuccessWrite(job_id=uuid4(), result="unknown"),
                SuccessWrite(job_id=finished.id, result="twice"),
                SuccessWrite(
                    job_id=unfenced.id, result=[2], progress_seq=3, progress_state={"p": 3}
                ),
            ],
        )
        assert flags == [True, False, False, False, False, True]
        assert [await _snapshot(backend, job.id) for job in untouched] == before
        for job, result, progress in [
            (fenced, {"n": 1}, (0, None)),
            (unfenced, [2], (3, {"p": 3})),
        ]:
            done = await fetch(backend, job.id)
            assert (done.status, done.result) == (JobStatus.SUCCEEDED, result)
            assert (done.progress_seq, done.progress_state) == progress
            assert done.locked_by_worker is None and done.lock_expires_at is None
            attempt = only_attempt(await backend.get_attempts(job.id))
            assert (attempt.attempt, attempt.outcome, attempt.worker_id) == (
                1,
                "succeeded",
                worker,
            )
            event = await last_event(backend, job.id)
            assert event.detail == {"from_state": "running", "to_state": "succeeded"}
            assert_close(done.finished_at, event.occurred_at)
            await assert_history_consistent(backend, job.id)

    @pytest.mark.parametrize(
        ("result_ttl", "fallback", "expected"),
        [
            (None, None, None),
            (timedelta(hours=1), timedelta(hours=2), timedelta(hours=1)),
            (None, timedelta(hours=2), timedelta(hours=2)),
        ],
        ids=["no-ttl", "job-ttl-wins", "fallback-ttl"],
    )
    @covers("mark_succeeded_many")
    async def test_mark_succeeded_many_expires_results_like_mark_succeeded(
        self,
        backend: Backend,
        result_ttl: timedelta | None,
        fallback: timedelta | None,
        expected: timedelta | None,
    ) -> None:
        many = batched(backend)
        worker = uuid4()
        job = await running_job(backend, worker_id=worker, result_ttl=result_ttl)
        assert await many.mark_succeeded_many(
            worker, [SuccessWrite(job_id=job.id, result=None)], fallback
        ) == [True]
        done = await fetch(backend, job.id)
        assert done.result is None
        if expected is None:
            assert done.result_expires_at is None
        else:
            assert done.finished_at is not None
            assert_close(done.result_expires_at, done.finished_at + expected)

    @covers("mark_succeeded_many")
    async def test_mark_succeeded_many_keeps_newer_progress(self, backend: Backend) -> None:
        many = batched(backend)
        worker = uuid4()
        job = await running_job(backend, worker_id=worker)
        assert await backend.record_progress(job.id, worker, 5, {"at": 5})
        assert await many.mark_succeeded_many(
            worker, [SuccessWrite(job_id=job.id, progress_seq=2, progress_state={"at": 2})]
        ) == [True]
        done = await fetch(backend, job.id)
        assert (done.progress_seq, done.progress_state) == (5, {"at": 5})

    @pytest.mark.parametrize(
        ("attempts", "flags"),
        [
            ((1, 2), [False, True]),
            ((2, 1), [True, False]),
            ((2, 2), [True, False]),
            ((None, 2), [True, False]),
        ],
        ids=["stale-first", "current-first", "same-twice", "any-then-current"],
    )
    @covers("mark_succeeded_many")
    async def test_mark_succeeded_many_judges_items_of_one_job_in_order(
        self, backend: Backend, attempts: tuple[int | None, int], flags: list[bool]
    ) -> None:
        # A worker's old attempt of a job, its lease lapsed and the job dispatched to
        # it again, can share a batch with the new attempt: the current attempt's
        # success must land, told apart from the stale one by attempt, and an item of
        # a job already moved by an earlier one moves nothing.
        many = batched(backend)
        worker = uuid4()
        job = await _attempt_two(backend, worker, 0)
        results = [f"attempt {n}, item {i}" for i, n in enumerate(attempts)]
        items = [
            SuccessWrite(job_id=job.id, attempt=n, result=result)
            for n, result in zip(attempts, results, strict=True)
        ]
        assert await many.mark_succeeded_many(worker, items) == flags
        done = await fetch(backend, job.id)
        assert (done.status, done.result) == (JobStatus.SUCCEEDED, results[flags.index(True)])
        outcomes = [(a.attempt, a.outcome) for a in await backend.get_attempts(job.id)]
        assert outcomes == [(1, "failed"), (2, "succeeded")]
        await assert_history_consistent(backend, job.id)

    @covers("mark_succeeded_many")
    async def test_mark_succeeded_many_of_nothing_is_nothing(self, backend: Backend) -> None:
        assert await batched(backend).mark_succeeded_many(uuid4(), []) == []

    # -- hand_back_unstarted (SupportsUnstartedHandBack) ------------------------------

    @covers("hand_back_unstarted")
    async def test_hand_back_unstarted_moves_each_owned_job_like_an_interrupting_snooze(
        self, backend: Backend
    ) -> None:
        many = handing_back(backend)
        worker = uuid4()
        first = await running_job(backend, worker_id=worker)
        second = await running_job(backend, worker_id=worker)
        stale = await running_job(backend, worker_id=worker)
        elsewhere = await running_job(backend, worker_id=uuid4())
        jobs = [(first.id, 1), (second.id, None), (first.id, 1), (stale.id, 2)]
        assert await many.hand_back_unstarted(worker, [*jobs, (elsewhere.id, None)]) == 2
        for job in (first, second):
            row = await fetch(backend, job.id)
            assert (row.status, row.attempt, row.max_attempts) == (
                JobStatus.PENDING,
                1,
                job.max_attempts + 1,
            )
            assert row.locked_by_worker is None
            assert_close(row.scheduled_at, (await last_event(backend, job.id)).occurred_at)
            assert only_attempt(await backend.get_attempts(job.id)).outcome == "unstarted"
            await assert_history_consistent(backend, job.id)
        for job in (stale, elsewhere):
            assert (await fetch(backend, job.id)).status is JobStatus.RUNNING
        assert await many.hand_back_unstarted(worker, []) == 0

    @covers("hand_back_unstarted", "mark_snoozed", "get_attempts", "get_events")
    async def test_hand_back_unstarted_records_an_attempt_that_never_ran(
        self, backend: Backend
    ) -> None:
        # Locked at dispatch, given back before its code began: its history read as a
        # run from dispatch to hand-back ("interrupted", that span its duration), the
        # same as a run a shutdown stopped. It must say it never ran.
        many = handing_back(backend)
        worker = uuid4()
        held = await running_job(backend, worker_id=worker)
        stopped = await running_job(backend, worker_id=worker)
        assert await many.hand_back_unstarted(worker, [(held.id, held.attempt)]) == 1
        assert (
            await backend.mark_snoozed(
                stopped.id, worker, timedelta(0), outcome="interrupted", attempt=stopped.attempt
            )
            == "scheduled"
        )
        attempt = only_attempt(await backend.get_attempts(held.id))
        event = await last_event(backend, held.id)
        assert attempt.outcome == "unstarted"
        assert event.detail.get("reason") == "unstarted"
        # Its times are the real ones, the dispatch and the hand-back; they span a hold,
        # not a run, so it has no duration.
        assert attempt.started_at == held.started_at
        assert_close(attempt.finished_at, event.occurred_at)
        assert attempt.duration is None
        ran = only_attempt(await backend.get_attempts(stopped.id))
        assert ran.outcome == "interrupted"
        assert (await last_event(backend, stopped.id)).detail.get("reason") == "interrupted"
        assert ran.duration is not None

    @pytest.mark.parametrize("stale_first", [True, False], ids=["stale-first", "current-first"])
    @covers("hand_back_unstarted")
    async def test_hand_back_unstarted_is_not_hidden_by_a_stale_entry(
        self, backend: Backend, stale_first: bool
    ) -> None:
        # Each entry on its own guard: a stale attempt's entry listed beside the
        # current one's must not keep the job running (Postgres kept either entry).
        many = handing_back(backend)
        worker = uuid4()
        job = await _attempt_two(backend, worker, 0)
        entries = [(job.id, 1), (job.id, 2)]
        assert (
            await many.hand_back_unstarted(worker, entries if stale_first else entries[::-1]) == 1
        )
        assert (await fetch(backend, job.id)).status is JobStatus.PENDING

    # -- mark_failed_or_retry ---------------------------------------------------------

    @pytest.mark.parametrize(
        ("max_attempts", "deadline", "retry_delay", "status", "reason"),
        [
            (3, None, None, JobStatus.FAILED, "no_retry"),
            (3, None, FAR, JobStatus.SCHEDULED, "retry"),
            (3, None, timedelta(0), JobStatus.PENDING, "retry"),
            (1, None, FAR, JobStatus.FAILED, "attempts_exhausted"),
            (3, timedelta(minutes=30), FAR, JobStatus.FAILED, "retry_past_deadline"),
            (3, timedelta(hours=2), FAR, JobStatus.SCHEDULED, "retry"),
        ],
        ids=[
            "no-retry",
            "retry-later",
            "retry-now",
            "attempts-spent",
            "retry-past-deadline",
            "retry-within-deadline",
        ],
    )
    @covers("mark_failed_or_retry")
    async def test_mark_failed_or_retry_decides_between_failing_and_retrying(
        self,
        backend: Backend,
        max_attempts: int,
        deadline: timedelta | None,
        retry_delay: timedelta | None,
        status: JobStatus,
        reason: str,
    ) -> None:
        worker = uuid4()
        job = await running_job(
            backend, worker_id=worker, max_attempts=max_attempts, schedule_to_close=deadline
        )
        returned = await backend.mark_failed_or_retry(job.id, worker, ERROR, retry_delay)
        after = await fetch(backend, job.id)
        assert returned == after
        assert after.status is status
        assert after.error == ERROR
        attempt = only_attempt(await backend.get_attempts(job.id))
        assert (attempt.outcome, attempt.error) == ("failed", ERROR)
        event = await last_event(backend, job.id)
        # The error is the actor's own: a job failed at attempt 1 of 3 says why, and one
        # put back in the queue says it is a retry (the attempt's outcome says "failed").
        assert event.detail == {"from_state": "running", "to_state": status.value, "reason": reason}
        now = event.occurred_at
        if status is JobStatus.FAILED:
            assert_close(after.finished_at, now)
        else:
            assert retry_delay is not None
            assert_close(after.scheduled_at, now + retry_delay)

    @covers("mark_failed_or_retry")
    async def test_a_job_failed_by_its_deadline_says_so(self, backend: Backend) -> None:
        # Its worker saw the deadline pass while it ran: labelled no_retry, as if the
        # actor's error were not retryable, where the deadline sweep says deadline_exceeded.
        worker = uuid4()
        job = await running_job(backend, worker_id=worker, schedule_to_close=timedelta(hours=2))
        await backend.mark_failed_or_retry(job.id, worker, DEADLINE_EXCEEDED, None)
        event = await last_event(backend, job.id)
        assert event.detail.get("reason") == "deadline_exceeded"

    # -- the cancel phases ---------------------------------------------------------------

    @pytest.mark.parametrize("phase", [0, 2], ids=["not-requested", "already-forced"])
    @covers("write_cancel_escalation")
    async def test_escalation_needs_phase_one(self, backend: Backend, phase: int) -> None:
        worker = uuid4()
        job = await running_job(backend, worker_id=worker, cancel_phase=phase)
        before = await _snapshot(backend, job.id)
        assert not await backend.write_cancel_escalation(job.id, worker, 2)
        assert await _snapshot(backend, job.id) == before

    @pytest.mark.parametrize("phase", [0, 1], ids=["not-requested", "cooperative"])
    @covers("mark_abandoned")
    async def test_abandoning_needs_phase_two(self, backend: Backend, phase: int) -> None:
        worker = uuid4()
        job = await running_job(backend, worker_id=worker, cancel_phase=phase)
        before = await _snapshot(backend, job.id)
        assert not await backend.mark_abandoned(job.id, worker)
        assert await _snapshot(backend, job.id) == before

    @covers("mark_cancelled", "write_cancel_request")
    async def test_the_owner_can_cancel_while_a_cancel_is_requested(self, backend: Backend) -> None:
        worker = uuid4()
        job = await running_job(backend, worker_id=worker, cancel_phase=1)
        assert await backend.mark_cancelled(job.id, worker)
        done = await fetch(backend, job.id)
        assert done.status is JobStatus.CANCELLED
        assert only_attempt(await backend.get_attempts(job.id)).outcome == "cancelled"

    @covers("mark_cancelled", "write_cancel_request")
    async def test_a_running_jobs_cancelled_event_gives_the_cancels_reason(
        self, backend: Backend
    ) -> None:
        # As a pending job's does: the running one's said only "running -> cancelled".
        worker = uuid4()
        job = await running_job(backend, worker_id=worker)
        assert await backend.write_cancel_request(job.id, "customer asked")
        assert await backend.mark_cancelled(job.id, worker)
        event = await last_event(backend, job.id)
        assert event.detail == {
            "from_state": "running",
            "to_state": "cancelled",
            "reason": "customer asked",
        }

    # -- mark_snoozed -------------------------------------------------------------------

    @pytest.mark.parametrize(
        ("delay", "deadline", "outcome", "returned", "status"),
        [
            (FAR, None, "snoozed", "scheduled", JobStatus.SCHEDULED),
            (timedelta(0), None, "snoozed", "scheduled", JobStatus.PENDING),
            (FAR, None, "reservation_denied", "scheduled", JobStatus.SCHEDULED),
            (FAR, timedelta(minutes=30), "snoozed", "failed", JobStatus.FAILED),
        ],
        ids=["later", "zero-delay", "custom-outcome", "past-deadline"],
    )
    @covers("mark_snoozed")
    async def test_mark_snoozed_reschedules_without_using_an_attempt(
        self,
        backend: Backend,
        delay: timedelta,
        deadline: timedelta | None,
        outcome: AttemptOutcome,
        returned: str,
        status: JobStatus,
    ) -> None:
        worker = uuid4()
        job = await running_job(
            backend, worker_id=worker, max_attempts=2, schedule_to_close=deadline
        )
        assert await backend.mark_snoozed(job.id, worker, delay, outcome=outcome) == returned
        after = await fetch(backend, job.id)
        assert after.status is status
        attempt = only_attempt(await backend.get_attempts(job.id))
        assert (attempt.attempt, attempt.outcome) == (1, outcome)
        event = await last_event(backend, job.id)
        now = event.occurred_at
        if status is JobStatus.FAILED:
            assert error_class_name(after.error) == "DeadlineExceeded"
            assert event.detail.get("reason") == "deadline_exceeded"  # said, as every failure
            assert_close(after.finished_at, now)
            # Ended: no attempt given back (it showed 1 of 3, attempts it could not use).
            assert after.max_attempts == 2
        else:
            assert event.detail.get("reason") == outcome  # snoozed, interrupted…: why it is back
            assert after.max_attempts == 3
            assert_close(after.scheduled_at, now + delay)

    @pytest.mark.parametrize(
        "delay", [timedelta(seconds=-1), MAX_DURATION + timedelta(days=1)], ids=["past", "far"]
    )
    @covers("mark_failed_or_retry", "mark_snoozed", "mark_retry_after")
    async def test_a_delay_below_zero_or_past_a_century_is_refused_and_changes_nothing(
        self, backend: Backend, delay: timedelta
    ) -> None:
        # Past year 9999 Postgres stored a time no reader could decode: every listing of
        # the jobs table failed from then on.
        worker = uuid4()
        job = await running_job(backend, worker_id=worker)
        error = ErrorInfo(error_class="Boom", message="x")
        with pytest.raises(ValueError, match="delay must be between 0 and 36500 days"):
            await backend.mark_failed_or_retry(job.id, worker, error, delay)
        with pytest.raises(ValueError, match="delay must be between 0 and 36500 days"):
            await backend.mark_snoozed(job.id, worker, delay)
        with pytest.raises(ValueError, match="delay must be between 0 and 36500 days"):
            await backend.mark_retry_after(job.id, worker, delay)
        assert await fetch(backend, job.id) == job
        assert await backend.get_attempts(job.id) == []

    @covers("mark_retry_after")
    async def test_a_rate_limit_denial_past_the_deadline_gives_no_attempt_back(
        self, backend: Backend
    ) -> None:
        worker = uuid4()
        job = await running_job(
            backend, worker_id=worker, max_attempts=2, schedule_to_close=timedelta(minutes=30)
        )
        verdict = await backend.mark_retry_after(job.id, worker, FAR, consume_budget=False)
        assert verdict == "failed:DeadlineExceeded"
        after = await fetch(backend, job.id)
        assert (after.status, after.max_attempts) == (JobStatus.FAILED, 2)

    @pytest.mark.parametrize("write", ["snooze", "rate_limit_denied"])
    @covers("mark_snoozed", "mark_retry_after")
    async def test_giving_back_an_attempt_stops_at_the_largest_max_attempts(
        self, backend: Backend, write: str
    ) -> None:
        # "Retry forever" (max_attempts at its largest) and a snooze: Postgres refused
        # the write (integer out of range) while memory stored 2**31.
        worker = uuid4()
        job = await running_job(backend, worker_id=worker, max_attempts=INT32_MAX)
        if write == "snooze":
            assert await backend.mark_snoozed(job.id, worker, timedelta(0)) == "scheduled"
        else:
            verdict = await backend.mark_retry_after(
                job.id, worker, timedelta(0), consume_budget=False
            )
            assert verdict == "scheduled"
        assert (await fetch(backend, job.id)).max_attempts == INT32_MAX

    @covers("mark_snoozed")
    async def test_mark_snoozed_merges_the_metadata_update_shallowly(
        self, backend: Backend
    ) -> None:
        worker = uuid4()
        job = await running_job(
            backend, worker_id=worker, metadata={"keep": 1, "nested": {"x": 1}, "swap": "old"}
        )
        update = {"nested": {"y": 2}, "swap": "new", "added": [1]}
        assert (
            await backend.mark_snoozed(job.id, worker, FAR, metadata_update=update) == "scheduled"
        )
        assert (await fetch(backend, job.id)).metadata == {
            "keep": 1,
            "nested": {"y": 2},
            "swap": "new",
            "added": [1],
        }

    @covers("mark_snoozed", "mark_retry_after", "dispatch_batch")
    async def test_snoozing_keeps_attempt_numbers_unique(self, backend: Backend) -> None:
        worker = uuid4()
        job = await running_job(backend, worker_id=worker, max_attempts=1)
        assert await backend.mark_snoozed(job.id, worker, timedelta(0)) == "scheduled"
        [again] = await backend.dispatch_batch(worker, [job.queue], 1, LONG_LEASE)
        assert (again.attempt, again.max_attempts) == (2, 2)
        # The snooze gave back the budget it did not use, and no more.
        assert await backend.mark_retry_after(job.id, worker, FAR) == "failed:MaxAttemptsExceeded"
        attempts = await backend.get_attempts(job.id)
        assert [(a.attempt, a.outcome) for a in attempts] == [(1, "snoozed"), (2, "retry_after")]

    # -- mark_retry_after -----------------------------------------------------------------

    @pytest.mark.parametrize(
        ("consume", "max_attempts", "deadline", "returned", "max_after"),
        [
            (True, 3, None, "scheduled", 3),
            (True, 1, None, "failed:MaxAttemptsExceeded", 1),
            (True, 3, timedelta(minutes=30), "failed:DeadlineExceeded", 3),
            (True, 1, timedelta(minutes=30), "failed:DeadlineExceeded", None),
            (False, 1, None, "scheduled", 2),
            (False, 3, None, "scheduled", 4),
            (False, 3, timedelta(minutes=30), "failed:DeadlineExceeded", None),
        ],
        ids=[
            "retry",
            "attempts-spent",
            "past-deadline",
            "deadline-checked-first",
            "denied-without-budget",
            "denied-with-budget",
            "denied-past-deadline",
        ],
    )
    @covers("mark_retry_after")
    async def test_mark_retry_after_outcomes(
        self,
        backend: Backend,
        consume: bool,
        max_attempts: int,
        deadline: timedelta | None,
        returned: str,
        max_after: int | None,
    ) -> None:
        worker = uuid4()
        job = await running_job(
            backend, worker_id=worker, max_attempts=max_attempts, schedule_to_close=deadline
        )
        result = await backend.mark_retry_after(job.id, worker, FAR, consume_budget=consume)
        assert result == returned
        after = await fetch(backend, job.id)
        attempt = only_attempt(await backend.get_attempts(job.id))
        assert attempt.outcome == ("retry_after" if consume else "rate_limit_denied")
        if max_after is not None:
            assert after.max_attempts == max_after
        event = await last_event(backend, job.id)
        now = event.occurred_at
        if returned == "scheduled":
            assert after.status is JobStatus.SCHEDULED
            assert event.detail.get("reason") == attempt.outcome  # why it is back
            assert_close(after.scheduled_at, now + FAR)
        else:
            assert after.status is JobStatus.FAILED
            # Said, as every failure: it failed without a reason in its event.
            reason = "deadline_exceeded" if "Deadline" in returned else "attempts_exhausted"
            assert event.detail.get("reason") == reason
            assert_close(after.finished_at, now)

    # -- back to pending: a wake ------------------------------------------------------------

    @pytest.mark.parametrize(
        "path", ["snooze", "interrupted", "retry", "retry_after", "hand_back_unstarted"]
    )
    @covers(
        "subscribe_wake",
        "mark_snoozed",
        "mark_failed_or_retry",
        "mark_retry_after",
        "hand_back_unstarted",
    )
    async def test_a_worker_putting_a_job_back_in_pending_wakes_every_subscriber(
        self, backend: Backend, path: str
    ) -> None:
        # As an enqueue does: an idle worker would otherwise take the job only at its
        # next poll (a stopping worker's hand-backs, retries without a delay).
        worker = uuid4()
        job = await running_job(backend, worker_id=worker)
        async with backend.subscribe_wake() as first, backend.subscribe_wake() as second:
            if path == "snooze":
                await backend.mark_snoozed(job.id, worker, timedelta(0), attempt=job.attempt)
            elif path == "interrupted":
                await backend.mark_snoozed(
                    job.id, worker, timedelta(0), outcome="interrupted", attempt=job.attempt
                )
            elif path == "retry":
                await backend.mark_failed_or_retry(
                    job.id, worker, ERROR, timedelta(0), attempt=job.attempt
                )
            elif path == "retry_after":
                await backend.mark_retry_after(job.id, worker, timedelta(0), attempt=job.attempt)
            else:
                await handing_back(backend).hand_back_unstarted(worker, [(job.id, job.attempt)])
            assert (await fetch(backend, job.id)).status is JobStatus.PENDING
            await wait_for_wake(first)
            await wait_for_wake(second)

    # -- retry_job ------------------------------------------------------------------------

    @pytest.mark.parametrize(
        "status",
        [JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.ABANDONED, JobStatus.CRASHED],
    )
    @covers("retry_job", "subscribe_wake")
    async def test_retry_job_gives_a_finished_job_a_new_life(
        self, backend: Backend, advance_time: AdvanceTime, status: JobStatus
    ) -> None:
        worker = uuid4()
        job = await reach(
            backend, status, worker_id=worker, advance_time=advance_time, max_attempts=1
        )
        async with backend.subscribe_wake() as wake:
            assert await backend.retry_job(job.id)
            await wait_for_wake(wake)
        after = await fetch(backend, job.id)
        event = await last_event(backend, job.id)
        assert event.kind == "state_change"
        assert event.detail["reason"] == "retried"
        assert (event.detail["from_state"], event.detail["to_state"]) == (status, "pending")
        assert after.status is JobStatus.PENDING
        assert_close(after.scheduled_at, event.occurred_at)
        assert (after.locked_by_worker, after.lock_expires_at) == (None, None)
        assert after.cancel_phase == CancelPhase.NONE
        assert (after.cancel_requested_at, after.cancel_reason) == (None, None)
        assert (after.finished_at, after.result, after.error) == (None, None, None)
        # A job that spent its budget gets exactly one more attempt.
        assert after.max_attempts == max(job.max_attempts, job.attempt + 1)
        [again] = await backend.dispatch_batch(worker, [job.queue], 1, LONG_LEASE)
        assert again.attempt == job.attempt + 1
        await assert_history_consistent(backend, job.id)

    @covers("retry_job")
    async def test_retry_job_keeps_a_budget_that_is_not_spent(self, backend: Backend) -> None:
        job = await reach(backend, JobStatus.FAILED, max_attempts=4)
        assert await backend.retry_job(job.id)
        assert (await fetch(backend, job.id)).max_attempts == 4

    @pytest.mark.parametrize(
        "status",
        [JobStatus.PENDING, JobStatus.SCHEDULED, JobStatus.RUNNING, JobStatus.SUCCEEDED],
    )
    @covers("retry_job")
    async def test_retry_job_refuses_other_statuses(
        self, backend: Backend, status: JobStatus
    ) -> None:
        job = await reach(backend, status)
        before = await _snapshot(backend, job.id)
        assert not await backend.retry_job(job.id)
        assert await _snapshot(backend, job.id) == before

    @covers("retry_job", "deadline_sweep")
    async def test_retry_job_refuses_a_job_past_its_deadline(
        self, backend: Backend, advance_time: AdvanceTime
    ) -> None:
        # It was put back to pending, said so, and failed DeadlineExceeded again at the
        # next sweep, without running.
        late = await enqueue_and_dispatch(
            backend, worker_id=uuid4(), schedule_to_close=SHORT_LEASE, lease=LONG_LEASE
        )
        timely = await enqueue_and_dispatch(
            backend, worker_id=uuid4(), schedule_to_close=FAR, lease=LONG_LEASE
        )
        for job in (late, timely):
            assert await backend.write_cancel_request(job.id, "stop")
            assert await backend.mark_cancelled(job.id, job.locked_by_worker)  # type: ignore[arg-type]
        await advance_time(SHORT_LEASE * 2)
        before = await _snapshot(backend, late.id)
        with pytest.raises(RetryRefusedError, match="deadline passed at"):
            await backend.retry_job(late.id)
        assert await _snapshot(backend, late.id) == before
        assert await backend.retry_job(timely.id)
        assert (await fetch(backend, timely.id)).status is JobStatus.PENDING

    @covers("retry_job")
    async def test_retry_job_of_an_unknown_job_is_false(self, backend: Backend) -> None:
        assert not await backend.retry_job(uuid4())

    @pytest.mark.parametrize("how", ["enqueue", "enqueue_batch", "enqueue_batch_fast"])
    @covers("retry_job", "enqueue", "enqueue_batch", "enqueue_batch_fast", "write_cancel_request")
    async def test_retry_job_refuses_a_singleton_whose_identity_is_held(
        self, backend: Backend, how: str
    ) -> None:
        # It made a second active job of the identity: a singleton is unique per
        # (actor, identity_key) among active jobs, and only its row can say it is one.
        single = make_args(singleton=True, identity_key="only", delay=timedelta(hours=1))
        if how == "enqueue":
            first = await backend.enqueue(single)
        elif how == "enqueue_batch":
            [first] = await backend.enqueue_batch([single])
        else:
            assert await backend.enqueue_batch_fast([single]) == 1
            first = await fetch(backend, single.id)
        assert await backend.write_cancel_request(first.id, None)
        holder = await backend.enqueue(
            make_args(singleton=True, identity_key="only", delay=timedelta(hours=1))
        )
        before = await _snapshot(backend, first.id)
        with pytest.raises(SingletonCollisionError, match=f"active job {holder.id} holds"):
            await backend.retry_job(first.id)
        assert await _snapshot(backend, first.id) == before
        # Once the holder has ended, it comes back; a plain job of an identity (not a
        # singleton) comes back whatever holds it.
        assert await backend.write_cancel_request(holder.id, None)
        assert await backend.retry_job(first.id)
        plain = await backend.enqueue(make_args(identity_key="only", delay=timedelta(hours=1)))
        assert await backend.write_cancel_request(plain.id, None)
        assert await backend.retry_job(plain.id)
