"""Shutdown orchestration: DRAINING -> CANCELLING -> FORCING -> ABANDONING.

Each phase is recorded before its work begins, so the health endpoint and
the consumers can see where the shutdown is.

* DRAINING — dispatch stops; jobs locked but not started go back at once, in one
  statement (and those of a dispatch whose reply was lost, when one was); running
  jobs get ``drain_grace_period`` to finish on their own.
* CANCELLING — each running job's ``cancel_event`` is set (cooperative stop)
  for ``cancellation_grace_period``. An actor that returns after seeing it is
  handed back; one that returns without having looked finished its work, and its
  outcome is written as it returned (ADR 0004).
* FORCING — the remaining tasks are cancelled (a job a user asked to cancel has
  phase 2 stored first, as the cancellation protocol does; those writes all at once,
  after the other tasks are cancelled); ``cleanup_grace_period`` to unwind. A job
  whose actor returned is not: it is only writing its outcome.
* ABANDONING — outcome writes still retrying (the database away), the cancel
  controller's write-offs past a limit among them, get what is left of
  ``termination_grace_period``; tasks that still run are then left behind: an
  interrupted job is handed back, a user-cancelled one marked ``abandoned``, all at
  once.

With the watchdog on, the three waits fit in ``termination_grace_period`` with room for
ABANDONING and the teardown (``WorkerSettings.stop_waits``), and each is cut to what is
left of it, so that jobs are handed back before the watchdog ends the process.

A job interrupted by a shutdown is not the user's cancellation: it is
handed back for another attempt (outcome ``interrupted``, retry budget
untouched), as River, GoodJob, Solid Queue and Procrastinate treat deploys.
Only a job a user asked to cancel ends ``cancelled`` or ``abandoned``. A
second signal skips the remaining waits of DRAINING and CANCELLING.
"""

from __future__ import annotations

import asyncio
import time
from enum import IntEnum
from typing import Final

import structlog

from taskq.backend import CancelPhase, SupportsUnstartedHandBack
from taskq.batch_outcomes import apply_batch_child_ends, apply_batch_terminal_outcome
from taskq.logs import job_fields
from taskq.models import BatchChildEnd, JobId, JobRow, JobStatus
from taskq.worker._state import ActiveJob, WorkerState
from taskq.worker._transient import transient_errors
from taskq.worker.consumer import hand_back, late_unless_landed, write_retrying
from taskq.worker.producer import hand_back_unheard

__all__ = ["ShutdownPhase", "orchestrate_shutdown"]

_log = structlog.get_logger("taskq.worker")


class ShutdownPhase(IntEnum):
    """Where a worker's shutdown is; only ever moves forward."""

    NONE = 0
    DRAINING = 1
    CANCELLING = 2
    FORCING = 3
    ABANDONING = 4


def _enter(state: WorkerState, phase: ShutdownPhase) -> None:
    state.shutdown_phase = phase
    _log.info("taskq.shutdown-phase", phase=phase.name, running=_running_count(state))


def _running_count(state: WorkerState) -> int:
    return sum(1 for a in state.active.values() if a.holds_slot)


async def _wait_running(state: WorkerState, seconds: float, escalate: asyncio.Event | None) -> None:
    """Until every running job's consumer may move on, ``seconds`` pass, or ``escalate``."""
    waiting = [a.slot_freed() for a in state.active.values() if a.holds_slot]
    if not waiting:
        return
    stopper = asyncio.ensure_future(escalate.wait()) if escalate is not None else None
    everyone = asyncio.ensure_future(asyncio.wait(waiting))
    try:
        await asyncio.wait(
            [everyone, *([stopper] if stopper else [])],
            timeout=seconds,
            return_when=asyncio.FIRST_COMPLETED,
        )
    finally:
        everyone.cancel()
        if stopper is not None:
            stopper.cancel()


async def _hand_back_unstarted(state: WorkerState) -> int:
    """Give the jobs locked but never started (the local queue) back to the fleet: in one
    statement when the backend can (architecture.md, "Drain phase"), else one by one.
    If that statement fails, their leases run out and the reclaim sweep takes them."""
    unstarted: list[tuple[JobRow, ActiveJob]] = []
    while not state.queue.empty():
        row = state.queue.get_nowait()
        if row is None:
            continue
        active = state.active.get(row.id)
        if active is None or active.task is not None or active.row.attempt != row.attempt:
            continue
        unstarted.append((row, active))
    backend = state.backend
    if not unstarted:
        released = 0
    elif isinstance(backend, SupportsUnstartedHandBack):
        jobs = [(row.id, row.attempt) for row, _ in unstarted]
        ends: list[BatchChildEnd] = []
        try:
            released = await backend.hand_back_unstarted(state.worker_id, jobs, batch_ends=ends)
        except transient_errors() as exc:
            _log.warning("taskq.unstarted-hand-back-failed", jobs=len(jobs), error=repr(exc))
            released = 0
            state.unconfirmed_at_stop += len(jobs)
        # Those it ended instead (past their deadline, a cancel requested): their batches.
        await apply_batch_child_ends(backend, ends)
    else:
        for row, _ in unstarted:
            confirmed = await hand_back(state, row, None, give_up=True, outcome="unstarted")
            state.unconfirmed_at_stop += not confirmed
        released = len(unstarted)
    for row, active in unstarted:
        state.release(row.id, active)
    return released


