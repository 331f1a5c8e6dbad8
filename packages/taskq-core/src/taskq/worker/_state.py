"""What the worker's loops share: the jobs this process holds and its signals."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from uuid import UUID

from taskq._di import Containers, LoopScope, ProcessScope, ProviderRegistry, ThreadScope
from taskq._scope import Scope
from taskq.actor import Actor
from taskq.backend import Backend, CancelPhase, SupportsBatchedSuccess
from taskq.backend._protocol import SupportsWorkerRegistry
from taskq.client import JobsClient
from taskq.context import Context
from taskq.models import ErrorInfo, JobRow
from taskq.settings import WorkerSettings
from taskq.worker._liveness import LoopLiveness
from taskq.worker.completer import Completer
from taskq.worker.prefetch import Prefetch

if TYPE_CHECKING:
    from taskq.worker.cancel import CancelController


@dataclass
class ActiveJob:
    """A job this worker locked: queued locally, then executing."""

    row: JobRow
    held_at: float = 0.0
    """Loop time (monotonic) when the dispatch handed the job to this worker: the wait
    for a slot here (prefetch) comes out of its deadline."""
    lease_from: float = 0.0
    """Loop time at or before which the database last set this job's lease: when the
    dispatch that locked it, or the last heartbeat renewal that covered it, was sent
    (the lease fence counts from here)."""
    taken_at: float | None = None
    """Loop time when a consumer took the job (None while it waits for one)."""
    ctx: Context | None = None
    task: asyncio.Task[None] | None = None
    release: Callable[[], None] | None = None
    """Set when the job starts; called once when it lets go of its slot (then None):
    the task ended, or the job was abandoned or handed back while its task refused
    to stop."""
    ran: asyncio.Future[None] | None = None
    """Resolved when the consumer may take another job: the actor returned (its
    outcome is being written), or the slot was freed."""
    # Made only for those who wait (shutdown): a future per job is a loop turn per job.
    _freed: asyncio.Future[None] | None = field(default=None, init=False, repr=False)
    limit_at: float | None = None
    """Loop time when the attempt's limit (its timeout, or its deadline) runs out. Still
    running a cleanup grace past it, the actor ignored the limit's cancellation (or a
    sync actor's thread runs on): the worker fails the attempt with ``limit_error``,
    not retried, and frees its slot."""
    limit_error: ErrorInfo | None = None
    """What the attempt fails with when it runs past ``limit_at``."""
    cancel_requested: bool = False
    """A user asked to cancel this job."""
    cancel_phase: CancelPhase = CancelPhase.NONE
    cancel_observed_at: float | None = None
    """Loop time (monotonic) when this worker first saw the cancel request."""
    cancel_forced_at: float | None = None
    """Loop time when the job's task was cancelled for the request (phase 2): its
    cleanup grace runs from then, however late the escalation's write landed."""
    interrupted: bool = False
    """Shutdown stopped it: hand it back for another attempt, not cancelled."""
    lost: bool = False
    """The lock was lost (reclaimed elsewhere): never write this job's outcome."""
    fenced: bool = False
    """The lease fence stopped it (its lease could not be renewed): the attempt is
    written failed with ``LeaseLost``."""
    returned: bool = False
    """The actor returned (or the job will not start): what is left, its dependencies'
    teardown (a transaction's commit) and its outcome write, is the finished work's,
    which nothing that stops running code (a cancel, a stop, the fence, a limit) may
    cut short."""
    ended: bool = False
    """An end of this attempt written by this worker landed: the cancel controller's
    write-off or abandonment, the stop's abandonment, or its hand-back of the job
    interrupted. Another of them, under way at the same time and refused, is that end:
    neither a late outcome nor a second apply of its batch hook."""
    settling: bool = False
    """The actor finished and its outcome is being written: a lease not renewed
    meanwhile is that write, not a loss; its slot counts as free."""

    def settle(self) -> None:
        """The actor returned: only its outcome write is left (idempotent)."""
        self.returned = self.settling = True
        if self.ran is not None and not self.ran.done():
            self.ran.set_result(None)

    @property
    def holds_slot(self) -> bool:
        """Started, and its slot not yet freed."""
        return self.release is not None

    def slot_freed(self) -> asyncio.Future[None]:
        """Resolved once the job has let go of its slot (already, if it has or never
        started)."""
        if self._freed is None:
            self._freed = asyncio.get_running_loop().create_future()
            if self.release is None:
                self._freed.set_result(None)
        return self._freed

    def finish(self) -> None:
        """Free the job's slot (idempotent)."""
        release, self.release = self.release, None
        if release is not None:
            release()
            if self._freed is not None and not self._freed.done():
                self._freed.set_result(None)
        if self.ran is not None and not self.ran.done():
            self.ran.set_result(None)


