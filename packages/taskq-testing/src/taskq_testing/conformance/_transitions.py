"""The state machine: every backend-driven transition, through the method that drives it.

``TRANSITION_DRIVERS`` names, for each edge of ``VALID_TRANSITIONS``, the
methods allowed to take it. Each (edge, driver) pair that is a ``Backend``
member gets a case here that starts a job in the source status, calls only
that driver, and checks the job lands in the target status with the event
recording exactly that edge.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from uuid import UUID, uuid4

import pytest

from taskq.backend import Backend, Connection, JobStatus
from taskq.backend.statemachine import TRANSITION_DRIVERS
from taskq.models import BatchRow, JobFilter
from taskq_testing.conformance._support import (
    ERROR,
    FAR,
    LONG_LEASE,
    SHORT_LEASE,
    AdvanceTime,
    TimeLimits,
    assert_history_consistent,
    cancel_reclaim_wait,
    covers,
    expire_short_leases,
    fetch,
    make_args,
    reach,
    require_conn,
    running_job,
    transitions,
)

_S = JobStatus
_ZERO = timedelta(0)


@dataclass(frozen=True)
class _Context:
    backend: Backend
    advance_time: AdvanceTime
    conn: Connection
    max_advance: timedelta


_Drive = Callable[[_Context], Awaitable[UUID]]
"""Start a job in the edge's source status, take the edge with the driver; the job id."""


def _solo() -> str:
    return f"solo-{uuid4().hex[:12]}"


async def _running(ctx: _Context, **overrides: Any) -> tuple[UUID, UUID]:
    worker = uuid4()
    job = await running_job(ctx.backend, worker_id=worker, **overrides)
    return job.id, worker


async def _dispatch(ctx: _Context) -> UUID:
    job = await reach(ctx.backend, _S.PENDING, queue=_solo())
    assert await ctx.backend.dispatch_batch(uuid4(), [job.queue], 1, LONG_LEASE)
    return job.id


async def _promote(ctx: _Context) -> UUID:
    job = await ctx.backend.enqueue(make_args(delay=SHORT_LEASE))
    assert job.status is _S.SCHEDULED
    await expire_short_leases(ctx.advance_time)
    assert await ctx.backend.scheduled_to_pending() == 1
    return job.id


async def _succeed(ctx: _Context) -> UUID:
    job, worker = await _running(ctx)
    assert await ctx.backend.mark_succeeded(job, worker, None)
    return job


async def _succeed_conn(ctx: _Context) -> UUID:
    require_conn(ctx.backend, ctx.conn)
    job, worker = await _running(ctx)
    assert await ctx.backend.mark_succeeded_with_conn(ctx.conn, job, worker, None)
    return job


async def _fail(ctx: _Context) -> UUID:
    job, worker = await _running(ctx)
    await ctx.backend.mark_failed_or_retry(job, worker, ERROR, None)
    return job


def _retry(delay: timedelta) -> _Drive:
    async def drive(ctx: _Context) -> UUID:
        job, worker = await _running(ctx)
        await ctx.backend.mark_failed_or_retry(job, worker, ERROR, delay)
        return job

    return drive


async def _snooze_past_deadline(ctx: _Context) -> UUID:
    job, worker = await _running(ctx, schedule_to_close=timedelta(minutes=30))
    assert await ctx.backend.mark_snoozed(job, worker, FAR) == "failed"
    return job


def _snooze(delay: timedelta) -> _Drive:
    async def drive(ctx: _Context) -> UUID:
        job, worker = await _running(ctx)
        assert await ctx.backend.mark_snoozed(job, worker, delay) == "scheduled"
        return job

    return drive


async def _retry_after_spent(ctx: _Context) -> UUID:
    job, worker = await _running(ctx, max_attempts=1)
    assert await ctx.backend.mark_retry_after(job, worker, FAR) == "failed:MaxAttemptsExceeded"
    return job