async def _escalate_user_cancel(state: WorkerState, active: ActiveJob) -> None:
    """Store phase 2 of a user's cancel before its task is cancelled, as the heartbeat's
    cancel controller does: the audit trail shows the force, and a task that ignores it
    can then be marked abandoned (ABANDONING)."""
    try:
        escalated = await state.backend.write_cancel_escalation(
            active.row.id, state.worker_id, 2, attempt=active.row.attempt
        )
    except transient_errors() as exc:
        _log.warning("taskq.cancel-escalation-failed", **job_fields(active.row), error=repr(exc))
        return
    if escalated:
        active.cancel_phase = CancelPhase.FORCED
        _log.warning("taskq.cancel-forced", **job_fields(active.row))


async def _force_user_cancel(state: WorkerState, active: ActiveJob) -> None:
    """Cancel the task of a job a user asked to cancel, phase 2 stored first (the task is
    cancelled even if that write failed: the stop does not wait for the database)."""
    try:
        await _escalate_user_cancel(state, active)
    except Exception as exc:  # noqa: BLE001 - a write's failure must not leave the task running
        # Not a transient error (those are handled inside), yet the job must still be
        # forced: raised out of the gather, it left this task running into ABANDONING.
        _log.error("taskq.cancel-escalation-failed", **job_fields(active.row), exc_info=exc)
    task = active.task
    # Looked at again after the write: an actor that returned meanwhile is finishing its
    # work (a commit, its outcome write), not running.
    if task is not None and not (active.returned or task.done()):
        task.cancel()


async def orchestrate_shutdown(
    state: WorkerState, escalate: asyncio.Event, *, requested_at: float | None = None
) -> None:
    """Run the four phases over the jobs this worker holds; returns when all is settled.

    ``requested_at`` (``time.monotonic()``) is when the stop was asked for, the instant
    the shutdown watchdog counts ``termination_grace_period`` from; default: now."""
    settings = state.settings
    started = time.monotonic() if requested_at is None else requested_at
    drain, cooperative, cleanup = (wait.total_seconds() for wait in settings.stop_waits)
    wall = settings.termination_grace_period.total_seconds()
    phases_end = started + wall - settings.stop_end_reserve.total_seconds()

    def within_wall(seconds: float) -> float:
        # What a step before took (a hand-back through a partition: a command timeout)
        # comes off the waits after it: the watchdog's wall does not move.
        if not settings.watchdog_enabled:
            return seconds
        return min(seconds, max(phases_end - time.monotonic(), 0.0))

    _enter(state, ShutdownPhase.DRAINING)
    released = await _hand_back_unstarted(state)
    if released:
        _log.info("taskq.unstarted-handed-back", jobs=released)
    if state.unheard_suspected:
        # A dispatch whose reply was lost just before the stop: the producer that
        # would have handed its jobs back has ended.
        state.unheard_suspected = False
        try:
            await hand_back_unheard(state)
        except transient_errors() as exc:
            _log.warning("taskq.unheard-jobs-transient-error", error=repr(exc))
    await _wait_running(state, within_wall(drain), escalate)

    _enter(state, ShutdownPhase.CANCELLING)
    for active in state.active.values():
        if not active.cancel_requested:
            active.interrupted = True
        if active.ctx is not None:
            active.ctx.cancel_event.set()
    await _wait_running(state, within_wall(cooperative), escalate)

    _enter(state, ShutdownPhase.FORCING)
    escalations = []
    for active in list(state.active.values()):
        # A job whose actor returned is only writing its outcome (retrying while the
        # database is away): cancelling that would lose a finished job's result.
        if active.task is None or active.task.done() or active.returned:
            continue
        if active.cancel_requested and active.cancel_phase is CancelPhase.COOPERATIVE:
            escalations.append(_force_user_cancel(state, active))
        else:
            active.task.cancel()
    # All at once, after the others' tasks: one by one, a slow database cost each write a
    # command timeout before the next job was forced, out of the stop's cleanup grace.
    await asyncio.gather(*escalations)
    await _wait_running(state, within_wall(cleanup), None)

    _enter(state, ShutdownPhase.ABANDONING)
    # Outcome writes still retrying get what is left of the stop's hard wall, less what
    # the teardown after this may take with the database away (deregistering, closing
    # the pool: a command timeout each; the LISTEN connection: a second), with room.
    teardown = min(3 * settings.dispatcher_command_timeout.total_seconds() + 2.0, wall / 2)
    left = wall - (time.monotonic() - started) - teardown
    until = time.monotonic() + max(left, 0.0)
    if any(a.holds_slot and (a.returned or _written_off(a)) for a in state.active.values()):
        await _wait_running(state, max(left, 0.0), None)
    await _wait_owed(state, until)
    # Concurrently: one by one, a database that is away would cost a lease per job.
    await asyncio.gather(*(_abandon(state, a) for a in list(state.active.values()) if a.holds_slot))
    _log.info("taskq.shutdown-duration", seconds=round(time.monotonic() - started, 3))


