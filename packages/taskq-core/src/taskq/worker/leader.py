"""``MaintenanceLeader``: the election and the leader-only loops of one worker.

Every worker runs the election loop; the loops behind it (promotion, the
deadline/reclaim sweeps and stale workers, cron, result expiry, stale batches,
queue-depth sampling, the stranded-jobs detector, prune, archive expiry) work
only while this worker leads. Each of their iterations first confirms
leadership with the backend (a round trip on the leader session), so a leader
that was frozen and deposed steps down on its first tick after waking instead
of sweeping beside its successor.

A new leader holds back reclaims for ``reclaim_grace``: after a database
outage longer than the lock lease every lease looks expired, and the
workers that are alive and still running those jobs need one heartbeat to
renew them before the sweep may judge them dead. So does a leader that stayed
elected through such an outage (its pool cut off, its election session not): from
its first sweep after one that failed for a grace or longer while a plain read did
not answer either. It reclaimed the jobs of live workers at once, and they ran twice.

The slotted loops (prune, archive expiry) run at their slots on the backend's clock
and record each run (``SupportsMaintenanceRuns``): a leader elected after a slot that
no leader ran (none elected at its time) runs it once at start, where it waited for
the next slot (a week for a weekly period); one another leader ran it does not.

An unexpected error in the election or one of these loops is logged and the loop
tries again at its next turn (``LeaderLoopErrors``): unlike a persistent one in the
worker's own loops, it does not end the worker (docs/adr/0008).

A leader whose sweep has failed transiently for a whole ``leader_lease``, and whose
pool then does not answer a plain read either (the database unreachable from this
worker: its pool cut off while its election session, a direct connection, still
answers), resigns and stays out of the election for another lease, so that a worker
that can reach the database takes over: before, it kept the lead, and no worker
promoted, reclaimed or fired cron for as long. A sweep that fails on a database
that answers (slow, a lock held) fails alike on every worker: the leader stays.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC, date, datetime, time, timedelta
from typing import Final, NamedTuple
from uuid import uuid4

import structlog

from taskq.backend._protocol import (
    LeaderElector,
    SupportsCron,
    SupportsFleetStats,
    SupportsLeaderElection,
    SupportsMaintenanceRuns,
    SupportsPrune,
    SupportsResultExpiry,
    SupportsStaleBatchSweep,
)
from taskq.worker._state import WorkerState
from taskq.worker._transient import LeaderLoopErrors, RepeatedWarning, transient_errors
from taskq.worker.maintenance import (
    archive_expiry_once,
    cron_once,
    expire_results_once,
    prune_once,
    queue_depth_once,
    stale_batches_once,
    stranded_jobs_once,
    sweep_once,
)

__all__ = ["MaintenanceLeader"]

_log = structlog.get_logger("taskq.leader")

Work = Callable[[], Awaitable[dict[str, int]]]

_SWEEP = "leader-sweep"
"""The loop whose failures, for a lease, make a leader resign: the most frequent, and
the one the fleet cannot do without (promotion, reclaims)."""


class _Slots(NamedTuple):
    """When a slotted loop runs: at ``at`` (a UTC time of day) and every period from
    there, on the backend's clock; ``runs`` records each run where the backend can."""

    at: time
    now: Callable[[], Awaitable[datetime]]
    runs: SupportsMaintenanceRuns | None


class _Loop(NamedTuple):
    """One leader loop: ``work`` every ``period`` seconds, or, given ``slots``, at each of
    its slots."""

    name: str
    period: float
    work: Work
    slots: _Slots | None = None


_FIRST_SLOT_DAY: Final = date(1970, 1, 5)
"""The day the slots of the daily loops are counted from (a Monday: a weekly period
runs on Mondays)."""


def _next_slot(
    now: datetime, at: time, period: timedelta, after: datetime | None = None
) -> datetime:
    """The first instant from ``now`` of the form ``at`` (UTC) on :data:`_FIRST_SLOT_DAY`
    plus a whole number of ``period``s (``at`` 03:00 and a day: 03:00 every day), later
    than ``after`` (the slot last run: a sleep that ends a little early must not run it
    twice). Not counted from the day of ``now``: a period longer than a day then came
    due a period after each election, and a fleet whose leader changed more often (a
    daily deploy) never ran a weekly one."""
    anchor = datetime.combine(_FIRST_SLOT_DAY, at, tzinfo=UTC)
    slot = anchor - (anchor - now) // period * period  # exact: the ceiling in whole periods
    while after is not None and slot <= after:
        slot += period
    return slot


def _last_slot(now: datetime, at: time, period: timedelta) -> datetime:
    """The latest slot at or before ``now`` (slots as in :func:`_next_slot`)."""
    anchor = datetime.combine(_FIRST_SLOT_DAY, at, tzinfo=UTC)
    return anchor + (now - anchor) // period * period


