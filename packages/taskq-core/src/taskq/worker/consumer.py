"""Consumer loops: execute locally queued jobs and write their outcome.

Each job runs in its own task so the heartbeat can cancel it alone when the
worker loses the job's lock. Every outcome write is fenced by the job's
attempt number: a worker that lost the job (reclaimed, maybe re-dispatched
to this same worker) cannot overwrite the newer attempt.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import traceback
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal, TypeVar

import structlog
from pydantic_core import to_jsonable_python

from taskq._di import ResolvedActorScope, build_actor_scope, own_context, passthrough_scope
from taskq.actor import CONTEXT_PARAMETER, Actor
from taskq.backend import (
    CancelPhase,
    JobStatus,
    SupportsEnqueuePrecheck,
    SupportsLateOutcomes,
    SupportsLeaseRenewal,
    SupportsStatementCancellations,
    SupportsTransactions,
)
from taskq.backend.storable import stored_error
from taskq.batch_outcomes import apply_batch_terminal_outcome
from taskq.context import Context
from taskq.errors import (
    EnqueueError,
    LeaseLost,
    OutcomeNotRecorded,
    WorkerOwnershipMismatch,
)
from taskq.logs import bind_job_fields
from taskq.models import (
    DEADLINE_EXCEEDED,
    FREE_OUTCOMES,
    ErrorInfo,
    JobRow,
    SuccessWrite,
    from_valid_values,
)
from taskq.signals import RetryAfter, Snooze, signal_of_group
from taskq.worker._state import ActiveJob, WorkerState
from taskq.worker._transient import transient_errors

_log = structlog.get_logger("taskq.worker")

T = TypeVar("T")

# A job whose actor this worker does not know goes back for another worker,
# without using an attempt (rolling deploys: the code may not be everywhere yet).
UNKNOWN_ACTOR_DELAY = timedelta(seconds=5)


async def consumer_loop(state: WorkerState) -> None:
    """Take jobs from the local queue until shutdown's end-of-queue marker (None)."""
    loop = asyncio.get_running_loop()
    while (row := await state.queue.get()) is not None:
        active = state.active.get(row.id)
        if active is None or active.lost or active.row.attempt != row.attempt:
            continue  # lost before it started: the lock is gone, so is the job
        taken = active.taken_at = loop.time()
        # In a context its DI scope can name: its TRANSIENT teardowns run in it.
        task = asyncio.create_task(
            execute(state, row), name=f"taskq-job-{row.actor}-{row.id}", context=own_context()
        )
        active.task = task
        active.ran = asyncio.get_running_loop().create_future()
        active.release = functools.partial(_released, state, active)
        # One callback (each is a loop turn of its own, on every job).
        task.add_done_callback(functools.partial(_finished, state, active))
        state.job_tasks.add(task)
        # Not `await task`: a cancelled job task must not cancel its consumer, and
        # an abandoned one that ignores cancellation must not hold the slot forever.
        # Nor the outcome write: the job task finishes it (and frees the slot) while
        # this consumer runs the next job.
        await active.ran
        state.prefetch.held(loop.time() - taken)


def _finished(state: WorkerState, active: ActiveJob, task: asyncio.Task[None]) -> None:
    state.job_tasks.discard(task)
    active.finish()


def _released(state: WorkerState, active: ActiveJob) -> None:
    state.processed += 1
    state.release(active.row.id, active)


async def write_retrying(
    state: WorkerState,
    what: str,
    call: Callable[[], Awaitable[T]],
    *,
    give_up: bool = False,
    refused_for: ActiveJob | None = None,
) -> T | None:
    """Run an outcome write, retrying transient failures until it lands.

    The job keeps its slot meanwhile, so the heartbeat keeps its lease: the
    heartbeat renews every job locked by this worker, so a job given up on
    here would stay ``running`` and locked, renewed for as long as the worker
    lives, and no sweep would ever reclaim it. If the lease lapsed during an
    outage and the job was reclaimed, the write's ownership guard makes it a
    no-op. Only the task's cancellation (shutdown, lost lock) ends the retries.

    ``give_up``: stop after one lock lease and return None. For writes the job
    can do without (progress), and for hand-backs the shutdown makes itself:
    the worker then exits, its heartbeat stops and the reclaim sweep takes the job.

    ``refused_for``: the job whose write this is, when the write carries the job's
    own value (a result). Raises :class:`OutcomeNotRecorded` (for the caller to try
    in the write's place, see :func:`_failed_instead`) once the write has
    failed for a lock lease, the last time with one of the backend's
    ``statement_cancellations`` (:class:`SupportsStatementCancellations`), while the
    database renewed this very job's lease between its last two tries: the database
    answers and the row is free (a renewal skips a row another transaction holds),
    so the write fails on what it carries, as a result too large for the
    ``statement_timeout`` does at every try. Retried forever, the job stayed
    ``running`` and held its slot for the worker's life.
    """
    transient = transient_errors()
    loop = asyncio.get_running_loop()
    lease = state.settings.lock_lease.total_seconds()
    deadline = loop.time() + lease
    pause = 0.05
    first_sent: float | None = None
    sent = previous_sent = loop.time()
    while True:
        previous_sent, sent = sent, loop.time()
        try:
            return await call()
        except transient as exc:
            now = loop.time()
            first_sent = sent if first_sent is None else first_sent
            if give_up and now + pause > deadline:
                _log.error("taskq.outcome-write-abandoned", write=what, error=repr(exc))
                return None
            if (
                refused_for is not None
                and now - first_sent >= lease
                and refused_for.lease_from > previous_sent
                and _cancelled_by_database(state, exc)
            ):
                raise _refused(what, now - first_sent, exc) from exc
            _log.warning("taskq.outcome-write-retry", write=what, error=repr(exc))
            await asyncio.sleep(pause)
            pause = min(pause * 2, 2.0)