def _retry_after(delay: timedelta) -> _Drive:
    async def drive(ctx: _Context) -> UUID:
        job, worker = await _running(ctx)
        assert await ctx.backend.mark_retry_after(job, worker, delay) == "scheduled"
        return job

    return drive


async def _cancel(ctx: _Context) -> UUID:
    job, worker = await _running(ctx, cancel_phase=1)
    assert await ctx.backend.mark_cancelled(job, worker)
    return job


async def _abandon(ctx: _Context) -> UUID:
    job, worker = await _running(ctx, cancel_phase=2)
    assert await ctx.backend.mark_abandoned(job, worker)
    return job


async def _reclaim(ctx: _Context, *, cancel_phase: int, max_attempts: int) -> UUID:
    wait = cancel_reclaim_wait(ctx.backend, ctx.max_advance) if cancel_phase else None
    job, _ = await _running(
        ctx, cancel_phase=cancel_phase, max_attempts=max_attempts, lease=SHORT_LEASE
    )
    if wait is None:
        await expire_short_leases(ctx.advance_time)
    else:
        await ctx.advance_time(wait)
    assert await ctx.backend.reclaim_expired_locks(_ZERO, _ZERO) == 1
    return job


async def _reclaim_cancelled(ctx: _Context) -> UUID:
    return await _reclaim(ctx, cancel_phase=1, max_attempts=3)


async def _reclaim_crashed(ctx: _Context) -> UUID:
    return await _reclaim(ctx, cancel_phase=0, max_attempts=1)


async def _reclaim_repended(ctx: _Context) -> UUID:
    return await _reclaim(ctx, cancel_phase=0, max_attempts=3)


def _cancellers(source: JobStatus) -> dict[str, _Drive]:
    async def request(ctx: _Context) -> UUID:
        job = await reach(ctx.backend, source)
        assert await ctx.backend.write_cancel_request(job.id, "conformance")
        return job.id

    async def where(ctx: _Context) -> UUID:
        job = await reach(ctx.backend, source, queue=_solo())
        result = await ctx.backend.cancel_where(JobFilter(queue=job.queue), "conformance")
        assert result.cancelled == [job.id]
        return job.id

    async def abort(ctx: _Context) -> UUID:
        batch_id = uuid4()
        delay = FAR if source is _S.SCHEDULED else None
        [job] = await ctx.backend.enqueue_batch_atomic(
            [make_args(delay=delay)],
            batch_id=batch_id,
            queue="default",
            batch_row=BatchRow(id=batch_id, queue="default", expected_size=1, failure_threshold=1),
            finalizer_args=None,
        )
        assert job.status is source
        assert await ctx.backend.abort_batch(batch_id) == 1
        return job.id

    return {"write_cancel_request": request, "cancel_where": where, "abort_batch": abort}


def _finalizer_release(method: str) -> _Drive:
    async def drive(ctx: _Context) -> UUID:
        batch_id = uuid4()
        finalizer = make_args()
        await ctx.backend.enqueue_batch_atomic(
            [make_args()],
            batch_id=batch_id,
            queue="default",
            batch_row=BatchRow(id=batch_id, queue="default", expected_size=1),
            finalizer_args=finalizer,
        )
        assert (await fetch(ctx.backend, finalizer.id)).status is _S.SCHEDULED
        if method == "abort_batch":
            await ctx.backend.abort_batch(batch_id)
        else:
            await ctx.backend.complete_batch(batch_id)
        return finalizer.id

    return drive


def _deadline(source: JobStatus) -> _Drive:
    async def drive(ctx: _Context) -> UUID:
        delay = FAR if source is _S.SCHEDULED else None
        job = await ctx.backend.enqueue(make_args(delay=delay, schedule_to_close=SHORT_LEASE))
        assert job.status is source
        await expire_short_leases(ctx.advance_time)
        assert await ctx.backend.deadline_sweep() == 1
        return job.id

    return drive