def _due_slot(now: datetime, at: time, period: timedelta, done: datetime) -> datetime:
    """The slot to run after ``done`` (the slot last run): the next one, or, when that
    has passed as well (no leader at its time, or a run longer than a period), the latest
    at ``now``: a missed run is caught up once, not once per slot missed."""
    return max(_next_slot(done, at, period, done), _last_slot(now, at, period))


class _Solo:
    """The elector of a backend that cannot elect: this worker leads alone."""

    async def try_acquire(self) -> bool:
        return True

    async def release(self) -> None:
        return None


class MaintenanceLeader:
    """Runs the election and, while elected, the maintenance loops (see module doc)."""

    def __init__(self, state: WorkerState) -> None:
        self.state = state
        backend = state.backend
        self.elector: LeaderElector = (
            backend.leader_elector(state.worker_id, lease=state.settings.leader_lease)
            if isinstance(backend, SupportsLeaderElection)
            else _Solo()
        )
        self.is_leader = asyncio.Event()
        """Set while this worker leads."""
        self._grace_from = 0.0
        """Loop time ``reclaim_grace`` counts from: the election, or the first sweep after
        the database was out of the sweep's reach."""
        self._unreached = False
        """Whether the sweep failed, for ``reclaim_grace`` or longer, on a database this
        worker's pool could not reach."""
        self._swept_at = 0.0
        """Loop time of the sweep's last turn that did its work (or of the election)."""
        self._abstain_until = 0.0
        """Loop time before which a resigned leader does not campaign."""
        self._confirm_lock = asyncio.Lock()
        self._confirmations = 0
        """Confirmations started so far (each under the lock)."""
        self._loops: list[_Loop] = []

    async def run(self) -> None:
        """Elect and lead until cancelled; steps down (releases the lease) on exit."""
        settings, backend = self.state.settings, self.state.backend
        self._loops = [
            _Loop(_SWEEP, settings.maintenance_interval.total_seconds(), self._sweep),
        ]
        if isinstance(backend, SupportsCron):
            cron_backend = backend
            self._loops.append(
                _Loop(
                    "leader-cron",
                    settings.cron_interval.total_seconds(),
                    lambda: cron_once(self.state, cron_backend),
                )
            )
        if isinstance(backend, SupportsResultExpiry):
            expiry_backend = backend
            self._loops.append(
                _Loop(
                    "leader-result-expiry",
                    settings.result_expiry_interval.total_seconds(),
                    lambda: expire_results_once(expiry_backend),
                )
            )
        if isinstance(backend, SupportsStaleBatchSweep):
            batch_backend = backend
            self._loops.append(
                _Loop(
                    "leader-stale-batches",
                    settings.stale_batch_interval.total_seconds(),
                    lambda: stale_batches_once(batch_backend),
                )
            )
        if isinstance(backend, SupportsFleetStats):
            stats_backend = backend
            self._loops += [
                _Loop(
                    "leader-queue-depth",
                    settings.queue_depth_interval.total_seconds(),
                    lambda: queue_depth_once(stats_backend),
                ),
                _Loop(
                    "leader-stranded-jobs",
                    settings.stranded_check_interval.total_seconds(),
                    lambda: stranded_jobs_once(stats_backend),
                ),
            ]
        if isinstance(backend, SupportsPrune):
            prune_backend = backend
            runs = backend if isinstance(backend, SupportsMaintenanceRuns) else None
            self._loops += [
                _Loop(
                    "leader-prune",
                    settings.prune_interval.total_seconds(),
                    lambda: prune_once(self.state, prune_backend),
                    _Slots(settings.prune_at, prune_backend.now, runs),
                ),
                _Loop(
                    "leader-archive-expiry",
                    settings.archive_expiry_interval.total_seconds(),
                    lambda: archive_expiry_once(self.state, prune_backend),
                    _Slots(settings.archive_expiry_at, prune_backend.now, runs),
                ),
            ]
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self._election_loop(), name="taskq-leader-election")
                for loop in self._loops:
                    group.create_task(self._gated(loop), name=f"taskq-{loop.name}")
        finally:
            # Shielded: a cancelled worker still hands leadership over at once.
            await asyncio.shield(self._step_down())

    async def confirm(self) -> bool:
        """Ask the backend whether this worker leads (acquiring when free).

        A caller that waited while another confirmation started and ended takes its
        answer (given after this call began, so as fresh as its own): in an outage
        each confirmation runs to its timeout, and the leader loops asking one after
        the other kept the election loop waiting for all of them, past its
        stale-tick budget."""
        asked = self._confirmations
        async with self._confirm_lock:
            if self._confirmations != asked:
                return self.is_leader.is_set()
            self._confirmations += 1
            if asyncio.get_running_loop().time() < self._abstain_until:
                return False
            try:
                leading = await self.elector.try_acquire()
            except asyncio.CancelledError:
                raise  # the worker is stopping: the step-down settles leadership
            except BaseException:
                self._set_leading(False)
                raise
            self._set_leading(leading)
            return leading

    def _set_leading(self, leading: bool) -> None:
        if leading == self.is_leader.is_set():
            return
        wid = str(self.state.worker_id)
        if leading:
            self._grace_from = self._swept_at = asyncio.get_running_loop().time()
            self._unreached = False
            self.is_leader.set()
            _log.info("taskq.leader-elected", worker_id=wid)
            return
        self._follow()
        _log.warning("taskq.leader-lost", worker_id=wid)

    def _follow(self) -> None:
        self.is_leader.clear()
        for loop in self._loops:
            self.state.liveness.forget(loop.name)

    async def _resign(self, error: BaseException) -> None:
        """Hand the lead over: this worker cannot do the leader's work (see module doc)."""
        lease = self.state.settings.leader_lease.total_seconds()
        async with self._confirm_lock:
            if not self.is_leader.is_set():
                return
            self._abstain_until = asyncio.get_running_loop().time() + lease
            self._follow()
            _log.warning(
                "taskq.leader-resigned",
                worker_id=str(self.state.worker_id),
                error=repr(error),
                hint=f"this worker's sweep failed for a leader_lease or longer: it stays out "
                f"of the election for {lease:g}s, so that a worker that can reach the "
                f"database leads",
            )
            try:
                await self.elector.release()
            except Exception as exc:  # noqa: BLE001 - its session is likely gone with its lock
                _log.warning("taskq.leader-release-failed", error=repr(exc))

    async def _step_down(self) -> None:
        async with self._confirm_lock:
            try:
                await self.elector.release()
            finally:
                if self.is_leader.is_set():
                    self.is_leader.clear()
                    _log.info("taskq.leader-stepped-down", worker_id=str(self.state.worker_id))

    async def _election_loop(self) -> None:
        guard = LeaderLoopErrors(
            "leader-election",
            hint="this worker's election fails at every try and keeps trying; it runs jobs "
            "but leads nothing (another worker may): fix the cause in the traceback",
        )
        failing = RepeatedWarning("taskq.leader-election-transient-error")
        transient = transient_errors()
        period = self.state.settings.heartbeat_interval.total_seconds()
        while True:
            try:
                await self.confirm()
            except transient as exc:
                failing.failed(exc)
            except Exception as exc:  # noqa: BLE001 - logged, never ends the worker
                guard.failed(exc)
            else:
                failing.ok()
                guard.succeeded()
            self.state.liveness.tick("leader-election", period)
            await asyncio.sleep(period)

    async def _gated(self, loop: _Loop) -> None:
        name, period, work = loop.name, loop.period, loop.work
        guard = LeaderLoopErrors(name)
        failing = RepeatedWarning("taskq.leader-loop-transient-error", loop=name)
        transient = transient_errors()  # the bound's TimeoutError among them (core's)
        last_slot: datetime | None = None
        """A slotted loop's slot last run (or whose run failed), as far as this worker knows."""
        awaited: datetime | None = None
        """The slot a slotted loop last slept for (one due at once is a missed one)."""
        # An iteration of a frequent loop is bounded as a whole, not only statement by
        # statement: on a slow but healthy database its several statements, each well
        # inside the timeout, added up past the stale-tick budget, and the watchdog took
        # the worker down. The daily ones (prune, archive expiry) run long on purpose.
        bound = None if loop.slots is not None else self.state.settings.dispatcher_command_timeout
        clock = asyncio.get_running_loop()
        retry = self.state.settings.maintenance_interval.total_seconds()
        runs = loop.slots.runs if loop.slots is not None else None
        while True:
            await self.is_leader.wait()
            ran = False  # a turn that lost the leadership did no work: no recovery
            slot: datetime | None = None
            # A slotted loop that could not tell its next slot asks again soon.
            pause = period if loop.slots is None else retry
            try:
                began = clock.time()
                moved = {}
                due = True
                if loop.slots is not None:
                    last_slot, slot, pause = await self._next_run(
                        loop.slots, name, timedelta(seconds=period), last_slot
                    )
                    due = pause <= 0
                    if due and slot != awaited:
                        _log.info("taskq.leader-slot-caught-up", loop=name, slot=slot.isoformat())
                    awaited = slot
                if due and await self.confirm():
                    ran = True
                    if slot is not None:
                        last_slot = slot  # a failed run waits for the next slot
                    if bound is None:
                        # Not a stalled loop while it runs: a prune takes as long as its
                        # backlog (each statement bounded), past any multiple of an
                        # hourly interval, and the stale-tick watchdog ended the leader.
                        self.state.liveness.forget(name)
                        moved = await work()
                    else:
                        # What the confirmation left of the bound, and a floor at least.
                        left = bound.total_seconds() - (clock.time() - began)
                        least = self.state.settings.leader_work_floor.total_seconds()
                        async with asyncio.timeout(max(left, least)):
                            moved = await work()
                    if (
                        slot is not None
                        and runs is not None
                        and not await runs.record_maintenance_run(name, slot)
                    ):
                        _log.warning(
                            "taskq.leader-slot-ran-twice",
                            loop=name,
                            slot=slot.isoformat(),
                            hint="another leader recorded this slot's run meanwhile: two "
                            "leaders overlapped (one frozen past its lease as it began)",
                        )
            except transient as exc:
                failing.failed(exc)
                if name == _SWEEP and (
                    self._stalled() or self._silent_for(self.state.settings.reclaim_grace)
                ):
                    # The turn ended within its bound; the probe may take as long again,
                    # and the two together overran the stale-tick budget the settings size
                    # for one (the watchdog ended the leader in a black hole).
                    self.state.liveness.tick(name, period)
                    if not await self._pool_answers():
                        self._unreached = True
                        if self._stalled():
                            await self._resign(exc)
            except Exception as exc:  # noqa: BLE001 - logged, never ends the worker
                guard.failed(exc)
            else:
                failing.ok()
                if ran:
                    guard.succeeded()
                    if name == _SWEEP:
                        self._swept_at = clock.time()
                if any(moved.values()):
                    _log.info("taskq.leader-swept", loop=name, **moved)
            if self.is_leader.is_set():
                self.state.liveness.tick(name, period)
            await asyncio.sleep(max(pause, 0.0))

    async def _next_run(
        self, slots: _Slots, name: str, period: timedelta, done: datetime | None
    ) -> tuple[datetime, datetime, float]:
        """For the slotted loop ``name``: the slot last run (``done`` or the record's,
        whichever is later), the slot to run next and the seconds until it (none left:
        due now).

        The backend's clock decides, and the record of the runs (where the backend keeps
        one) tells a new leader which slot no leader ran: it runs that one at once, where
        it waited for the next (a week for a weekly period), and not one another leader
        ran. With neither record nor run, the latest slot counts as run: nothing tells
        whether it was missed."""
        now = await slots.now()
        recorded = None
        if slots.runs is not None:
            recorded = await slots.runs.last_maintenance_run(name)
        known = [slot for slot in (done, recorded) if slot is not None]
        done = max(known) if known else _last_slot(now, slots.at, period)
        slot = _due_slot(now, slots.at, period, done)
        return done, slot, (slot - now).total_seconds()

    async def _pool_answers(self) -> bool:
        """Whether a plain read (a job by an id no job has) answers within the bound:
        then the sweep fails on a reachable database (slow, a row or table held, a
        lock timeout), alike on every worker, and no other leader would do better. The
        stall is then counted afresh."""
        try:
            bound = self.state.settings.dispatcher_command_timeout.total_seconds()
            async with asyncio.timeout(bound):
                await self.state.backend.get(uuid4())
        except Exception:  # noqa: BLE001 - whatever it was, the database did not answer
            return False
        self._swept_at = asyncio.get_running_loop().time()
        return True

    def _stalled(self) -> bool:
        """Whether this leader's sweep has done no work for a whole ``leader_lease`` (and
        three of its periods, should they be longer: one failed turn is no stall)."""
        settings = self.state.settings
        # A worker that cannot elect leads alone: resigning would leave nobody.
        return not isinstance(self.elector, _Solo) and self._silent_for(
            max(settings.leader_lease, 3 * settings.maintenance_interval)
        )

    def _silent_for(self, span: timedelta) -> bool:
        """Whether this leader's sweep has done no work for ``span``."""
        return (
            self.is_leader.is_set()
            and asyncio.get_running_loop().time() - self._swept_at >= span.total_seconds()
        )

    async def _sweep(self) -> dict[str, int]:
        grace = self.state.settings.reclaim_grace.total_seconds()
        clock = asyncio.get_running_loop()
        if self._unreached:
            # The workers could not renew their leases while the database was away
            # either: a grace as at an election (the next failure to reach it counts
            # the grace again).
            self._unreached, self._grace_from = False, clock.time()
        reclaim = clock.time() - self._grace_from >= grace
        return await sweep_once(self.state, reclaim=reclaim)