def _cancelled_by_database(state: WorkerState, exc: BaseException) -> bool:
    backend = state.backend
    # Only a renewal that names the jobs it renewed (SupportsLeaseRenewal) says this one
    # was free: a count (heartbeat_jobs) is read as every held job renewed, one that
    # another transaction holds (skipped) too, whose write is then not refused.
    return (
        isinstance(backend, SupportsStatementCancellations)
        and isinstance(backend, SupportsLeaseRenewal)
        and isinstance(exc, backend.statement_cancellations)
    )


def _refused(what: str, seconds: float, exc: BaseException) -> OutcomeNotRecorded:
    return OutcomeNotRecorded(
        f"the {what} write was cancelled at every try for {seconds:.0f}s ({exc!r}) while "
        f"the database renewed the job's lease and took this failure in its place: the "
        f"write fails on what it carries (a result, or sub-jobs, too large to write "
        f"within the statement_timeout, say); return less, or allow the write more time"
    )


def _ownership_lost(row: JobRow, write: str) -> None:
    _log.warning(
        "taskq.ownership-lost",
        job_id=str(row.id),
        attempt=row.attempt,
        write=write,
        error=str(WorkerOwnershipMismatch()),
    )


async def _late(
    state: WorkerState, row: JobRow, outcome: str, error: ErrorInfo | None = None
) -> None:
    """The attempt's outcome, refused: it is not this worker's any more (reclaimed while
    it ran, the worker frozen or cut off). Kept in the job's history as a
    ``late_outcome`` event where the backend can, as the history otherwise said only
    that the attempt crashed."""
    _ownership_lost(row, outcome)
    backend = state.backend
    if isinstance(backend, SupportsLateOutcomes):
        await write_retrying(
            state,
            "late_outcome",
            lambda: backend.record_late_outcome(
                row.id, row.attempt, state.worker_id, outcome, error
            ),
            give_up=True,
        )


def _settle_unstarted(state: WorkerState, active: ActiveJob | None) -> None:
    """The job will not start: only its outcome write is left, which nothing that stops
    running code (the lease fence, a forced cancel, a stop) may cut short."""
    if active is not None:
        state.settle(active)


def _lease_lost(state: WorkerState) -> LeaseLost:
    settings = state.settings
    margin = settings.lock_lease - settings.heartbeat_interval
    return LeaseLost(
        f"the worker had no confirmed renewal of this job's lease for "
        f"{margin.total_seconds():g}s (the database unreachable or too slow) and stopped "
        f"it before the lease could lapse, so that no other worker would run it at the "
        f"same time"
    )


def _jsonable(result: Any) -> Any:
    return to_jsonable_python(result)


async def execute(state: WorkerState, row: JobRow) -> None:
    """Run one attempt of ``row`` and record its outcome, its identity on every log record.

    Runs as the job's own task: its log bindings end with it, with nothing to undo.
    """
    bind_job_fields(row)
    try:
        await _execute(state, row)
    except Exception as exc:  # noqa: BLE001 - the last resort, see below
        # The outcome could not be recorded (a value the database refuses, a backoff
        # that raised). Left running, the job would be handed back unstarted and run
        # again forever, never spending an attempt: it fails instead, saying why.
        _log.error("taskq.outcome-unrecordable", error=repr(exc))
        error = OutcomeNotRecorded(f"the job's outcome could not be recorded: {exc!r}")
        error.__cause__ = exc
        await _fail(state, row, error, retry_delay=None)