DRIVES: dict[tuple[JobStatus, JobStatus, str], _Drive] = {
    (_S.PENDING, _S.RUNNING, "dispatch_batch"): _dispatch,
    (_S.SCHEDULED, _S.PENDING, "scheduled_to_pending"): _promote,
    (_S.SCHEDULED, _S.PENDING, "abort_batch"): _finalizer_release("abort_batch"),
    (_S.SCHEDULED, _S.PENDING, "complete_batch"): _finalizer_release("complete_batch"),
    (_S.RUNNING, _S.SUCCEEDED, "mark_succeeded"): _succeed,
    (_S.RUNNING, _S.SUCCEEDED, "mark_succeeded_with_conn"): _succeed_conn,
    (_S.RUNNING, _S.FAILED, "mark_failed_or_retry"): _fail,
    (_S.RUNNING, _S.FAILED, "mark_snoozed"): _snooze_past_deadline,
    (_S.RUNNING, _S.FAILED, "mark_retry_after"): _retry_after_spent,
    (_S.RUNNING, _S.SCHEDULED, "mark_failed_or_retry"): _retry(FAR),
    (_S.RUNNING, _S.SCHEDULED, "mark_snoozed"): _snooze(FAR),
    (_S.RUNNING, _S.SCHEDULED, "mark_retry_after"): _retry_after(FAR),
    (_S.RUNNING, _S.PENDING, "mark_failed_or_retry"): _retry(timedelta(0)),
    (_S.RUNNING, _S.PENDING, "mark_snoozed"): _snooze(timedelta(0)),
    (_S.RUNNING, _S.PENDING, "mark_retry_after"): _retry_after(timedelta(0)),
    (_S.RUNNING, _S.CANCELLED, "mark_cancelled"): _cancel,
    (_S.RUNNING, _S.CANCELLED, "reclaim_expired_locks"): _reclaim_cancelled,
    (_S.RUNNING, _S.ABANDONED, "mark_abandoned"): _abandon,
    (_S.RUNNING, _S.CRASHED, "reclaim_expired_locks"): _reclaim_crashed,
    (_S.RUNNING, _S.PENDING, "reclaim_expired_locks"): _reclaim_repended,
    **{(_S.PENDING, _S.CANCELLED, m): d for m, d in _cancellers(_S.PENDING).items()},
    **{(_S.SCHEDULED, _S.CANCELLED, m): d for m, d in _cancellers(_S.SCHEDULED).items()},
    (_S.PENDING, _S.FAILED, "deadline_sweep"): _deadline(_S.PENDING),
    (_S.SCHEDULED, _S.FAILED, "deadline_sweep"): _deadline(_S.SCHEDULED),
}
"""One case per (source, target, driver) of ``TRANSITION_DRIVERS`` whose driver is a
``Backend`` member (the worker's drain is not); a meta-test keeps the two in step."""

BACKEND_DRIVEN_EDGES = frozenset(
    (source, target, driver)
    for (source, target), drivers in TRANSITION_DRIVERS.items()
    for driver in drivers
    if hasattr(Backend, driver)
)
"""The (source, target, driver) triples the suite must drive."""


class TransitionTests(TimeLimits):
    """Each transition through its driver; the history every scenario leaves is valid."""

    @pytest.mark.parametrize("edge", sorted(DRIVES), ids=lambda e: f"{e[0]}-to-{e[1]}-by-{e[2]}")
    @covers(*sorted({driver for _, _, driver in DRIVES}))
    async def test_each_transition_is_taken_by_its_driver(
        self,
        backend: Backend,
        advance_time: AdvanceTime,
        transaction_conn: Connection,
        edge: tuple[JobStatus, JobStatus, str],
    ) -> None:
        source, target, _ = edge
        ctx = _Context(backend, advance_time, transaction_conn, self.max_advance)
        job_id = await DRIVES[edge](ctx)
        assert (await fetch(backend, job_id)).status is target
        assert transitions(await backend.get_events(job_id))[-1] == (source, target)
        await assert_history_consistent(backend, job_id)