@dataclass
class WorkerState:
    """Shared by the producer, consumers, heartbeat and maintenance loops."""

    worker_id: UUID
    settings: WorkerSettings
    backend: Backend
    actors: Mapping[str, Actor[..., Any]]
    providers: ProviderRegistry
    client: JobsClient
    executor: ThreadPoolExecutor
    active: dict[UUID, ActiveJob] = field(default_factory=dict)
    queue: asyncio.Queue[JobRow | None] = field(default_factory=asyncio.Queue)
    """Locally held jobs in dispatch order; None tells a consumer to finish."""
    slot_freed: asyncio.Event = field(default_factory=asyncio.Event)
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when dispatch must stop (shutdown requested, or idle in --until-idle)."""
    finished: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once every consumer is done; the background loops then exit."""
    process_scope: ProcessScope = field(default_factory=ProcessScope)
    thread_scope: ThreadScope = field(default_factory=ThreadScope)
    loop_scope: LoopScope = field(default_factory=LoopScope)
    processed: int = 0
    liveness: LoopLiveness = field(default_factory=LoopLiveness)
    job_tasks: set[asyncio.Task[None]] = field(default_factory=set)
    """Every job task not yet finished, including abandoned ones still running."""
    shutdown_phase: int = 0
    """A ``ShutdownPhase`` value; 0 while running normally."""
    gated_queues: frozenset[str] = frozenset()
    """Queues with a ``max_concurrent`` of their own (the application's configuration)."""
    gate_opened: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when a job that may have held others back ended (its actor or queue capped,
    or an identity of its own): a dispatch that found nothing may find them now."""
    unheard_suspected: bool = False
    """The backend may hold jobs for this worker that it never heard of (a dispatch
    failed, or a heartbeat renewed more jobs than it knows): the producer checks,
    between two dispatches, and hands them back."""
    unconfirmed_at_stop: int = 0
    """Jobs whose hand-back or outcome the stop could not confirm (the database away):
    left to the lease and the reclaim, which spends an attempt of each."""
    met_unknown_actor: bool = False
    """A job of an actor this application does not know was handed back (--until-idle
    then checks whether only such jobs are left, which it would bounce forever)."""
    prefetch: Prefetch = field(init=False)
    cancel: CancelController = field(init=False)
    completer: Completer | None = field(init=False)
    """Batches success writes; None when the backend can only write them one by one."""

    def __post_init__(self) -> None:
        from taskq.worker.cancel import make_cancel_controller

        settings = self.settings
        fixed = None if settings.prefetch == "auto" else settings.prefetch
        horizon = settings.prefetch_horizon.total_seconds()
        self.prefetch = Prefetch(settings.concurrency, fixed, horizon)
        self.cancel = make_cancel_controller(self)
        self.completer = (
            Completer(
                self.backend,
                self.worker_id,
                fallback_result_ttl=self.settings.fallback_result_ttl,
                window=self.settings.completion_window,
            )
            if isinstance(self.backend, SupportsBatchedSuccess)
            else None
        )

    def free_slots(self) -> int:
        """Jobs the producer may lock now: ``concurrency`` plus those to lock ahead
        (:attr:`prefetch`), less the jobs held.

        A job whose actor returned and whose outcome is still being written
        (settling) holds its lock but not a consumer, so up to ``concurrency``
        of them do not count: the next jobs are dispatched and run while the
        completer writes, instead of after it.
        """
        settling = 0
        if self.prefetch.adaptive:
            now = asyncio.get_running_loop().time()
            running: list[float] = []
            for active in self.active.values():
                if active.settling:
                    settling += 1
                elif active.taken_at is not None:
                    running.append(now - active.taken_at)
            ahead = self.prefetch.ahead(running)
        else:
            settling = sum(1 for active in self.active.values() if active.settling)
            ahead = self.prefetch.ahead()
        concurrency = self.settings.concurrency
        return concurrency + ahead - len(self.active) + min(settling, concurrency)

    def stale_ahead(self, waited: float) -> tuple[list[ActiveJob], float | None]:
        """The jobs locked ahead (waiting while every consumer is busy) that have waited
        ``waited`` seconds or more; and in how many seconds the next of the others will
        have (None: no other waits)."""
        now = asyncio.get_running_loop().time()
        waiting: list[ActiveJob] = []
        busy = 0
        for active in self.active.values():
            if active.settling or active.lost:
                continue
            if active.taken_at is None:
                waiting.append(active)
            else:
                busy += 1
        # The oldest waiting jobs are the free consumers' at their next turn, not locked
        # ahead: counted stale (at once, with a horizon of 0), each was handed back before
        # its consumer could take it, locked again, and none ever ran.
        waiting.sort(key=lambda active: active.held_at)
        stale: list[ActiveJob] = []
        soonest: float | None = None
        for active in waiting[max(self.settings.concurrency - busy, 0) :]:
            left = active.held_at + waited - now
            if left <= 0:
                stale.append(active)
            elif soonest is None or left < soonest:
                soonest = left
        return stale, soonest

    def settle(self, active: ActiveJob) -> None:
        """Mark ``active`` as settling and let the producer use the consumer it left."""
        active.settle()
        self.slot_freed.set()

    async def register(self) -> None:
        """Write this worker's registry row (hostname, pid, queues, the actors it runs),
        when the backend keeps a registry: at start-up, and again if the row was swept
        meanwhile. The leader's stranded-jobs detector reads the actors."""
        if isinstance(self.backend, SupportsWorkerRegistry):
            await self.backend.register_worker(
                self.worker_id,
                socket.gethostname(),
                os.getpid(),
                list(self.settings.queues),
                actors=sorted(self.actors),
            )

    def containers(self) -> Containers:
        return {
            Scope.PROCESS: self.process_scope,
            Scope.THREAD: self.thread_scope,
            Scope.LOOP: self.loop_scope.current(),
        }

    def hold(self, row: JobRow, lease_from: float) -> None:
        """Track a freshly dispatched job and queue it for a consumer (``lease_from``:
        the loop time its dispatch was sent).

        A job reclaimed and dispatched again to this same worker may still
        have its old attempt running here: that attempt is lost, so it is
        cancelled and can never write over the new one.
        """
        previous = self.active.get(row.id)
        if previous is not None:
            previous.lost = True
            if previous.task is not None:
                previous.task.cancel()
        self.active[row.id] = ActiveJob(row, asyncio.get_running_loop().time(), lease_from)
        self.queue.put_nowait(row)

    def release(self, job_id: UUID, active: ActiveJob) -> None:
        """Forget a job (done or lost) and let the producer fill the slot."""
        if self.active.get(job_id) is active:
            del self.active[job_id]
        self.slot_freed.set()
        if self._held_back_others(active.row):
            self.gate_opened.set()

    def _held_back_others(self, row: JobRow) -> bool:
        """Whether ``row``, running, may have kept other jobs from being dispatched: nothing
        wakes the dispatchers when it ends (no enqueue), so this worker looks at once
        rather than at its next poll (such jobs drained one per poll interval)."""
        if row.identity_key is not None or row.queue in self.gated_queues:
            return True
        actor = self.actors.get(row.actor)
        return actor is not None and actor.options.max_concurrent is not None