async def _execute(state: WorkerState, row: JobRow) -> None:
    backend, wid = state.backend, state.worker_id
    active = state.active.get(row.id)
    actor = state.actors.get(row.actor)
    if actor is None:
        _settle_unstarted(state, active)
        _log.warning("taskq.unknown-actor", known=sorted(state.actors))
        state.met_unknown_actor = True
        # Handed back unrun, its attempt given back, recorded as what it was (it read
        # as a rate-limit denial).
        verdict = await write_retrying(
            state,
            "unknown_actor",
            lambda: backend.mark_snoozed(
                row.id, wid, UNKNOWN_ACTOR_DELAY, outcome="unknown_actor", attempt=row.attempt
            ),
        )
        await _ended_instead(state, row, verdict)  # its deadline passed, or a cancel came
        return
    try:
        payload = actor.validate_payload(row.payload)
    except Exception as exc:  # noqa: BLE001 - a validator's own error (a TypeError) too
        # The same payload fails every time: no retry. A validator that raised other
        # than a validation error (a model changed since the enqueue) is said as such,
        # where it read as an outcome that could not be recorded.
        _log.info("taskq.job-payload-invalid", error=repr(exc), decision="fail")
        _settle_unstarted(state, active)
        await _fail(state, row, exc, retry_delay=None)
        return

    async def record_progress(seq: int, progress: dict[str, Any]) -> None:
        stored = await write_retrying(
            state,
            "progress",
            lambda: backend.record_progress(row.id, wid, seq, progress, attempt=row.attempt),
            give_up=True,
        )
        if stored is False:
            _ownership_lost(row, "progress")

    ctx = Context(row, _log, state.client, record_progress)
    if active is not None:
        active.ctx = ctx
        if active.cancel_requested or active.interrupted:
            ctx.cancel_event.set()

    passthrough: dict[str, Any] = {actor.payload_parameter: payload}
    if actor.wants_context:
        passthrough[CONTEXT_PARAMETER] = ctx
    if active is not None and active.cancel_requested:
        # Cancelled while it waited for a slot here (prefetched): never started.
        _settle_unstarted(state, active)
        await _cancelled(state, row, ctx)
        return
    waited = 0.0 if active is None else asyncio.get_running_loop().time() - active.held_at
    limit = _attempt_limit(row, waited)
    if limit is not None and limit.seconds <= 0:
        # Dispatched past its deadline (before the sweep failed it): never started.
        _settle_unstarted(state, active)
        await _fail_with(state, row, DEADLINE_EXCEEDED, retry_delay=None, ctx=ctx)
        return
    if active is not None and limit is not None:
        active.limit_at = asyncio.get_running_loop().time() + limit.seconds
        active.limit_error = limit.error()
    _log.debug("taskq.job-started")
    try:
        try:
            result = await _invoke(state, actor, passthrough, limit, active)
        finally:
            if active is not None:
                state.settle(active)
    except asyncio.CancelledError as exc:
        if await _stopped(state, row, ctx, active):
            return
        if active is not None and active.fenced and state.active.get(row.id) is active:
            await _fail(
                state,
                row,
                _lease_lost(state),
                actor.retry.delay(await _used_attempts(state, row)),
                ctx,
                fenced=True,
            )
            return
        task = asyncio.current_task()
        if task is None or task.cancelling():
            raise
        # Not a cancel of this attempt: the actor's own (a future it awaited was
        # cancelled). Left to end the task, it left no outcome, and the job ran again
        # and again without spending an attempt.
        await _raised(state, row, ctx, actor, exc)
        return
    except (Snooze, RetryAfter) as signal:
        await _signalled(state, row, ctx, active, signal)
        return
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - every actor error becomes an outcome
        # A BaseException too (``sys.exit``, a library's own as a test runner's failure
        # is): it ended the job's task with no outcome, and the job ran again forever,
        # or (a sync actor's) the worker.
        if (grouped := signal_of_group(exc)) is not None:  # a TaskGroup's children's
            await _signalled(state, row, ctx, active, grouped)
            return
        if ctx.cancel_event.requested() and (
            ctx.cancel_event.seen or _task_cancelled() or not _users_cancel(active)
        ):
            if not ctx.cancel_event.seen and not _task_cancelled():
                # A stop's: handed back, its attempt not spent (ADR 0004; the error may
                # be the stop's own, a SIGTERM that reached a child process), but said.
                _log.warning("taskq.job-raised-during-stop", error=repr(exc))
            if await _stopped(state, row, ctx, active):
                return
        # A user's cancel it never looked at: its own failure, recorded failed with its
        # error (the job still ends cancelled), where the error was dropped.
        await _raised(state, row, ctx, actor, exc)
        return

    if ctx.cancel_event.requested() and await _stopped(state, row, ctx, active, returned=True):
        return
    if inspect.iscoroutine(result):
        # An async function behind a sync decorator (functools.wraps keeps no
        # async-ness): the body never ran. Said plainly, not as an unstorable result.
        result.close()
        error = TypeError(
            f"actor {actor.name!r} returned a coroutine: its function is sync but wraps an "
            f"async one; make the wrapper `async def` and await the wrapped call"
        )
        await _fail(state, row, error, None, ctx)
        return
    try:
        stored = _jsonable(result)
    except Exception as exc:  # noqa: BLE001 - an unstorable result is the actor's bug
        await _fail(state, row, TypeError(f"result is not JSON-serialisable: {exc}"), None, ctx)
        return
    while True:
        try:
            ok = await _succeed(state, row, ctx, stored)
        except _SubjobsRefused as refused:
            # Nothing was written: the attempt fails on it and is retried as any failure
            # is, where it failed the job for good as an outcome that could not be
            # recorded. The limit, or a singleton's identity, may well be free by then.
            await _raised(state, row, ctx, actor, refused.error)
            return
        except OutcomeNotRecorded as refused:
            # The failure write touches the same tables and carries little: landed, the
            # success write failed on what it carries; held up too (a lock on the
            # history tables, a database too slow), the success write is tried again.
            if await _failed_instead(state, row, refused, ctx):
                return
            continue
        break
    if ok is False and not await _our_write_landed(state, row, JobStatus.SUCCEEDED):
        await _late(state, row, "succeeded")
        return
    _log.debug("taskq.job-succeeded")
    await apply_batch_terminal_outcome(state.backend, row, "succeeded")


