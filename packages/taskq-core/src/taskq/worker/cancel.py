"""Three-phase cancellation of running jobs, driven by the heartbeat.

1. **Cooperative** — the first time this worker sees a cancel request
   (``poll_cancel_flags``) it sets the actor's ``ctx.cancel_event`` and notes
   the (monotonic) time. No write: the request is already stored.
2. **Forced** — after ``cancellation_grace_period`` the escalation (phase 2
   and its event row) is written, and only then, with no await in between,
   the job's task is cancelled. If the write fails the task is left alone
   and the next tick tries again. A phase 2 already stored (written by an
   earlier run of this worker) fast-advances the local phase without a write.
3. **Abandonment** — after ``cancellation_grace_period +
   cleanup_grace_period`` a task that still has not stopped (it swallowed
   ``CancelledError``) is queued as ``ABANDON_PENDING`` (in-process only);
   :meth:`CancelController.run_post_tick` writes ``mark_abandoned`` after the
   tick's own writes are done, and the consumer moves on.

The consumer skips its own terminal write for a job in ``ABANDON_PENDING``:
the controller owns it, so the two can never both write.

A job still running a cleanup grace past its own limit (its timeout or deadline: an
async actor that swallowed the limit's cancellation, or a sync actor's thread) is no
user's cancel: it goes ``ABANDON_PENDING`` at once, and the post-tick writes its
attempt ``failed`` with the limit's error (fenced by its attempt), not retried, since
its code may run on; its slot is freed.

A write-off or abandonment that finds the job reclaimed meanwhile (the write refused,
or the heartbeat found the lock lost before it) is kept as a ``late_outcome`` event,
as the consumer's own refused writes are, unless an earlier try of it landed (a
late outcome written again is kept once: the backend's ``record_late_outcome``).

The architecture runs phases 1-3 inside one heartbeat transaction
(``run_in_tx(conn)``); here every write is one atomic statement of the
backend's own (the escalation UPDATE and its event row together), so the
controller needs no connection of its own and core imports no driver.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass
from typing import Literal, Protocol, TypeVar, runtime_checkable

import structlog

from taskq.backend import CancelPhase
from taskq.backend.storable import stored_error
from taskq.batch_outcomes import apply_batch_terminal_outcome
from taskq.logs import job_fields
from taskq.models import CancelFlag, ErrorInfo, JobId
from taskq.worker._state import ActiveJob, WorkerState
from taskq.worker.consumer import late_unless_landed

__all__ = ["CancelController", "make_cancel_controller"]

_log = structlog.get_logger("taskq.worker")

_LateOutcome = Literal["failed", "abandoned"]
_Entry = TypeVar("_Entry")


@dataclass
class _Late:
    """A late outcome queued for the post-tick."""

    active: ActiveJob
    outcome: _LateOutcome
    error: ErrorInfo | None


@runtime_checkable
class CancelController(Protocol):
    """What the heartbeat calls on every tick."""

    async def run_tick(self, flags: list[CancelFlag]) -> None:
        """Observe new cancel requests and escalate overdue ones."""
        ...

    async def run_post_tick(self) -> None:
        """Write the abandonments queued by :meth:`run_tick`."""
        ...

    async def write_late_outcomes(self) -> None:
        """Record the write-offs and abandonments the post-tick found refused (the job
        reclaimed while it ran on) as ``late_outcome`` events."""
        ...

    def owed_ends(self) -> set[tuple[JobId, int]]:
        """``(job id, attempt)`` of each attempt written off and not written yet: still
        this worker's, whether or not its task has ended."""
        ...


