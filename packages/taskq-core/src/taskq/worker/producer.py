"""The producer loop: locks due jobs into the local queue while there is room.

When a dispatch finds nothing, it sleeps on the backend's wake subscription
(NOTIFY on Postgres) and falls back to polling every ``poll_interval`` (at the start
and right after a full dispatch, it first looks once more, a dispatch's time later);
when the process is full it waits for a consumer to free a slot instead.

A dispatch that fails may still have committed (its reply lost with the
connection, or the error raised while reading it): its jobs are then locked
by this worker, which does not know them, and the heartbeat (renewing every
job the worker locks) would keep them ``running`` for as long as the worker
lives. So after such a failure (or when a heartbeat renews more jobs than
the worker knows), before dispatching again, the producer asks the backend
which jobs it holds and hands back the ones it never heard of, unstarted.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import structlog

from taskq.backend import SupportsActorDispatch, SupportsHeldJobs, SupportsUnstartedHandBack
from taskq.batch_outcomes import applied_batch_ends
from taskq.models import JobRow
from taskq.worker._state import ActiveJob, WorkerState
from taskq.worker._transient import RepeatedWarning, UnexpectedLoopErrorGuard, transient_errors

_log = structlog.get_logger("taskq.worker")


async def _wait(seconds: float, *events: asyncio.Event) -> None:
    """Until one of ``events`` is set, or ``seconds`` pass."""
    waiters = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()


async def hand_back_unheard(state: WorkerState) -> None:
    """Hand back the jobs the backend says this worker holds and it never heard of.

    Runs only between dispatches (the producer makes them one at a time, and the
    shutdown's drain after the producer stopped), so none of them can be a dispatch
    still on its way here.
    """
    backend = state.backend
    if not (
        isinstance(backend, SupportsHeldJobs) and isinstance(backend, SupportsUnstartedHandBack)
    ):
        return  # without both, the lease runs out once the worker stops
    known = {(job_id, active.row.attempt) for job_id, active in state.active.items()}
    # A job written off whose task ended meanwhile is still running here until its end
    # is written: handed back, its run was said "unstarted" and it could run again.
    known |= state.cancel.owed_ends()
    unheard = [job for job in await backend.held_jobs(state.worker_id) if job not in known]
    if unheard:
        # Those it ended instead count for their batches, even when the producer's
        # bound cuts in after the hand-back (a quarter of it more).
        grace = state.settings.batch_ends_grace.total_seconds()
        async with applied_batch_ends(backend, grace=grace) as ends:
            moved = await backend.hand_back_unstarted(state.worker_id, unheard, batch_ends=ends)
        _log.warning("taskq.unheard-jobs-handed-back", jobs=len(unheard), moved=moved)


async def _hand_back_stale(state: WorkerState, stale: list[ActiveJob], deadline: float) -> None:
    """Hand back the jobs locked ahead that waited too long here, unstarted (``auto``
    prefetch: the jobs running turned out long, and another worker may be idle).

    They are let go here first, so that no consumer starts one meanwhile. If the hand-back
    fails they stay locked to this worker, which no longer knows them: the producer's
    check for unheard jobs hands them back next."""
    backend = state.backend
    assert isinstance(backend, SupportsUnstartedHandBack)  # stale_after says so
    now = asyncio.get_running_loop().time()
    waited = max(now - active.held_at for active in stale)
    for active in stale:
        state.release(active.row.id, active)
    jobs = [(active.row.id, active.row.attempt) for active in stale]
    grace = state.settings.batch_ends_grace.total_seconds()
    try:
        async with asyncio.timeout_at(deadline):
            async with applied_batch_ends(backend, grace=grace) as ends:
                moved = await backend.hand_back_unstarted(state.worker_id, jobs, batch_ends=ends)
    except Exception as exc:  # noqa: BLE001 - whatever it was, the unheard check follows up
        state.unheard_suspected = True
        _log.warning("taskq.locked-ahead-hand-back-failed", jobs=len(jobs), error=repr(exc))
        return
    _log.info("taskq.locked-ahead-handed-back", jobs=len(jobs), moved=moved, waited_s=waited)


def _dispatcher(state: WorkerState) -> Callable[[int], Awaitable[list[JobRow]]]:
    """Dispatch of up to ``n`` jobs: of this application's actors only where the backend
    can (``SupportsActorDispatch``). Elsewhere a job of an actor it does not know (a
    newer release's, mid-deploy, or one since removed) is locked, then handed back
    a few seconds later, while the workers that know its actor may idle."""
    backend, settings, worker_id = state.backend, state.settings, state.worker_id
    queues, lease = settings.queues, settings.lock_lease
    if isinstance(backend, SupportsActorDispatch):
        actors = sorted(state.actors)
        return lambda n: backend.dispatch_actors_batch(worker_id, queues, n, lease, actors)
    return lambda n: backend.dispatch_batch(worker_id, queues, n, lease)


async def producer_loop(state: WorkerState) -> None:
    """Dispatch until ``state.stopping`` is set."""
    settings = state.settings
    poll = settings.poll_interval.total_seconds()
    # An iteration's calls share one bound: on a slow but healthy database a hand-back
    # and a dispatch of several statements, each inside the timeout, added up past the
    # stale-tick budget.
    bound = settings.dispatcher_command_timeout.total_seconds()
    guard = UnexpectedLoopErrorGuard("producer")
    transient = transient_errors()  # the bound's TimeoutError among them (core's)
    clock = asyncio.get_running_loop()
    dispatch = _dispatcher(state)
    # Jobs locked ahead are handed back when stale only where the backend can do it
    # unstarted; elsewhere they wait their turn.
    stale_after = (
        state.prefetch.stale_after if isinstance(state.backend, SupportsUnstartedHandBack) else None
    )
    dispatch_failing = RepeatedWarning("taskq.dispatch-transient-error")
    unheard_failing = RepeatedWarning("taskq.unheard-jobs-transient-error")
    # While an empty dispatch is to be looked at again: how long the last full one (all
    # it asked for) took. None once one came back short or empty. Armed at the start
    # too (0.0: wait as long as the empty one took): other workers may be mid-batch,
    # holding every job due.
    recheck_after: float | None = 0.0
    async with state.backend.subscribe_wake() as wake:
        while not state.stopping.is_set():
            state.liveness.tick("producer", poll)
            deadline = clock.time() + bound
            if state.unheard_suspected:
                # Cleared first: a heartbeat suspecting again meanwhile is not lost.
                state.unheard_suspected = False
                try:
                    async with asyncio.timeout_at(deadline):
                        await hand_back_unheard(state)
                except Exception as exc:  # noqa: BLE001 - transient, or the guard decides
                    if isinstance(exc, transient):
                        unheard_failing.failed(exc)
                    else:
                        guard.failed(exc)
                    state.unheard_suspected = True
                    await _wait(poll, state.stopping)
                    continue
                unheard_failing.ok()
            free = state.free_slots()
            if free <= 0:
                state.slot_freed.clear()
                if state.free_slots() <= 0:
                    if stale_after is not None:
                        stale, next_due = state.stale_ahead(stale_after)
                        if stale:
                            await _hand_back_stale(state, stale, deadline)
                            continue
                        if next_due is not None:
                            await _wait(min(poll, next_due), state.slot_freed, state.stopping)
                            continue
                    await _wait(poll, state.slot_freed, state.stopping)
                continue
            wanted = min(free, settings.dispatch_batch_size)
            # Cleared before dispatching: a NOTIFY arriving meanwhile sets it again, as a
            # gated job ending does the gate.
            wake.clear()
            state.gate_opened.clear()
            sent = clock.time()
            try:
                async with asyncio.timeout_at(max(deadline, clock.time() + bound / 4)):
                    jobs = await dispatch(wanted)
            except transient as exc:
                dispatch_failing.failed(exc)
                state.unheard_suspected = True  # it may have locked jobs all the same
                await _wait(poll, state.stopping)
                continue
            except Exception as exc:  # noqa: BLE001 - the guard decides
                guard.failed(exc)
                state.unheard_suspected = True  # it may have locked jobs all the same
                await _wait(poll, state.stopping)
                continue
            guard.succeeded()
            dispatch_failing.ok()
            for row in jobs:
                state.hold(row, sent)
            # Only an empty dispatch means nothing is due. A short one may have skipped
            # rows other workers had locked (``SKIP LOCKED``) with more due behind them:
            # waiting for a wake there left a worker idle for a whole poll interval in
            # a drain, where no enqueue sends one. The next turn finds out.
            took = clock.time() - sent
            if len(jobs) == wanted:
                recheck_after = took
            elif jobs:
                recheck_after = None
            elif recheck_after is not None:
                # Empty right after a full one (or the first): the due jobs may all be
                # held by other workers' dispatches still in flight (a head the backend
                # reads past only so far, or one its caps and identities gate). Those
                # commit within about as long as a dispatch takes: look again then, once.
                again = min(poll, max(recheck_after, took))
                await _wait(again, wake, state.gate_opened, state.stopping)
                recheck_after = None
            else:
                await _wait(poll, wake, state.gate_opened, state.stopping)
    # Stopped on purpose: the shutdown that follows may outlast this loop's stale-tick
    # budget, and detector 2 must not take a loop that ended for a stuck one.
    state.liveness.forget("producer")