async def _raised(
    state: WorkerState, row: JobRow, ctx: Context, actor: Actor[..., Any], exc: BaseException
) -> None:
    """Write the outcome of an attempt whose actor raised: a retry after its backoff, or
    failed (attempts spent, or past the job's deadline)."""
    if isinstance(exc, _DeadlinePassed):
        _log.info("taskq.job-past-deadline")
        await _fail_with(state, row, DEADLINE_EXCEEDED, retry_delay=None, ctx=ctx)
        return
    # The backend fails a job whose attempts are spent; this only names it in the log.
    final = "fail" if row.attempt >= row.max_attempts else "retry"
    _log.info("taskq.job-raised", error=repr(exc), decision=final)
    delay = actor.retry.delay(await _used_attempts(state, row))
    await _fail(state, row, exc, retry_delay=delay, ctx=ctx)


async def _used_attempts(state: WorkerState, row: JobRow) -> int:
    """Which attempt of the job this is, counting only those that used one: the number
    its backoff takes. A snooze or a hand-back runs the job again without using one,
    yet its ``attempt`` number grows (ten snoozes put a first failure off by 17
    minutes, not a second). Read from its history, so only from a second attempt on."""
    if row.attempt <= 1:
        return row.attempt
    try:
        attempts = await state.backend.get_attempts(row.id)
    except transient_errors():
        return row.attempt  # a longer wait than due, rather than none
    free = sum(1 for a in attempts if a.attempt < row.attempt and a.outcome in FREE_OUTCOMES)
    return max(row.attempt - free, 1)


async def _signalled(
    state: WorkerState,
    row: JobRow,
    ctx: Context,
    active: ActiveJob | None,
    signal: Snooze | RetryAfter,
) -> None:
    # Told to stop first: a cancelled job is not rescheduled (it would come back
    # with its cancel flag set), an interrupted one is handed back as such.
    if ctx.cancel_event.requested() and await _stopped(state, row, ctx, active):
        return
    await _reschedule(state, row, ctx, signal)


async def _reschedule(
    state: WorkerState, row: JobRow, ctx: Context, signal: Snooze | RetryAfter
) -> None:
    """Write what the actor asked for: a snooze, or a retry after a delay."""
    backend = state.backend
    name, outcome, mark = (
        ("snooze", "snoozed", backend.mark_snoozed)
        if isinstance(signal, Snooze)
        else ("retry_after", "retry_after", backend.mark_retry_after)
    )
    verdict = await write_retrying(
        state,
        name,
        lambda: mark(
            row.id,
            state.worker_id,
            signal.delay,
            progress_seq=ctx.progress_seq,
            progress_state=ctx.progress_state,
            attempt=row.attempt,
        ),
    )
    if verdict == "noop":
        # Reclaimed while it ran, the reclaim's ``crashed`` is all the history said of
        # an attempt that in fact ended on the actor's request.
        await late_unless_landed(state, row, outcome)
    else:
        await _ended_instead(state, row, verdict)