class _CancelController:
    def __init__(self, state: WorkerState) -> None:
        self._state = state
        # The entries, not their ids: a job reclaimed and locked for this worker again
        # meanwhile has a new entry, whose attempt is not the one to write off. Each
        # with the error of a write-off past a limit, or None for an abandonment.
        self._written_off: deque[tuple[ActiveJob, ErrorInfo | None]] = deque()
        self._pending_late: deque[_Late] = deque()

    async def run_tick(self, flags: list[CancelFlag]) -> None:
        state = self._state
        loop = asyncio.get_running_loop()
        for flag in flags:
            active = state.active.get(flag.job_id)
            if active is None:
                continue
            if active.cancel_phase is CancelPhase.NONE:
                active.cancel_requested = True
                active.cancel_phase = CancelPhase.COOPERATIVE
                active.cancel_observed_at = loop.time()
                if active.ctx is not None:
                    active.ctx.cancel_event.set()
                _log.info("taskq.cancel-observed", **job_fields(active.row), reason=flag.reason)
            if flag.cancel_phase is CancelPhase.FORCED and active.cancel_phase < CancelPhase.FORCED:
                active.cancel_phase = CancelPhase.FORCED  # already escalated: no second write
                active.cancel_forced_at = loop.time()
                if active.task is not None and not active.returned:
                    active.task.cancel()
        grace = state.settings.cancellation_grace_period.total_seconds()
        unwind = state.settings.cleanup_grace_period.total_seconds()
        cleanup = grace + unwind
        await self._stop_overruns(loop.time())
        # A write that fails (a row another transaction holds, a blip) is raised once
        # the other jobs had theirs: failing first every tick, it kept them unforced.
        failed: Exception | None = None
        for job_id, active in list(state.active.items()):
            # Not a job whose actor returned (its outcome write may be retrying through a
            # blip: cancelling it lost the result and ran the job again), nor one whose
            # lock was lost (its writes are no longer this worker's).
            if (
                active.cancel_observed_at is None
                or active.task is None
                or active.task.done()
                or active.returned
                or active.lost
            ):
                continue
            waited = loop.time() - active.cancel_observed_at
            if active.cancel_phase is CancelPhase.COOPERATIVE and waited >= grace:
                try:
                    escalated = await state.backend.write_cancel_escalation(
                        job_id, state.worker_id, 2, attempt=active.row.attempt
                    )
                except Exception as exc:  # noqa: BLE001 - raised below, after the others
                    failed = failed or exc
                    continue
                if escalated:
                    # Stored before the task hears of it, with no await in between.
                    active.cancel_phase = CancelPhase.FORCED
                    active.cancel_forced_at = loop.time()
                    # Looked at again after the write: an actor that returned meanwhile
                    # is finishing its work (a commit, its outcome write), not running.
                    if not (active.returned or active.task.done() or active.lost):
                        active.task.cancel()
                        _log.warning("taskq.cancel-forced", **job_fields(active.row))
            elif (
                active.cancel_phase is CancelPhase.FORCED
                and waited >= cleanup
                # A cleanup grace from the task's cancellation too: an escalation
                # whose write was held up (the database away) would leave it none.
                and loop.time() - (active.cancel_forced_at or 0.0) >= unwind
            ):
                active.cancel_phase = CancelPhase.ABANDON_PENDING
                self._written_off.append((active, None))
        if failed is not None:
            raise failed

    async def _stop_overruns(self, now: float) -> None:
        """Give up on each job still running a cleanup grace past its limit: an async
        actor that swallowed the limit's cancellation, or a sync actor's thread (a job
        that runs on past its limit held its slot and its lease for ever). Told to stop
        once more, it is failed by the post-tick with its limit's error; whatever it
        does later writes nothing. A job whose actor returned is not stopped for its
        limit or a cancel, but one whose teardown (a commit stuck on a dead connection)
        outlasts them by a cleanup grace is given up the same way, said as such."""
        state = self._state
        settings = state.settings
        cleanup = settings.cleanup_grace_period.total_seconds()
        grace = settings.cancellation_grace_period.total_seconds()
        for active in list(state.active.values()):
            if (
                active.task is None
                or active.task.done()
                or active.settling
                or active.lost
                or active.interrupted  # a stop's own phases handle it
                or active.fenced
                or active.cancel_phase >= CancelPhase.ABANDON_PENDING
            ):
                continue
            if active.returned:
                bounds: list[float] = []
                if active.limit_at is not None:
                    bounds.append(active.limit_at + cleanup)
                if active.cancel_observed_at is not None:
                    bounds.append(active.cancel_observed_at + grace + cleanup)
                if not bounds or now < min(bounds):
                    continue
                error = ErrorInfo(
                    error_class="TeardownTimeout",
                    message=f"the actor returned, but its dependencies' teardown (a "
                    f"transaction's commit?) still ran past its "
                    f"{'limit' if active.limit_at is not None else 'cancellation'} and "
                    f"{cleanup:g}s more, so not retried: its work may have committed",
                )
            elif (
                active.limit_at is None
                or now < active.limit_at + cleanup
                or active.cancel_phase is not CancelPhase.NONE
                or active.limit_error is None
            ):
                continue
            else:
                error = active.limit_error.model_copy(
                    update={
                        "message": f"{active.limit_error.message}; still running "
                        f"{cleanup:g}s later (a sync actor's thread, or an actor that caught "
                        f"its cancellation), so not retried: its code may run on"
                    }
                )
            active.cancel_phase = CancelPhase.ABANDON_PENDING
            if active.ctx is not None:
                active.ctx.cancel_event.set()
            active.task.cancel()
            self._written_off.append((active, error))
            _log.warning("taskq.job-past-its-limit", **job_fields(active.row), error=error.message)

    def owed_ends(self) -> set[tuple[JobId, int]]:
        return {(active.row.id, active.row.attempt) for active, _ in self._written_off}

    async def run_post_tick(self) -> None:
        # Each queued write is tried once a tick, moved to the back of its queue first:
        # one that fails (raised once the others had theirs) or hangs until the tick's
        # bound cuts it stays queued behind the others, which it held back when first.
        # It leaves its queue only once written: taken off before, a cut lost it, the
        # job held (or handed back as unheard) with its slot.
        failed: Exception | None = None
        for _ in range(len(self._written_off)):
            entry = _to_back(self._written_off)
            active, error = entry
            if not active.ended:  # else written, the tick cut short after
                try:
                    if error is None:
                        refused = await self._write_abandon(active)
                    else:
                        refused = await self._write_overrun(active, error)
                except Exception as exc:  # noqa: BLE001 - raised below, after the others
                    failed = failed or exc
                    continue
                if refused:
                    outcome: _LateOutcome = "abandoned" if error is None else "failed"
                    self._pending_late.append(_Late(active, outcome, error))
            _drop(self._written_off, entry)
            active.finish()
        if failed is not None:
            raise failed

    async def write_late_outcomes(self) -> None:
        # Queued as the post-tick's writes are; written last in the tick (history only),
        # so that one held up (its table locked) costs no slot nor lease.
        failed: Exception | None = None
        for _ in range(len(self._pending_late)):
            late = _to_back(self._pending_late)
            active, outcome = late.active, late.outcome
            if active.ended:  # the stop's own abandonment of it landed first
                _drop(self._pending_late, late)
                continue
            # Reclaimed while it ran on (the worker frozen or cut off), the attempt's
            # history said only what the reclaim made of it.
            row = active.row
            try:
                landed = await late_unless_landed(self._state, row, outcome, late.error)
            except Exception as exc:  # noqa: BLE001 - raised below, after the others
                failed = failed or exc
                continue
            _drop(self._pending_late, late)
            if landed:  # an earlier try's, its reply lost: the worker's own end
                # Said so before the hook: the stop's abandonment of it, refused in turn,
                # found it landed too and applied the hook again.
                active.ended = True
                await apply_batch_terminal_outcome(self._state.backend, row, outcome)
        if failed is not None:
            raise failed

    async def _write_overrun(self, active: ActiveJob, error: ErrorInfo) -> bool:
        """Fail the attempt with ``error``; True when the write was refused, the
        attempt not this worker's any more."""
        state = self._state
        if not self._still_current(active):
            return True
        row = active.row
        after = await state.backend.mark_failed_or_retry(
            row.id,
            state.worker_id,
            error,
            None,
            active.ctx.progress_seq if active.ctx else 0,
            active.ctx.progress_state if active.ctx else None,
            attempt=row.attempt,
        )
        if after is None:
            return False
        # Compared as stored: else a no-op, the row as someone else left it.
        if after.attempt != row.attempt or after.error != stored_error(error):
            return True
        active.ended = True
        _log.error("taskq.job-failed-past-its-limit", **job_fields(row))
        await apply_batch_terminal_outcome(state.backend, row, "failed")
        return False

    async def _write_abandon(self, active: ActiveJob) -> bool:
        """End the attempt ``abandoned``; True when the write was refused: its phase 2
        stored, the job is no longer ``running`` (reclaimed while it ran on)."""
        state = self._state
        if not self._still_current(active):
            return True
        if not await state.backend.mark_abandoned(
            active.row.id,
            state.worker_id,
            active.ctx.progress_seq if active.ctx else 0,
            active.ctx.progress_state if active.ctx else None,
            attempt=active.row.attempt,
        ):
            return True
        active.ended = True
        _log.error("taskq.job-abandoned", **job_fields(active.row))
        await apply_batch_terminal_outcome(state.backend, active.row, "abandoned")
        return False

    def _still_current(self, active: ActiveJob) -> bool:
        """Whether ``active``'s attempt is still this worker's to write: not lost, nor
        replaced by a later attempt locked for it (an entry gone since is its task's
        end, which wrote nothing for an attempt written off). One that is not is as a
        write refused: reclaimed while it ran on (a write failing meanwhile, the
        heartbeat found it so), the attempt still came to what was to be written."""
        current = self._state.active.get(active.row.id)
        return not active.lost and (current is None or current is active)


def _to_back(queue: deque[_Entry]) -> _Entry:
    """``queue``'s first entry, moved to its back."""
    queue.rotate(-1)
    return queue[-1]


def _drop(queue: deque[_Entry], entry: _Entry) -> None:
    """Take ``entry`` (this very object) off ``queue``."""
    for index, queued in enumerate(queue):
        if queued is entry:
            del queue[index]
            return


def make_cancel_controller(state: WorkerState) -> CancelController:
    """The production controller for one worker."""
    return _CancelController(state)
