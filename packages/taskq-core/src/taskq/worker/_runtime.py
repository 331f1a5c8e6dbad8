"""``Worker``: one process's TaskGroup of producer, consumers and background loops."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import AsyncExitStack, asynccontextmanager
from typing import TYPE_CHECKING, Any
from uuid import UUID, uuid4

import structlog

from taskq._di import ActorSpec, bootstrap
from taskq._dsn import redact
from taskq.backend import SupportsCredentialReload, check_protocol_keywords
from taskq.backend._protocol import SupportsWorkerRegistry
from taskq.models import ActorConfig
from taskq.settings import WorkerSettings
from taskq.worker._liveness import LoopLiveness
from taskq.worker._state import WorkerState
from taskq.worker._sync_pool import SyncActorPool
from taskq.worker._transient import transient_errors
from taskq.worker._watchdog import (
    LoopLagWatchdog,
    ShutdownWatchdog,
    guard_sibling,
    stale_tick_loop,
)
from taskq.worker.consumer import consumer_loop
from taskq.worker.drain import drain_monitor_loop
from taskq.worker.fence import lease_fence_loop
from taskq.worker.health import HealthServer, StartupProgress
from taskq.worker.heartbeat import heartbeat_loop
from taskq.worker.leader import MaintenanceLeader
from taskq.worker.maintenance import MOST_LOGGED
from taskq.worker.producer import producer_loop
from taskq.worker.shutdown import orchestrate_shutdown

if TYPE_CHECKING:
    from taskq.app import TaskQ

__all__ = ["Worker"]

_log = structlog.get_logger("taskq.worker")


class Worker:
    """Runs an application's actors until stopped (or idle with ``until_idle``).

    The application's backend must already be open (``async with tq:``). Before its
    first job, and before its loop-lag watchdog starts, it creates the shared DI values
    its actors need (``eager_dependencies``); a provider that raises then fails
    :meth:`run` with a :class:`ConfigurationError` naming it, and no job is taken. A
    given ``worker_id`` must be this worker's alone while it runs: the jobs are locked
    to it, and two workers sharing one take each other's jobs for lost replies and
    hand them back, running them again and again.
    """

    def __init__(
        self, app: TaskQ, settings: WorkerSettings, *, worker_id: UUID | None = None
    ) -> None:
        self.app = app
        if "queues" not in settings.model_fields_set:
            # Unless told, work every queue the app's actors are on, and those it
            # configures (as Dramatiq's workers do): with "default" alone,
            # `taskq-worker app:tq` left the jobs of an actor on another queue pending,
            # and said nothing. "default" stays, for jobs enqueued there by name.
            queues = {"default"} | {a.options.queue for a in app.actors.values()}
            queues |= {config.queue for config in app.queues}
            settings = settings.model_copy(update={"queues": sorted(queues)})
        self.settings = settings
        self.worker_id = worker_id or uuid4()
        self._state: WorkerState | None = None
        self._executor: SyncActorPool | None = None
        self._stop_requested = asyncio.Event()
        self._stop_requested_at: float | None = None
        self._escalate = asyncio.Event()
        self._reload = asyncio.Event()
        self.reloads = 0
        """Credential reloads completed (SIGHUP)."""
        self._shutdown_watchdog = ShutdownWatchdog(
            settings.termination_grace_period.total_seconds(),
            dump_interval=settings.watchdog_dump_interval.total_seconds(),
            dump_after_fraction=settings.watchdog_dump_after_fraction,
        )
        self.health: HealthServer | None = None
        """The health server while running (or starting: :meth:`health_served`), when
        ``health_port`` is set."""
        self.startup = StartupProgress()
        """What ``/readyz`` reports until :meth:`run` runs: the caller's attempts to reach
        the backend (``taskq-worker`` waiting for its database)."""

    @property
    def processed(self) -> int:
        """Attempts this worker ended so far, whatever their outcome (a job retried
        counts once per attempt; a hand-back or a cancelled attempt counts too)."""
        return self._state.processed if self._state else 0

    @property
    def unconfirmed_at_stop(self) -> int:
        """Jobs whose hand-back or outcome the last stop could not confirm (the database
        away): left to the lease and the reclaim, which spends an attempt of each."""
        return self._state.unconfirmed_at_stop if self._state else 0

    def stop(self) -> None:
        """Shut down gracefully (the first SIGTERM): see :mod:`taskq.worker.shutdown`."""
        if not self._stop_requested.is_set():
            self._stop_requested_at = time.monotonic()
            self._arm_shutdown_watchdog()  # anchored on the first signal
        self._stop_requested.set()
        if self._state is not None:
            self._state.stopping.set()

    async def stop_requested(self) -> None:
        """Return once :meth:`stop` was called (at once if it was)."""
        await self._stop_requested.wait()

    def _arm_shutdown_watchdog(self) -> None:
        """Bound the stop from here on (idempotent): a signal's, an ``--until-idle``
        worker's end, or a crash's teardown, whichever comes first."""
        if self.settings.watchdog_enabled:
            self._shutdown_watchdog.arm()

    def reload(self) -> None:
        """Reload credentials (SIGHUP). Requests during a reload coalesce into one
        follow-up reload."""
        self._reload.set()

    def escalate(self) -> None:
        """Skip the remaining drain and cooperative waits (the second SIGTERM)."""
        self._escalate.set()

    def lingering_tasks(self) -> list[asyncio.Task[None]]:
        """Job tasks that ignored cancellation and still run after :meth:`run` returned."""
        if self._state is None:
            return []
        return [task for task in self._state.job_tasks if not task.done()]

    def lingering_threads(self) -> int:
        """Sync actor calls still running in their threads after :meth:`run` returned
        (a thread cannot be cancelled; its job was handed back or abandoned)."""
        return 0 if self._executor is None else self._executor.running

    @asynccontextmanager
    async def health_served(self) -> AsyncIterator[None]:
        """Serve the health routes (when ``health_port`` is set) from now, before
        :meth:`run`: a caller that first waits for its backend answers probes meanwhile,
        ``/healthz`` alive and ``/readyz`` not ready, saying why (:attr:`startup`). A port
        already taken is a :class:`ConfigurationError` at once. :meth:`run` inside the
        block serves on and closes the server when it ends, as without the block; the
        block's end closes it if :meth:`run` did not (it never ran, or failed first)."""
        await self._start_health()
        try:
            yield
        finally:
            await self._close_health()

    async def _start_health(self) -> None:
        if self.settings.health_port is None or (self.health and self.health.serving):
            return
        health = HealthServer(
            self.settings.health_host,
            self.settings.health_port,
            tasks_enabled=self.settings.health_tasks_enabled,
            startup=self.startup,
        )
        await health.start()
        self.health = health

    async def _close_health(self) -> None:
        if self.health is not None:
            await self.health.close()

    async def _prepare(self) -> None:
        backend = self.app.backend
        # Here, not at the first stop or sweep that passes batch_ends: a TypeError there
        # left prefetched jobs locked. open_backend checked one built from a URL, not one
        # given as an instance.
        check_protocol_keywords(backend)
        actors = self.app.actors
        self.app.providers.validate(
            actors={name: ActorSpec(a.fn, a.passthrough) for name, a in actors.items()}
        )
        await backend.register_actors(
            [
                ActorConfig(
                    actor=a.name,
                    max_concurrent=a.options.max_concurrent,
                    max_pending=a.options.max_pending,
                    queue=a.options.queue,
                    job_defaults=a.options.job_defaults(),
                )
                for a in actors.values()
            ]
        )
        for queue in self.app.queues:
            await backend.configure_queue(queue)

    async def _bootstrap(self, state: WorkerState) -> None:
        """Create the shared values of the actors this worker runs (``eager_dependencies``).

        The actors on its queues: those of others' queues come here only when enqueued
        on one of these by name, and get theirs at first use. A provider that raises
        stops the start (:meth:`_abandon_start`), and no job was taken."""
        if not self.settings.eager_dependencies:
            return
        queues = set(self.settings.queues)
        actors = {
            name: ActorSpec(a.fn, a.passthrough)
            for name, a in self.app.actors.items()
            if a.options.queue in queues
        }
        self.startup.bootstrapping()
        await bootstrap(state.providers, actors, state.containers(), stopping=state.stopping)

    async def _abandon_start(self, state: WorkerState, executor: SyncActorPool) -> None:
        """Undo a start that failed before the worker ran (a provider that raised, the
        registry row refused): the values its bootstrap created are torn down as at a
        stop (each teardown logs its own failure and the rest run): LOOP, the pool (no
        thread started yet), THREAD (the loop thread's), PROCESS; then the health
        server."""
        try:
            await _close_scopes(state, executor)
        finally:
            await self._close_health()

    async def run(self, *, disarm_when_done: bool = True) -> None:
        """Work until :meth:`stop` (or idleness with ``until_idle``).

        A stop (a signal's, the end of ``until_idle``, or a crash's teardown) arms the
        shutdown watchdog (``termination_grace_period``), which stays
        armed through the teardown here (DI scopes run user code) and, with
        ``disarm_when_done=False``, until :meth:`shutdown_done`: the CLI keeps it armed
        while the application closes the backend, so no step of a stop can hang."""
        await self._prepare()
        settings = self.settings
        executor = self._executor = SyncActorPool()
        state = WorkerState(
            worker_id=self.worker_id,
            settings=settings,
            backend=self.app.backend,
            actors=self.app.actors,
            providers=self.app.providers,
            client=self.app.client,
            executor=executor,
            liveness=LoopLiveness(
                settings.watchdog_tick_grace_factor, settings.watchdog_stale_floor.total_seconds()
            ),
            gated_queues=frozenset(q.queue for q in self.app.queues if q.max_concurrent),
        )
        self._state = state
        if self._stop_requested.is_set():
            state.stopping.set()
        # Before registering: a port already taken stops the start with nothing to undo.
        await self._start_health()  # serving already, in health_served()
        # Before the worker says it runs (its registry row, /readyz), takes a job or
        # starts the loop-lag watchdog, however long its providers take.
        try:
            await self._bootstrap(state)
            self.startup.registering_worker()
            await state.register()
        except BaseException:
            await self._abandon_start(state, executor)
            # A stop during the start armed the shutdown watchdog: left armed, it would
            # end the process hosting this worker (a test run, an application) later.
            if disarm_when_done:
                self.shutdown_done()
            raise
        _log.info(
            "taskq.worker-started",
            worker_id=str(self.worker_id),
            backend=redact(self.app.url),
            schema=self.app.schema,
            # At most MOST_LOGGED of each: 2,000 actors made a 42 KB line, which log
            # shippers split (Docker at 16 KB).
            queues=settings.queues[:MOST_LOGGED],
            queues_not_shown=max(len(settings.queues) - MOST_LOGGED, 0),
            concurrency=settings.concurrency,
            actors=sorted(self.app.actors)[:MOST_LOGGED],
            actors_not_shown=max(len(self.app.actors) - MOST_LOGGED, 0),
        )
        waits = settings.stop_waits
        graces = (
            settings.drain_grace_period,
            settings.cancellation_grace_period,
            settings.cleanup_grace_period,
        )
        if waits != graces:
            _log.warning(
                "taskq.stop-graces-shortened",
                termination_grace_period=settings.termination_grace_period.total_seconds(),
                drain_cancellation_cleanup=[round(w.total_seconds(), 3) for w in waits],
                hint="the drain, cancellation and cleanup graces do not fit in "
                "TASKQ_TERMINATION_GRACE_PERIOD with room for the end of a stop; a stop "
                "shortens them to these: raise it, or shorten the graces",
            )
        lag_watchdog: LoopLagWatchdog | None = None
        if settings.watchdog_enabled:
            lag_watchdog = LoopLagWatchdog(
                asyncio.get_running_loop(),
                state.liveness,
                budget=settings.loop_lag_budget.total_seconds(),
                startup_grace=settings.watchdog_loop_lag_startup_grace.total_seconds(),
                check_interval=settings.watchdog_check_interval.total_seconds(),
            )
            lag_watchdog.start()

        def sibling(
            name: str, run: Callable[[], Coroutine[Any, Any, None]]
        ) -> Coroutine[Any, Any, None]:
            return guard_sibling(
                name, run, state.stopping.is_set, exits=settings.watchdog_enabled
            )()

        try:
            async with asyncio.TaskGroup() as group:
                background = [
                    group.create_task(
                        sibling("heartbeat", lambda: heartbeat_loop(state)), name="taskq-heartbeat"
                    ),
                    group.create_task(
                        sibling("maintenance-leader", MaintenanceLeader(state).run),
                        name="taskq-maintenance-leader",
                    ),
                ]
                background.append(
                    group.create_task(
                        sibling("credential-reload", self._reload_loop), name="taskq-reload"
                    )
                )
                if settings.lease_fence:
                    background.append(
                        group.create_task(
                            sibling("lease-fence", lambda: lease_fence_loop(state)),
                            name="taskq-lease-fence",
                        )
                    )
                if settings.watchdog_enabled:
                    background.append(
                        group.create_task(
                            stale_tick_loop(
                                state.liveness, settings.watchdog_check_interval.total_seconds()
                            ),
                            name="taskq-stale-tick-watchdog",
                        )
                    )
                if settings.until_idle:
                    background.append(
                        group.create_task(drain_monitor_loop(state), name="taskq-drain-monitor")
                    )
                workers = [
                    group.create_task(
                        sibling("producer", lambda: producer_loop(state)), name="taskq-producer"
                    )
                ]
                workers += [
                    group.create_task(
                        sibling("consumer", lambda: consumer_loop(state)),
                        name=f"taskq-consumer-{i}",
                    )
                    for i in range(settings.concurrency)
                ]
                if self.health is not None:
                    # Ready once the loops that take jobs exist: before, /readyz said
                    # ready while the worker was still registering.
                    self.health.attach(state)
                group.create_task(self._supervise(state, workers, background), name="taskq-stop")
            # Only on a clean stop: a worker that crashed out of its TaskGroup keeps its
            # row until the leader's stale-worker sweep, like a killed one.
            registry = state.backend
            if isinstance(registry, SupportsWorkerRegistry):
                try:
                    await registry.deregister_worker(self.worker_id)
                except transient_errors() as exc:
                    # The stop itself succeeded; the sweep removes the row later.
                    _log.warning("taskq.worker-deregister-failed", error=repr(exc))
        finally:
            crashed = sys.exc_info()[1]
            if crashed is not None and not isinstance(crashed, asyncio.CancelledError):
                # A crashed TaskGroup's teardown too; not a run() its host cancelled: a
                # watchdog armed then could end the host process later.
                self._arm_shutdown_watchdog()
            try:
                if lag_watchdog is not None:
                    lag_watchdog.stop()
                await self._close_health()
                if state.completer is not None:
                    await state.completer.aclose()
                await _close_scopes(state, executor)
                _log.info(
                    "taskq.worker-stopped", worker_id=str(self.worker_id), processed=state.processed
                )
            finally:
                # Also when a step raised: a watchdog left armed would end the
                # process hosting this worker (a test run, an application) later.
                if disarm_when_done:
                    self.shutdown_done()

    def shutdown_done(self) -> None:
        """The whole stop finished: disarm the shutdown watchdog."""
        self._shutdown_watchdog.disarm()

    async def _reload_loop(self) -> None:
        """Event-driven: one reload per burst of requests (a request arriving during a
        reload sets the event again, so exactly one follow-up reload runs)."""
        while True:
            await self._reload.wait()
            self._reload.clear()
            backend = self.app.backend
            if not isinstance(backend, SupportsCredentialReload):
                _log.warning("taskq.reload-unsupported", backend=type(backend).__qualname__)
                continue
            try:
                await backend.reload_credentials()
            except Exception as exc:  # noqa: BLE001 - a failed reload keeps the old connections
                _log.error(
                    "taskq.credentials-reload-failed",
                    error=repr(exc),
                    hint="the connections in use are kept; send SIGHUP again once fixed",
                )
                continue
            self.reloads += 1
            _log.info("taskq.credentials-reloaded", reloads=self.reloads)

    async def _supervise(
        self,
        state: WorkerState,
        workers: list[asyncio.Task[None]],
        background: list[asyncio.Task[None]],
    ) -> None:
        """After stop: let held jobs finish within the grace, then end the loops."""
        await state.stopping.wait()
        # An --until-idle worker stops with no signal: its teardown hung for ever.
        self._arm_shutdown_watchdog()
        producer, consumers = workers[0], workers[1:]
        await producer
        if self._stop_requested.is_set():
            await orchestrate_shutdown(state, self._escalate, requested_at=self._stop_requested_at)
        # Consumers finish what is queued, then meet one end marker each.
        for _ in consumers:
            state.queue.put_nowait(None)
        await asyncio.wait(consumers)
        # A consumer leaves its last job's outcome write to the job task; the
        # heartbeat must keep the lease until that write is done.
        writing = [a.slot_freed() for a in state.active.values() if a.holds_slot]
        if writing:
            await asyncio.wait(writing)
        state.finished.set()
        for task in background:
            task.cancel()


async def _close_scopes(state: WorkerState, executor: SyncActorPool) -> None:
    """Tear down the worker's DI scopes, at its stop or after a start that failed. Each
    step runs whatever the one before raised (a LOOP teardown cut by a cancellation
    skipped the THREAD and PROCESS ones), in this order: LOOP; the THREAD values of the
    sync actors' idle threads, closed in the threads that made them; the pool's
    shutdown; the THREAD values left (the loop thread's, those of threads still in a
    call); PROCESS."""
    async with AsyncExitStack() as scopes:
        scopes.push_async_callback(state.process_scope.aclose)
        scopes.push_async_callback(state.thread_scope.aclose)
        scopes.callback(executor.shutdown, wait=False, cancel_futures=True)
        scopes.push_async_callback(executor.in_each_idle_thread, state.thread_scope.close_current)
        scopes.push_async_callback(state.loop_scope.aclose)
