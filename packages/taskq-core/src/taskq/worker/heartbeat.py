"""The heartbeat loop: renews this worker's locks and picks up cancel requests.

When the backend renews fewer locks than the worker holds, some job was
reclaimed behind its back (a long pause, a network partition): those jobs'
local tasks are cancelled at once, and their outcome is never written.
"""

from __future__ import annotations

import asyncio
from contextlib import AbstractAsyncContextManager

import structlog

from taskq.backend._protocol import SupportsWorkerCancelWake, SupportsWorkerRegistry
from taskq.backend.statemachine import JobStatus
from taskq.worker._state import WorkerState
from taskq.worker._transient import UnexpectedLoopErrorGuard, transient_errors

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


async def heartbeat_once(state: WorkerState) -> None:
    """One tick: renew leases and this worker's registry row, drop lost jobs, advance
    cancellations."""
    backend, wid = state.backend, state.worker_id
    held = dict(state.active)
    sent = asyncio.get_running_loop().time()
    renewed = await backend.heartbeat_jobs(wid, state.settings.lock_lease)
    for active in held.values():  # known before it was sent: locked by then, so renewed
        active.lease_from = max(active.lease_from, sent)
    if renewed > len(held):
        # Locked for this worker and unknown to it, unless a dispatch is on its way:
        # the producer looks, between two dispatches.
        state.unheard_suspected = True
    await backend.extend_reservation_leases(wid, state.settings.lock_lease)
    if isinstance(backend, SupportsWorkerRegistry) and not await backend.touch_worker(wid):
        # Swept as stale (this worker stalled past stale_worker_after): show it again.
        _log.warning("taskq.worker-row-restored", worker_id=str(wid))
        await state.register()
    if renewed < len(held):
        for job_id, active in held.items():
            row = await backend.get(job_id)
            still_ours = (
                row is not None
                and row.status is JobStatus.RUNNING
                and row.locked_by_worker == wid
                and row.attempt == active.row.attempt
            )
            if still_ours or active.settling or state.active.get(job_id) is not active:
                continue
            _log.warning("taskq.lock-lost", job_id=str(job_id), attempt=active.row.attempt)
            active.lost = True
            if active.task is not None:
                active.task.cancel()
            else:
                state.release(job_id, active)
    await state.cancel.run_tick(await backend.poll_cancel_flags(wid))
    await state.cancel.run_post_tick()


async def heartbeat_loop(state: WorkerState) -> None:
    """Tick every ``heartbeat_interval`` (sooner on a cancel wake) until cancelled."""
    guard = UnexpectedLoopErrorGuard("heartbeat")
    transient = transient_errors()  # the bound's TimeoutError among them (core's)
    interval = state.settings.heartbeat_interval.total_seconds()
    # A tick of several statements (renewals first) is bounded as a whole: on a slow but
    # healthy database they added up past the stale-tick budget.
    bound = state.settings.dispatcher_command_timeout.total_seconds()
    async with _cancel_wake(state) as cancel_wake:
        while True:
            cancel_wake.clear()
            try:
                async with asyncio.timeout(bound):
                    await heartbeat_once(state)
            except transient as exc:
                _log.warning("taskq.heartbeat-transient-error", error=repr(exc))
            except Exception as exc:  # noqa: BLE001 - the guard decides
                guard.failed(exc)
            else:
                guard.succeeded()
            state.liveness.tick("heartbeat", interval)
            await _sleep_or_wake(interval, cancel_wake)