async def late_unless_landed(
    state: WorkerState,
    row: JobRow,
    outcome: str,
    error: ErrorInfo | None = None,
    *,
    also_own: tuple[str, ...] = (),
) -> bool:
    """After a write of this attempt's ``outcome`` that reported the job no longer this
    worker's: a late outcome, unless an earlier try of the same write landed (its reply
    lost) and the attempt's row already says ``outcome`` (or one of ``also_own``, the
    ends another of this worker's writers gives the attempt). True in that case: the
    end is the worker's own."""
    if await _attempt_recorded_as(state, row, outcome, *also_own):
        return True
    await _late(state, row, outcome, error)
    return False


async def _attempt_recorded_as(state: WorkerState, row: JobRow, *outcomes: str) -> bool:
    """Whether this attempt's row has one of ``outcomes``: a write that reported a no-op
    had in fact landed (the job may run again since, on a later attempt)."""
    attempts = await write_retrying(
        state, "read", lambda: state.backend.get_attempts(row.id), give_up=True
    )
    return any(a.attempt == row.attempt and a.outcome in outcomes for a in attempts or ())


async def _ended_instead(state: WorkerState, row: JobRow, verdict: str | None) -> None:
    """The batch hook for a reschedule (a snooze, a retry, a hand-back, an unknown
    actor's) whose write ended the job instead: ``cancelled`` when a cancel was requested
    meanwhile, ``failed`` when its deadline or its attempts were reached (a failed child,
    counted as any other). A job rescheduled, or not ours, has not ended."""
    if verdict == "cancelled":
        await apply_batch_terminal_outcome(state.backend, row, "cancelled")
    elif verdict is not None and verdict.startswith("failed"):
        await apply_batch_terminal_outcome(state.backend, row, "failed")


async def _our_write_landed(state: WorkerState, row: JobRow, status: JobStatus) -> bool:
    """Whether a terminal write (to ``status``) that reported a no-op had in fact landed:
    an earlier try of it committed and lost its reply, and the retry found the row
    finished. Only this attempt's holder can make the job succeed on this attempt (a
    reclaimed job runs again on the next one); a reclaim ends a cancelled job's attempt
    ``crashed``, where the holder's own write ends it ``cancelled``."""
    current = await write_retrying(state, "read", lambda: state.backend.get(row.id), give_up=True)
    if current is None or current.status is not status or current.attempt != row.attempt:
        return False
    if status is JobStatus.SUCCEEDED:
        return True
    return await _attempt_recorded_as(state, row, status.value)


class _NotOwner(Exception):
    """Rolls back a success transaction whose guarded write matched no row."""


class _SubjobsRefused(Exception):
    """A sub-job was refused (an actor past ``max_pending``, a singleton's identity held)
    before or inside the success's transaction, so neither was written."""

    def __init__(self, error: EnqueueError) -> None:
        super().__init__(str(error))
        self.error = error


async def _succeed(state: WorkerState, row: JobRow, ctx: Context, result: Any) -> bool | None:
    """Write the success and, atomically with it, the sub-jobs the actor enqueued.

    A backend with real transactions does both in one; one that simulates
    them (``supports_transactional_simulation``: in-memory) flushes the buffered
    sub-jobs only after the success write took. Either way a failed or lost job
    enqueues nothing.
    """
    backend, wid, ttl = state.backend, state.worker_id, state.settings.fallback_result_ttl
    job = state.active.get(row.id)
    if ctx.subjobs:
        # A worker enqueueing is a producer too: past an actor's max_pending its sub-jobs
        # are refused as a client's enqueue would be (they went in unchecked, unbounded),
        # before anything is written.
        subjobs = ctx.subjobs
        try:
            await write_retrying(state, "capacity", lambda: state.client.check_capacity(subjobs))
            if backend.supports_transactional_simulation and isinstance(
                backend, SupportsEnqueuePrecheck
            ):
                # What a real transaction's rollback gives: a refusal (a singleton's
                # identity held) before the success is written, not after.
                await write_retrying(
                    state, "subjobs", lambda: backend.precheck_enqueue(subjobs, finishing=row.id)
                )
        except EnqueueError as exc:
            raise _SubjobsRefused(exc) from exc
    if (
        ctx.subjobs
        and not backend.supports_transactional_simulation
        and isinstance(backend, SupportsTransactions)  # checked at open: see missing_members
    ):

        async def in_transaction() -> bool:
            try:
                async with backend.transaction() as conn:
                    if not await backend.mark_succeeded_with_conn(
                        conn,
                        row.id,
                        wid,
                        result,
                        ctx.progress_seq,
                        ctx.progress_state,
                        ttl,
                        attempt=row.attempt,
                    ):
                        raise _NotOwner
                    for args in ctx.subjobs:
                        await backend.enqueue_with_conn(conn, args)
            except _NotOwner:
                return False
            return True

        try:
            return await write_retrying(state, "succeeded", in_transaction, refused_for=job)
        except EnqueueError as exc:  # a sub-job refused: a singleton's active identity
            raise _SubjobsRefused(exc) from exc
    completer = state.completer
    if completer is not None and not ctx.subjobs:
        # Built unvalidated, as every value is the worker's own (the result is jsonable).
        write = from_valid_values(
            SuccessWrite,
            {
                "job_id": row.id,
                "attempt": row.attempt,
                "result": result,
                "progress_seq": ctx.progress_seq,
                "progress_state": ctx.progress_state,
            },
        )
        return await write_retrying(
            state, "succeeded", lambda: completer.succeed(write), refused_for=job
        )
    ok = await write_retrying(
        state,
        "succeeded",
        lambda: backend.mark_succeeded(
            row.id, wid, result, ctx.progress_seq, ctx.progress_state, ttl, attempt=row.attempt
        ),
        refused_for=job,
    )
    if ok and ctx.subjobs:
        await write_retrying(state, "subjobs", lambda: backend.enqueue_batch(ctx.subjobs))
    return ok