_OWED_POLL: Final = 0.05
"""How often ABANDONING looks whether the cancel controller's owed writes have landed."""


async def _wait_owed(state: WorkerState, until: float) -> None:
    """Until the cancel controller owes no end but those of jobs still holding a slot (the
    stop lets go of those itself), or ``until`` (``time.monotonic()``). A job written off
    whose task has ended holds no slot, yet its write, retried by the heartbeat's
    post-tick, is still owed: the stop let go at once, and it was never made."""

    def owed() -> set[tuple[JobId, int]]:
        held = {(a.row.id, a.row.attempt) for a in state.active.values() if a.holds_slot}
        return state.cancel.owed_ends() - held

    while owed() and time.monotonic() < until:  # noqa: ASYNC110 - the controller's queue has no event; looked at only while a stop is owed a write
        await asyncio.sleep(min(_OWED_POLL, max(until - time.monotonic(), 0.0)))


async def _abandon(state: WorkerState, active: ActiveJob) -> None:
    """Let go of a job whose task still runs at the end of the stop."""
    fields = job_fields(active.row)
    if active.returned:
        # Its teardown or outcome write was not confirmed in time: the completer's last flush
        # (awaited as the worker closes) may still land it; else the lease runs out
        # and the reclaim sweep takes it. "Unwritten" said more than was known.
        _log.warning("taskq.outcome-unconfirmed-at-stop", **fields)
        state.unconfirmed_at_stop += 1
        if active.task is not None:
            active.task.cancel()
    elif _written_off(active):
        # The controller's write of its failure kept failing (the database away); the
        # heartbeat ends with the stop. Not handed back (that ran it again): the lease
        # runs out and the reclaim sweep takes it.
        _log.warning("taskq.write-off-unconfirmed-at-stop", **fields)
        state.unconfirmed_at_stop += 1
    else:
        _log.error("taskq.task-ignored-cancellation", **fields)
        escalated = active.cancel_phase >= CancelPhase.FORCED
        # Its outcome is this write: should the task return at last, it writes nothing.
        active.cancel_phase = CancelPhase.ABANDON_PENDING
        if active.interrupted:
            confirmed = await hand_back(state, active.row, active.ctx, give_up=True)
        else:
            confirmed = await _mark_abandoned(state, active, escalated)
        state.unconfirmed_at_stop += not confirmed
    active.finish()


def _written_off(active: ActiveJob) -> bool:
    """Whether the cancel controller wrote ``active`` off past its limit (no user's
    cancel): its failure is the controller's write, retried by the heartbeat until it
    lands."""
    return active.cancel_phase is CancelPhase.ABANDON_PENDING and not active.cancel_requested


async def _mark_abandoned(state: WorkerState, active: ActiveJob, escalated: bool) -> bool:
    """End a user-cancelled job whose task outlived the stop ``abandoned``. Phase 2 is
    stored first if FORCING could not store it (its write failed): ``mark_abandoned``
    acts only on phase 2, and the job would stay locked by a worker that has gone.
    False when the write was given up (the database away). A write refused because the
    job was taken away (reclaimed while the stop ran on) is kept as a late outcome."""
    backend, row = state.backend, active.row
    if not escalated:
        await write_retrying(
            state,
            "cancel escalation",
            lambda: backend.write_cancel_escalation(
                row.id, state.worker_id, 2, attempt=row.attempt
            ),
            give_up=True,
        )
    written = await write_retrying(
        state,
        "abandoned",
        lambda: backend.mark_abandoned(row.id, state.worker_id, attempt=row.attempt),
        give_up=True,
    )
    if written is False:  # None: given up, logged as such
        # Found landed (an earlier try's, the controller's whose reply was lost), the end
        # is this worker's: said so, the controller's retry of it applies no hook again.
        if not active.ended and await _abandon_refused(state, row):
            active.ended = True
    elif written:
        active.ended = True
        await apply_batch_terminal_outcome(backend, row, "abandoned")
    return written is not None


async def _abandon_refused(state: WorkerState, row: JobRow) -> bool:
    """``mark_abandoned`` changed nothing: the job was taken away (reclaimed while the
    stop ran on: the history said only what the reclaim made of it), a late outcome
    unless an earlier try of the write landed, its reply lost; or it is still this
    worker's at this attempt, its phase 2 never stored (that write failed or was refused),
    which is only logged, as is a row that could not be read (the database away) or is
    gone. True when the write had landed (its batch hook applied here)."""
    current = await write_retrying(state, "read", lambda: state.backend.get(row.id), give_up=True)
    ours = (
        current is not None
        and current.status is JobStatus.RUNNING
        and current.locked_by_worker == state.worker_id
        and current.attempt == row.attempt
    )
    if current is None or ours:
        _log.warning("taskq.abandon-not-written", **job_fields(row))
        return False
    if not await late_unless_landed(state, row, "abandoned"):
        return False
    # An earlier try's, its reply lost: the worker's own end.
    await apply_batch_terminal_outcome(state.backend, row, "abandoned")
    return True
