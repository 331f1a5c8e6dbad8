"""The heartbeat loop: renews this worker's locks and picks up cancel requests.

When the backend renews fewer locks than the worker holds, some job was
reclaimed behind its back (a long pause, a network partition): those jobs'
local tasks are cancelled at once, and their outcome is never written.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager
from typing import NamedTuple

import structlog

from taskq.backend._protocol import (
    SupportsLeaseRenewal,
    SupportsWorkerCancelWake,
    SupportsWorkerRegistry,
)
from taskq.backend.statemachine import JobStatus
from taskq.logs import job_fields
from taskq.models import JobId
from taskq.worker._state import ActiveJob, WorkerState
from taskq.worker._transient import RepeatedWarning, UnexpectedLoopErrorGuard, transient_errors

_log = structlog.get_logger("taskq.worker")


async def _sleep_or_wake(seconds: float, wake: asyncio.Event) -> None:
    try:
        async with asyncio.timeout(seconds):
            await wake.wait()
    except TimeoutError:
        pass


def _cancel_wake(state: WorkerState) -> AbstractAsyncContextManager[asyncio.Event]:
    """Woken by cancel requests for this worker's jobs only, where the backend can tell;
    else by every cancel request (each then costs every worker a heartbeat)."""
    backend = state.backend
    if isinstance(backend, SupportsWorkerCancelWake):
        return backend.subscribe_worker_cancel_wake(state.worker_id)
    return backend.subscribe_cancel_wake()


async def heartbeat_once(state: WorkerState, toucher: _Toucher | None = None) -> None:
    """One tick: renew leases and this worker's registry row, drop lost jobs, advance
    cancellations."""
    backend, wid = state.backend, state.worker_id
    held = dict(state.active)
    sent = asyncio.get_running_loop().time()
    if toucher is not None:
        toucher.touch()
    renewal = await _renew(state, held)
    for job_id in renewal.renewed:  # held before the renewal was sent: renewed from then
        held[job_id].lease_from = max(held[job_id].lease_from, sent)
    if renewal.unheard:
        # Locked for this worker and unknown to it, unless a dispatch is on its way:
        # the producer looks, between two dispatches.
        state.unheard_suspected = True
    for job_id in renewal.look_at:
        active = held[job_id]
        row = await backend.get(job_id)
        still_ours = (
            row is not None
            and row.status is JobStatus.RUNNING
            and row.locked_by_worker == wid
            and row.attempt == active.row.attempt
        )
        if still_ours or active.returned or state.active.get(job_id) is not active:
            continue
        _log.warning("taskq.lock-lost", **job_fields(active.row))
        active.lost = True
        if active.task is not None:
            active.task.cancel()
        else:
            state.release(job_id, active)
    cancel, lease = state.cancel, state.settings.lock_lease

    async def cancel_step() -> None:
        await cancel.run_tick(await backend.poll_cancel_flags(wid))

    # In this order, each also when one before it failed (raised once all had their
    # turn: an escalation failing every tick kept the abandonments unwritten): the
    # cancellations, then the abandonments they queued; then the reservation slots'
    # leases (a lock on that table times the tick out there, after the jobs'); last
    # the late outcomes, history only. None once the tick's bound cut one: no bound
    # is left to them, and their writes stay queued for the next tick.
    steps = (
        cancel_step,
        cancel.run_post_tick,
        lambda: backend.extend_reservation_leases(wid, lease),
        cancel.write_late_outcomes,
    )
    failed: Exception | None = None
    for step in steps:
        try:
            await step()
        except Exception as exc:  # noqa: BLE001 - raised below, after the others
            failed = failed or exc
    if failed is not None:
        raise failed


class _Toucher:
    """The worker's registry row, touched at each tick on a task of its own, beside the
    lease renewal and never awaited by it: a lock held on either table (a migration, an
    operator's LOCK TABLE, a CREATE INDEX) past a tick's bound stalls one, not both.
    The reclaim sweep leaves the jobs of a worker seen within a lease, so a renewal
    held up on the jobs table loses nothing; a renewal held up (or failed) by a touch
    would lose every job. A touch still held up when the next tick comes is left to
    finish; a failed one is logged then."""

    def __init__(self, state: WorkerState, backend: SupportsWorkerRegistry) -> None:
        self._state = state
        self._backend = backend
        self._task: asyncio.Task[None] | None = None
        self._failing = RepeatedWarning("taskq.worker-touch-transient-error")

    def touch(self) -> None:
        task = self._task
        if task is not None:
            if not task.done():
                return
            self._report(task)
        self._task = asyncio.get_running_loop().create_task(self._touch())

    async def _touch(self) -> None:
        state = self._state
        if not await self._backend.touch_worker(state.worker_id):
            # Swept as stale (this worker stalled past stale_worker_after): show it again.
            _log.warning("taskq.worker-row-restored", worker_id=str(state.worker_id))
            await state.register()

    def _report(self, task: asyncio.Task[None]) -> None:
        error = None if task.cancelled() else task.exception()
        if error is None:
            if not task.cancelled():
                self._failing.ok()
            return
        if isinstance(error, transient_errors()):
            self._failing.failed(error)
        else:
            _log.error("taskq.worker-touch-failed", error=repr(error))

    async def aclose(self) -> None:
        """Cancel a touch under way (the worker stops) and wait for it to end."""
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        await asyncio.wait({task})
        if not task.cancelled():
            self._report(task)


class _Renewal(NamedTuple):
    renewed: frozenset[JobId]
    """Held jobs whose leases the tick renewed."""
    look_at: frozenset[JobId]
    """Held jobs that may not be this worker's any more."""
    unheard: bool
    """Whether it renewed a job this worker does not know."""


async def _renew(state: WorkerState, held: Mapping[JobId, ActiveJob]) -> _Renewal:
    backend, wid, lease = state.backend, state.worker_id, state.settings.lock_lease
    if isinstance(backend, SupportsLeaseRenewal):
        ids = frozenset(await backend.renew_leases(wid, lease))
        # One not renewed was reclaimed, finished meanwhile, or held by another
        # transaction this time (the backend skips those).
        return _Renewal(ids & held.keys(), frozenset(held.keys() - ids), not ids <= held.keys())
    # Only a count: every job it still holds was renewed; fewer than known means some
    # are no longer its own, and each is looked at.
    count = await backend.heartbeat_jobs(wid, lease)
    every = frozenset(held)
    return _Renewal(every, every if count < len(held) else frozenset(), count > len(held))


async def heartbeat_loop(state: WorkerState) -> None:
    """Tick every ``heartbeat_interval`` (sooner on a cancel wake) until cancelled."""
    guard = UnexpectedLoopErrorGuard("heartbeat")
    failing = RepeatedWarning("taskq.heartbeat-transient-error")
    transient = transient_errors()  # the bound's TimeoutError among them (core's)
    interval = state.settings.heartbeat_interval.total_seconds()
    # A tick of several statements (renewals first) is bounded as a whole: on a slow but
    # healthy database they added up past the stale-tick budget.
    bound = state.settings.dispatcher_command_timeout.total_seconds()
    backend = state.backend
    toucher = _Toucher(state, backend) if isinstance(backend, SupportsWorkerRegistry) else None
    try:
        async with _cancel_wake(state) as cancel_wake:
            while True:
                cancel_wake.clear()
                try:
                    async with asyncio.timeout(bound):
                        await heartbeat_once(state, toucher)
                except transient as exc:
                    failing.failed(exc)
                except Exception as exc:  # noqa: BLE001 - the guard decides
                    guard.failed(exc)
                else:
                    failing.ok()
                    guard.succeeded()
                state.liveness.tick("heartbeat", interval)
                await _sleep_or_wake(interval, cancel_wake)
    finally:
        if toucher is not None:
            await toucher.aclose()
        await _flush_late_outcomes(state, bound)


async def _flush_late_outcomes(state: WorkerState, bound: float) -> None:
    """Write the late outcomes still queued as the heartbeat ends: the stop ends it once
    every slot is freed, and a write-off refused at its last tick freed its slot before
    its late outcome (written last in the tick) was written. Bounded as a tick is."""
    try:
        async with asyncio.timeout(bound):
            await state.cancel.write_late_outcomes()
    except Exception as exc:  # noqa: BLE001 - the stop goes on: a history line is lost
        _log.warning("taskq.late-outcomes-unwritten-at-stop", error=repr(exc))