class _DeadlinePassed(Exception):
    """The attempt ran into the job's ``schedule_to_close`` deadline."""


@dataclass(frozen=True)
class _Limit:
    """How long an attempt may run: its ``timeout``, or what is left of the job's
    deadline when that comes first."""

    seconds: float
    deadline: bool

    def expired(self) -> Exception:
        if self.deadline:
            return _DeadlinePassed()
        return TimeoutError(f"attempt exceeded its timeout of {self.seconds}s")

    def error(self) -> ErrorInfo:
        """The error an attempt past this limit is failed with."""
        if self.deadline:
            return DEADLINE_EXCEEDED
        return ErrorInfo.from_exception(self.expired())


def _attempt_limit(row: JobRow, waited: float) -> _Limit | None:
    """``row``'s limit, ``waited`` seconds after its dispatch (queued here for a slot)."""
    timeout = row.timeout.total_seconds() if row.timeout is not None else None
    if row.deadline_at is None or row.started_at is None:
        return None if timeout is None else _Limit(timeout, deadline=False)
    # Both times are the database's: the budget is a duration, run on this host's clock.
    left = (row.deadline_at - row.started_at).total_seconds() - waited
    if timeout is not None and timeout < left:
        return _Limit(timeout, deadline=False)
    return _Limit(left, deadline=True)


async def _invoke(
    state: WorkerState,
    actor: Actor[..., Any],
    passthrough: dict[str, Any],
    limit: _Limit | None,
    active: ActiveJob | None,
) -> Any:
    containers = state.containers()
    plain = passthrough_scope(actor.fn, state.providers, containers, passthrough)
    if plain is not None:
        return await _call(plain, state.executor, limit)
    opening = build_actor_scope(actor.fn, state.providers, containers, passthrough)
    if not actor.is_async:  # its dependencies are resolved in its thread, within the limit
        async with opening as scope:
            result = await _call_in_thread(scope, state.executor, limit)
            _returned(active)
            return result
    async with AsyncExitStack() as teardown:
        # The limit covers resolving the dependencies too (a provider waiting on a pool
        # held the slot past it); their teardown, shielded from cancellation, comes after.
        result = await _within(limit, _resolved_call(teardown, opening, state.executor))
        _returned(active)
        return result


def _returned(active: ActiveJob | None) -> None:
    """The actor returned; its dependencies' teardown (a transaction's commit) ends its
    work. Cancelled during it (a stop, a forced cancel, its limit), a finished job was
    handed back and ran again, or read as cancelled or past its limit, its result lost."""
    if active is not None:
        active.returned = True


async def _resolved_call(
    teardown: AsyncExitStack,
    opening: AbstractAsyncContextManager[ResolvedActorScope],
    executor: Executor,
) -> Any:
    scope = await teardown.enter_async_context(opening)
    return await scope.invoke(executor)


async def _call(scope: ResolvedActorScope, executor: Executor, limit: _Limit | None) -> Any:
    if not scope.is_async:
        return await _call_in_thread(scope, executor, limit)
    if limit is None:  # the usual job: no frame more than the call
        return await scope.invoke(executor)
    return await _within(limit, scope.invoke(executor))


async def _within(limit: _Limit | None, call: Awaitable[T]) -> T:
    """``call``, failed with ``limit.expired()`` past the attempt's limit."""
    if limit is None:
        return await call
    deadline = asyncio.timeout(limit.seconds)
    try:
        async with deadline:
            result = await call
    except TimeoutError:
        if deadline.expired():
            raise limit.expired() from None
        raise
    if deadline.expired():
        # The actor caught the cancellation its limit sent and returned anyway: past its
        # limit the attempt has failed, as a sync actor's does.
        raise limit.expired()
    return result


async def _call_in_thread(
    scope: ResolvedActorScope, executor: Executor, limit: _Limit | None
) -> Any:
    """A sync actor. Nothing can stop its thread: past its limit the attempt has failed,
    and told to stop (a cancel, a shutdown) it is cancelled, but either outcome waits
    for the thread to return, so that no retry (and no other job in its slot) runs
    alongside it, and no job reads "cancelled" while its code runs on. A thread that
    runs a cleanup grace past the limit is the cancel controller's to fail, as a task
    that ignores its cancellation is, or to abandon past a cancel's cleanup grace; the
    next job in its slot gets a thread of its own (``SyncActorPool``)."""
    call = scope.start_in_thread(executor)
    try:
        done, _ = await asyncio.wait({call}, timeout=None if limit is None else limit.seconds)
        if call in done:
            return call.result()
        assert limit is not None  # no limit: only the thread's return ends the wait
        expired = limit.expired()
        # The thread closes its values itself, told of the limit (a transaction rolls
        # back), unless it closed them clean as the limit ran out: then it finished.
        finished = not scope.abort_thread(expired)
        if not finished:
            _log.warning("taskq.sync-actor-past-limit", limit_seconds=limit.seconds)
        await asyncio.wait({call})
    except asyncio.CancelledError as exc:
        if scope.abort_thread(exc):
            await _thread_returned(call)
            raise
        # It had returned, and its values were closing clean (a transaction committing),
        # when the cancel came: its work is done, and the outcome is what it returned.
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()
        await _thread_returned(call)
        return call.result()
    if finished:
        return call.result()
    call.exception()  # retrieved: the limit is the outcome, whatever the thread did
    raise expired


async def _thread_returned(call: asyncio.Future[Any]) -> None:
    """Wait for a sync actor's thread to return, through further cancellations (each
    cancels the wait, not the thread); what it returned or raised is dropped."""
    while not call.done():
        try:
            await asyncio.wait({call})
        except asyncio.CancelledError:
            continue
    if not call.cancelled():
        call.exception()


async def _fail(
    state: WorkerState,
    row: JobRow,
    exc: BaseException,
    retry_delay: timedelta | None,
    ctx: Context | None = None,
    *,
    fenced: bool = False,
) -> None:
    info = ErrorInfo.from_exception(exc, traceback="".join(traceback.format_exception(exc)) or None)
    await _fail_with(state, row, info, retry_delay, ctx, fenced=fenced)


async def _failed_instead(
    state: WorkerState, row: JobRow, refused: OutcomeNotRecorded, ctx: Context
) -> bool:
    """Fail the attempt with ``refused``, not retried, in one try: False when that write
    failed transiently as well."""
    info = ErrorInfo.from_exception(
        refused, traceback="".join(traceback.format_exception(refused)) or None
    )
    try:
        after = await state.backend.mark_failed_or_retry(
            row.id,
            state.worker_id,
            info,
            None,
            ctx.progress_seq,
            ctx.progress_state,
            attempt=row.attempt,
        )
    except transient_errors() as exc:
        # Said at info: the success write's retries go on, each said as a warning.
        _log.info("taskq.outcome-write-refusal-withdrawn", write="failed", error=repr(exc))
        return False
    _log.error("taskq.outcome-write-refused", write="succeeded", error=repr(refused.__cause__))
    await _failure_written(state, row, info, after, fenced=False)
    return True


async def _fail_with(
    state: WorkerState,
    row: JobRow,
    info: ErrorInfo,
    retry_delay: timedelta | None,
    ctx: Context | None = None,
    *,
    fenced: bool = False,
) -> None:
    after = await write_retrying(
        state,
        "failed_or_retry",
        lambda: state.backend.mark_failed_or_retry(
            row.id,
            state.worker_id,
            info,
            retry_delay,
            ctx.progress_seq if ctx else 0,
            ctx.progress_state if ctx else None,
            attempt=row.attempt,
        ),
    )
    await _failure_written(state, row, info, after, fenced=fenced)


async def _failure_written(
    state: WorkerState, row: JobRow, info: ErrorInfo, after: JobRow | None, *, fenced: bool
) -> None:
    """What follows a failure write that returned ``after``: a late outcome when the job
    was no longer this attempt's, else the batch hook of the status it ended in."""
    # A no-op returns the row as someone else left it: not our attempt's error.
    # Compared as stored: a NUL in the message made the worker's own write look foreign.
    if after is not None and not (
        after.attempt == row.attempt and after.error == stored_error(info)
    ):
        if await _attempt_recorded_as(state, row, "failed"):
            return  # an earlier try landed, its reply lost: the job has run again since
        if fenced:  # stopped before the reclaim, as the fence is for: not a lost lock
            _log.info("taskq.fenced-job-reclaimed", status=after.status.value)
        else:
            await _late(state, row, "failed", info)
    elif after is not None and after.status is JobStatus.FAILED:
        await apply_batch_terminal_outcome(state.backend, row, "failed")
    elif after is not None and after.status is JobStatus.CANCELLED:  # the retry met a cancel
        await apply_batch_terminal_outcome(state.backend, row, "cancelled")


async def _stopped(
    state: WorkerState,
    row: JobRow,
    ctx: Context,
    started: ActiveJob | None,
    *,
    returned: bool = False,
) -> bool:
    """Write the outcome of a job that was told to stop; False when it is not ours to write.

    A user's cancel ends it ``cancelled``; a shutdown hands it back for another
    attempt (``interrupted``, no attempt used). A lost lock, or an abandonment
    the cancel controller owns (the consumer skip guard; ``started`` is the job's
    entry when its attempt began, forgotten since if the abandonment was written),
    writes nothing. An actor that ``returned`` without seeing the request finished
    its work: False, its outcome is written as it returned.
    """
    if started is not None and started.cancel_phase >= CancelPhase.ABANDON_PENDING:
        if state.active.get(row.id) is not started:
            _log.info("taskq.abandoned-job-returned")  # at last: its outcome stands
        return True
    active = state.active.get(row.id)
    if active is None or active.lost or active.row.attempt != row.attempt:
        return False
    if returned and not ctx.cancel_event.seen and not _task_cancelled():
        # Handed back, a finished job ran again in full (a shutdown's stop request
        # reached every running job, watching or not); a user's cancel came too late.
        # A task cancel (FORCING, a forced user cancel, the fence) is a stop request
        # too: an actor that swallowed it and returned stopped early.
        return False
    if active.cancel_requested:
        await _cancelled(state, row, ctx)
        return True
    if active.interrupted:
        await hand_back(state, row, ctx)
        return True
    return False


def _users_cancel(active: ActiveJob | None) -> bool:
    """Whether the stop requested of this job is a user's cancel (not a shutdown's)."""
    return active is not None and active.cancel_requested


def _task_cancelled() -> bool:
    """Whether this job's task was cancelled, the cancel swallowed (an actor that caught
    ``CancelledError``): ``asyncio.timeout`` takes its own back, this one stays."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


async def hand_back(
    state: WorkerState,
    row: JobRow,
    ctx: Context | None,
    *,
    give_up: bool = False,
    outcome: Literal["interrupted", "unstarted"] = "interrupted",
) -> bool:
    """Return a job interrupted by shutdown for another attempt, its budget untouched
    (``give_up`` as for :func:`write_retrying`); ``unstarted`` for one whose code never
    began. False when the write was given up (the job is left to the reclaim). A
    hand-back that ended the job (its deadline passed, a cancel came meanwhile) applies
    that end to its batch."""
    verdict = await write_retrying(
        state,
        outcome,
        lambda: state.backend.mark_snoozed(
            row.id,
            state.worker_id,
            timedelta(0),
            progress_seq=ctx.progress_seq if ctx else 0,
            progress_state=ctx.progress_state if ctx else None,
            outcome=outcome,
            attempt=row.attempt,
        ),
        give_up=give_up,
    )
    active = state.active.get(row.id)
    own = active if active is not None and active.row.attempt == row.attempt else None
    if verdict == "noop":
        if outcome == "interrupted":
            if own is not None and own.ended:
                return True  # the cancel controller's write-off of it landed first
            # Reclaimed while it ran (the stop held up past its lease): the history
            # said only that the attempt crashed. Unless the attempt is ended as the
            # cancel controller ends one (its write-off or abandonment, landing while
            # this was under way): the reclaim's says "crashed".
            await late_unless_landed(state, row, outcome, also_own=("failed", "abandoned"))
        else:  # its code never began: it has no outcome of its own to tell
            _ownership_lost(row, outcome)
    else:
        if verdict is not None and own is not None:
            own.ended = True  # a write-off of it refused meanwhile is no late outcome
        await _ended_instead(state, row, verdict)
    return verdict is not None


async def _cancelled(state: WorkerState, row: JobRow, ctx: Context) -> None:
    ok = await write_retrying(
        state,
        "cancelled",
        lambda: state.backend.mark_cancelled(
            row.id, state.worker_id, ctx.progress_seq, ctx.progress_state, attempt=row.attempt
        ),
    )
    if ok is False and not await _our_write_landed(state, row, JobStatus.CANCELLED):
        await _late(state, row, "cancelled")
    elif ok is not None:
        await apply_batch_terminal_outcome(state.backend, row, "cancelled")
