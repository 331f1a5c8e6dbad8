"""The worker under adversity: lost locks, loop errors, capacity reads, client admin."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any
from uuid import UUID

import pytest
import structlog
import structlog.testing
from asyncpg import exceptions as pg

from taskq import (
    Actor,
    EnqueueArgs,
    EnqueueItem,
    JobRow,
    JobStatus,
    MaxPendingExceededError,
    TaskQ,
    WorkerSettings,
    actor,
)
from taskq.backend import FakeClock
from taskq.backend.memory import InMemoryBackend
from taskq.worker import Worker
from taskq.worker._transient import RepeatedWarning, UnexpectedLoopErrorGuard, transient_errors
from tests.worker.running import running

SETTINGS = {
    "poll_interval": "50ms",
    "heartbeat_interval": "50ms",
    "lock_lease": "1s",
    "maintenance_interval": "20ms",
    # In the test's process, a trip of the loop-lag watchdog (half the lease) on a
    # loaded machine ended the whole pytest worker.
    "watchdog_enabled": "false",
}


async def test_a_job_whose_lock_was_reclaimed_is_cancelled_locally_and_writes_nothing() -> None:
    started = asyncio.Event()
    finished: list[str] = []

    @actor(name="long", max_attempts=1)
    async def long(payload: dict[str, Any]) -> str:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            finished.append("cancelled")
            raise
        return "should never be stored"

    clock = FakeClock()
    tq = TaskQ("memory://", actors=[long], backend=InMemoryBackend(clock=clock))
    async with tq:
        job = await tq.client.enqueue(long, {})
        worker = Worker(tq, WorkerSettings.load(SETTINGS, env={}))
        run = asyncio.create_task(worker.run())
        await asyncio.wait_for(started.wait(), 5)
        # A long pause: the lease runs out and a sweep reclaims the job (here, at
        # once: no await between the jump and the reclaim lets a heartbeat renew).
        clock.advance(timedelta(hours=1))
        assert await tq.backend.reclaim_expired_locks(timedelta(0), timedelta(0)) == 1
        async with asyncio.timeout(5):
            while not finished:  # noqa: ASYNC110 - waiting on the actor's own record
                await asyncio.sleep(0.02)
        worker.stop()
        await asyncio.wait_for(run, 5)
        row = await tq.client.get(job.id)
        assert row is not None and row.status is JobStatus.CRASHED and row.result is None
        assert [a.outcome for a in await tq.client.get_attempts(job.id)] == ["crashed"]


def test_the_loop_guard_tolerates_isolated_errors_and_reraises_a_streak() -> None:
    guard = UnexpectedLoopErrorGuard("test", max_consecutive=3)
    guard.failed(ValueError("one"))
    guard.failed(ValueError("two"))
    guard.succeeded()  # a working iteration forgives the streak
    guard.failed(ValueError("one again"))
    guard.failed(ValueError("two again"))
    with pytest.raises(ValueError, match="three"):
        guard.failed(ValueError("three"))


def test_a_transient_error_met_every_turn_is_logged_once_per_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A dispatch loop polling each second logged each failure: 3,600 lines an hour of
    # one outage.
    now = [1000.0]
    monkeypatch.setattr("taskq.worker._transient.time.monotonic", lambda: now[0])
    warning = RepeatedWarning("taskq.test-transient-error", every=30.0)
    with structlog.testing.capture_logs() as logs:
        for _ in range(60):  # a minute of turns, one a second
            warning.failed(ConnectionRefusedError("down"))
            now[0] += 1.0
        warning.ok()  # back: the next failure is news again
        warning.failed(ConnectionRefusedError("down again"))
    assert [(e["event"], e["repeated"]) for e in logs] == [
        ("taskq.test-transient-error", 0),
        ("taskq.test-transient-error", 29),
        ("taskq.transient-errors-over", 29),  # the end of the outage, said
        ("taskq.test-transient-error", 0),
    ]
    assert "down again" in logs[-1]["error"]


async def test_a_worker_cut_off_logs_its_dispatch_failures_once_not_every_poll() -> None:
    from tests.worker.flaky_backend import CutOff

    backend = CutOff()
    tq = TaskQ("memory://", actors=[], backend=backend)
    async with tq:
        with structlog.testing.capture_logs() as logs:
            async with running(tq, SETTINGS):  # a poll every 50 ms
                await asyncio.sleep(0.3)  # started
                backend.away = True
                await asyncio.sleep(1.0)
                backend.away = False
    # A failed dispatch may have locked jobs: the turns after it look for them, and
    # fail in turn, each logged at every poll (about 20 lines here, 3,600 an hour).
    kinds = ("taskq.dispatch-transient-error", "taskq.unheard-jobs-transient-error")
    failures = [e["event"] for e in logs if e["event"] in kinds]
    assert 1 <= len(failures) <= 2 and len(set(failures)) == len(failures)


def test_transient_errors_come_from_every_plugin() -> None:
    import asyncpg

    errors = transient_errors()
    assert TimeoutError in errors and OSError in errors  # core's
    assert asyncpg.PostgresConnectionError in errors  # taskq-postgres's
    assert asyncpg.InvalidPasswordError not in errors  # auth failures are not transient


@actor(name="quick")
async def quick(payload: dict[str, Any]) -> str:
    return "done"


async def _until_finished(tq: TaskQ, jobs: list[JobRow]) -> None:
    async with asyncio.timeout(10):
        while True:
            rows = [await tq.client.get(job.id) for job in jobs]
            if all(row is not None and row.is_terminal for row in rows):
                return
            await asyncio.sleep(0.05)


async def _one_job(backend: InMemoryBackend, job_actor: Actor[..., Any]) -> JobRow:
    """``job_actor``'s one job, run by a worker of short leases until it ends, as it
    ended: no sweep, so nothing but the worker's own writes can finish it. The backend
    is left open, for the test to read the job's history."""
    tq = TaskQ("memory://", actors=[job_actor], backend=backend)
    settings = {**SETTINGS, "lock_lease": "500ms", "maintenance_interval": "1h"}
    async with tq:
        job = await tq.client.enqueue(job_actor, {})
        async with running(tq, settings):
            await _until_finished(tq, [job])
        row = await tq.client.get(job.id)
    assert row is not None
    await backend.open()  # closed with the application
    return row


@pytest.mark.parametrize(
    "error",
    [
        OSError("connection reset"),
        # The server out of disk space or memory for a while (53100, 53200): the write
        # failed for good, and the job whose code had run ran again.
        pg.DiskFullError("could not extend file"),
        pg.OutOfMemoryError("out of memory"),
    ],
    ids=["connection-reset", "disk-full", "out-of-memory"],
)
async def test_a_success_write_failing_longer_than_the_lease_lands_once_it_can(
    error: Exception,
) -> None:
    # The heartbeat renews every job locked by its worker. A worker that gave up on
    # the write (it used to, after one lease) left the job running and locked, renewed
    # for as long as it lived: never finished, never reclaimed.
    class Blip(InMemoryBackend):
        failing_until = 0.0

        def _blip(self) -> None:
            if asyncio.get_running_loop().time() < self.failing_until:
                raise error

        async def mark_succeeded(self, *args: Any, **kwargs: Any) -> Any:
            self._blip()
            return await super().mark_succeeded(*args, **kwargs)

        async def mark_succeeded_many(self, *args: Any, **kwargs: Any) -> Any:
            self._blip()
            return await super().mark_succeeded_many(*args, **kwargs)

    @actor(name="quick")
    async def quick(payload: dict[str, Any]) -> str:
        # Writes fail from now on, for three leases.
        backend.failing_until = asyncio.get_running_loop().time() + 1.5
        return "done"

    backend = Blip()
    row = await _one_job(backend, quick)
    assert row.status is JobStatus.SUCCEEDED and row.result == "done"
    assert [a.outcome for a in await backend.get_attempts(row.id)] == ["succeeded"]


class StatementTimeout(OSError):
    """A database's cancellation of one statement (Postgres: 57014), transient as every
    OSError is."""


class Cancels(InMemoryBackend):
    """Success writes cancelled at every try (``always``), as a result too large for the
    database's statement_timeout is, or only while ``outage`` is set, when the
    heartbeat's renewals fail too."""

    statement_cancellations = (StatementTimeout,)
    always = True
    outage = False

    def _cancel(self, write: bool) -> None:
        if self.outage or (write and self.always):
            raise StatementTimeout("canceling statement due to statement timeout")

    async def mark_succeeded(self, *args: Any, **kwargs: Any) -> Any:
        self._cancel(write=True)
        return await super().mark_succeeded(*args, **kwargs)

    async def mark_succeeded_many(self, *args: Any, **kwargs: Any) -> Any:
        self._cancel(write=True)
        return await super().mark_succeeded_many(*args, **kwargs)

    async def renew_leases(self, *args: Any, **kwargs: Any) -> Any:
        self._cancel(write=False)
        return await super().renew_leases(*args, **kwargs)


async def test_a_success_write_the_database_cancels_at_every_try_fails_the_job() -> None:
    # Retried forever, the job stayed running and held its slot for the worker's life.
    # The database renews the job's lease meanwhile: it answers, and the row is free.
    backend = Cancels()
    with structlog.testing.capture_logs() as logs:
        row = await _one_job(backend, quick)
    attempts = await backend.get_attempts(row.id)
    assert row.status is JobStatus.FAILED and row.error is not None
    assert row.error.error_class == "taskq.errors.OutcomeNotRecorded"
    assert "statement timeout" in row.error.message and "succeeded write" in row.error.message
    assert [a.outcome for a in attempts] == ["failed"]
    assert [log["write"] for log in logs if log["event"] == "taskq.outcome-write-refused"] == [
        "succeeded"
    ]


async def test_a_cancelled_success_write_is_retried_while_the_lease_cannot_be_renewed() -> None:
    # Every statement fails (the database overloaded, say): nothing says the write
    # fails on what it carries, so it is retried, and lands once the database is back.
    @actor(name="quick")
    async def quick(payload: dict[str, Any]) -> str:
        backend.outage = True  # for three leases, from the write's first try
        asyncio.get_running_loop().call_later(1.5, setattr, backend, "outage", False)
        return "done"

    backend = Cancels()
    backend.always = False
    row = await _one_job(backend, quick)
    assert row.status is JobStatus.SUCCEEDED and row.result == "done"


async def test_a_success_whose_first_try_committed_is_not_reported_as_lost() -> None:
    # The write commits and its reply is lost; the retry finds the job already
    # succeeded (a no-op). That is this worker's own success, not a lost lock.
    class LostReply(InMemoryBackend):
        lost = False

        async def mark_succeeded_many(self, *args: Any, **kwargs: Any) -> Any:
            flags = await super().mark_succeeded_many(*args, **kwargs)
            if not self.lost:
                self.lost = True
                raise OSError("connection reset")
            return flags

    backend = LostReply()
    tq = TaskQ("memory://", actors=[quick], backend=backend)
    async with tq:
        job = await tq.client.enqueue(quick, {})
        with structlog.testing.capture_logs() as logs:
            async with running(tq, SETTINGS) as worker, asyncio.timeout(10):
                # Succeeded at the first try; the retry and its verdict come after.
                while not worker.processed:  # noqa: ASYNC110 - polling a counter
                    await asyncio.sleep(0.02)
        assert backend.lost
        assert not [log for log in logs if log["event"] == "taskq.ownership-lost"]
        row = await tq.client.get(job.id)
        assert row is not None and row.status is JobStatus.SUCCEEDED


async def test_jobs_locked_by_a_dispatch_whose_reply_was_lost_are_handed_back() -> None:
    # The dispatch commits, then the connection drops before its reply arrives: the
    # jobs are locked by a worker that does not know them, and its heartbeat renews them.
    class LostReply(InMemoryBackend):
        lost = 0

        async def dispatch_actors_batch(self, *args: Any, **kwargs: Any) -> Any:
            rows = await super().dispatch_actors_batch(*args, **kwargs)
            if rows and not self.lost:
                self.lost = len(rows)
                raise OSError("connection reset")
            return rows

    backend = LostReply()
    tq = TaskQ("memory://", actors=[quick], backend=backend)
    # No sweep: only the worker itself can give the jobs back.
    settings = {**SETTINGS, "maintenance_interval": "1h"}
    async with tq:
        jobs = [await tq.client.enqueue(quick, {}) for _ in range(3)]
        async with running(tq, settings):
            await _until_finished(tq, jobs)
        assert backend.lost == 3
        for job in jobs:
            row = await tq.client.get(job.id)
            assert row is not None and row.status is JobStatus.SUCCEEDED
            # Handed back unstarted: its budget untouched, the lost lock on record.
            outcomes = [a.outcome for a in await tq.client.get_attempts(job.id)]
            assert outcomes == ["unstarted", "succeeded"]


async def test_a_job_locked_for_the_worker_behind_its_back_is_found_by_the_heartbeat() -> None:
    # Whatever the cause, a job locked by a live worker that does not know it would be
    # renewed by every heartbeat: renewing more jobs than it knows makes the worker look.
    tq = TaskQ("memory://", actors=[quick])
    settings = {**SETTINGS, "maintenance_interval": "1h"}  # no sweep reclaims it
    async with tq:
        async with running(tq, settings) as worker:
            await asyncio.sleep(0.2)  # up and idle
            job = await tq.backend.enqueue(EnqueueArgs(actor="quick"))
            [locked] = await tq.backend.dispatch_batch(
                worker.worker_id, ["default"], 1, timedelta(seconds=30)
            )
            assert locked.id == job.id
            await _until_finished(tq, [job])
        outcomes = [a.outcome for a in await tq.client.get_attempts(job.id)]
        assert outcomes == ["unstarted", "succeeded"]


async def test_a_producer_that_keeps_failing_stops_the_worker() -> None:
    class Broken(InMemoryBackend):
        async def dispatch_actors_batch(self, *args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("a bug, not a blip")

    tq = TaskQ("memory://", backend=Broken())
    async with tq:
        worker = Worker(tq, WorkerSettings.load({**SETTINGS, "poll_interval": "10ms"}, env={}))
        with pytest.raises(ExceptionGroup) as info:
            await asyncio.wait_for(worker.run(), 30)  # ~1 s; a bound for loaded machines
        assert info.group_contains(RuntimeError, match="a bug, not a blip")


@actor(name="limited", max_pending=2)
async def limited(payload: dict[str, Any]) -> None:
    return None


async def test_max_pending_read_failure_fails_open() -> None:
    class Flaky(InMemoryBackend):
        async def get_actor_max_pending(self) -> dict[str, int | None]:
            raise ConnectionError("blip")

        async def count_pending_jobs(self, actors: list[str], **_: Any) -> dict[str, int]:
            return dict.fromkeys(actors, 0)

    tq = TaskQ("memory://", actors=[limited], backend=Flaky())
    async with tq:
        for _ in range(3):  # the code literal (2) applies with counts of 0: no refusal
            await tq.client.enqueue(limited, {})


async def test_a_limits_read_refused_for_want_of_configuration_is_raised_not_failed_open() -> None:
    # A missing right (a ConfigurationError), a backend not open: the enqueue refused
    # after a warning that the limits could not be read, or (a role that may insert
    # jobs but not read actor_config) every enqueue went on unchecked, warning each
    # time; SyncJobsClient raises there.
    import structlog.testing

    from taskq.errors import ConfigurationError

    class Refused(InMemoryBackend):
        async def get_actor_max_pending(self) -> dict[str, int | None]:
            raise ConfigurationError("role 'app' lacks SELECT on table taskq.actor_config")

    tq = TaskQ("memory://", actors=[limited], backend=Refused())
    async with tq:
        with (
            structlog.testing.capture_logs() as logs,
            pytest.raises(ConfigurationError, match="lacks SELECT"),
        ):
            await tq.client.enqueue(limited, {})
    assert [e for e in logs if e["log_level"] == "warning"] == []


async def test_a_backend_without_get_actor_max_pending_fails_loudly() -> None:
    class Old(InMemoryBackend):
        get_actor_max_pending = None  # type: ignore[assignment]

    # Not a Backend on purpose: the check under test is the run-time one.
    tq = TaskQ("memory://", actors=[limited], backend=Old())  # type: ignore[arg-type]
    async with tq:
        with pytest.raises(TypeError, match="lacks get_actor_max_pending"):
            await tq.client.enqueue(limited, {})


async def test_the_stored_max_pending_beats_the_code_literal() -> None:
    from taskq import ActorConfig

    tq = TaskQ("memory://", actors=[limited])
    async with tq:
        await tq.backend.register_actors([ActorConfig(actor="limited", max_pending=1)])
        await tq.client.enqueue(limited, {})
        with pytest.raises(MaxPendingExceededError, match="max_pending=1"):
            await tq.client.enqueue(limited, {})
        with pytest.raises(MaxPendingExceededError):
            await tq.client.enqueue_batch([EnqueueItem(actor="limited", payload={})])


async def test_client_batch_forms_retry_and_enqueue_with_conn() -> None:
    @actor(name="plain", max_attempts=1)
    async def plain(payload: dict[str, Any]) -> None:
        raise RuntimeError("fails once")

    tq = TaskQ("memory://", actors=[plain])
    async with tq:
        c = tq.client
        assert await c.enqueue_batch_fast([(plain, {"i": i}) for i in range(5)]) == 5
        rows = await c.enqueue_batch(
            [EnqueueItem(actor="plain", payload={"i": 9}, options={"priority": 3})]
        )
        assert rows[0].priority == 3
        via_conn = await c.enqueue_with_conn(object(), plain, {"i": 10})  # memory ignores it
        assert (await c.get(via_conn.id)) is not None
        await Worker(tq, WorkerSettings.load({**SETTINGS, "until_idle": True}, env={})).run()
        failed = await c.list_jobs(status="failed")
        assert len(failed) == 7
        assert await c.retry(failed[0].id)
        again = await c.get(failed[0].id)
        assert again is not None and again.status is JobStatus.PENDING
        assert not await c.retry(failed[0].id)  # pending is not retryable


async def test_a_short_dispatch_is_followed_by_another_not_by_a_wait_for_a_wake() -> None:
    # On Postgres a dispatch can come back short while jobs are due: it skipped rows
    # other workers had locked. A worker that then waited for a wake sat idle for a
    # poll interval in a drain (no enqueue, so no wake). Only an empty one waits.
    class OneAtATime(InMemoryBackend):
        async def dispatch_actors_batch(
            self,
            worker_id: UUID,
            queues: list[str],
            limit: int,
            lock_lease: timedelta,
            actors: Sequence[str],
        ) -> list[JobRow]:
            return await super().dispatch_actors_batch(
                worker_id, queues, min(limit, 1), lock_lease, actors
            )

    tq = TaskQ("memory://", actors=[quick], backend=OneAtATime())
    async with tq:
        jobs = [await tq.client.enqueue(quick, {}) for _ in range(4)]
        async with running(tq, {**SETTINGS, "poll_interval": "30s", "concurrency": "4"}):
            await _until_finished(tq, jobs)


class CountedDispatches(InMemoryBackend):
    """Counts its dispatches; those for whose number ``held`` is true come back empty, as
    when other workers' dispatches in flight hold every due job."""

    def __init__(self, held: Callable[[int], bool] = lambda call: False) -> None:
        super().__init__()
        self.calls = 0
        self.held = held

    async def dispatch_actors_batch(
        self,
        worker_id: UUID,
        queues: list[str],
        limit: int,
        lock_lease: timedelta,
        actors: Sequence[str],
    ) -> list[JobRow]:
        self.calls += 1
        if self.held(self.calls):
            return []
        return await super().dispatch_actors_batch(worker_id, queues, limit, lock_lease, actors)


LOOK_AGAIN_SETTINGS = {**SETTINGS, "poll_interval": "30s", "concurrency": "2", "prefetch": "0"}
"""A poll interval past ``_until_finished``'s bound: only a look again can go on."""


async def test_an_empty_dispatch_right_after_a_full_one_is_looked_again_soon() -> None:
    # Every due job can be held by other workers' dispatches in flight (a gated head on
    # Postgres is not read past them): empty, yet jobs are due a few ms later. After a
    # full dispatch the worker looks once more about a dispatch's time later instead of
    # sitting out the poll interval.
    backend = CountedDispatches(held=lambda call: call % 2 == 0)
    tq = TaskQ("memory://", actors=[quick], backend=backend)
    async with tq:
        jobs = [await tq.client.enqueue(quick, {}) for _ in range(12)]
        async with running(tq, LOOK_AGAIN_SETTINGS):
            await _until_finished(tq, jobs)
    assert backend.calls >= 12  # each empty answer followed by a full one


async def test_a_workers_first_dispatch_found_empty_is_looked_again_soon() -> None:
    # A worker starting while others drain: its first dispatch can find every due job
    # held by theirs in flight.
    backend = CountedDispatches(held=lambda call: call == 1)
    tq = TaskQ("memory://", actors=[quick], backend=backend)
    async with tq:
        jobs = [await tq.client.enqueue(quick, {}) for _ in range(4)]
        async with running(tq, LOOK_AGAIN_SETTINGS):
            await _until_finished(tq, jobs)


async def test_an_idle_worker_looks_again_only_once_after_a_full_dispatch() -> None:
    backend = CountedDispatches()
    tq = TaskQ("memory://", actors=[quick], backend=backend)
    async with tq:
        jobs = [await tq.client.enqueue(quick, {}) for _ in range(2)]
        async with running(tq, LOOK_AGAIN_SETTINGS):
            await _until_finished(tq, jobs)
            await asyncio.sleep(0.3)
            settled = backend.calls
            await asyncio.sleep(0.3)
            # The full dispatch of 2, then at most one empty one per freed slot and the
            # one look again; then nothing until a wake or the poll interval.
            assert backend.calls == settled <= 4


class CountOnlyHeldRow(InMemoryBackend):
    """Review: a backend with statement cancellations but only a count from its heartbeat
    (no ``SupportsLeaseRenewal``): while ``held`` (another transaction holds the row),
    its heartbeat skips the row, as Postgres's does, and a success write times out."""

    statement_cancellations = (StatementTimeout,)
    renew_leases = None  # type: ignore[assignment]  # only heartbeat_jobs
    held: UUID | None = None

    async def heartbeat_jobs(self, worker_id: UUID, lock_lease: timedelta) -> int:
        now = self.clock.now()
        rows = [row for row in self._held(worker_id) if row.id != self.held]
        for row in rows:
            self._store.update(row, lock_expires_at=now + lock_lease)
        return len(rows)

    async def mark_succeeded(self, job_id: Any, *args: Any, **kwargs: Any) -> Any:
        if job_id == self.held:
            raise StatementTimeout("canceling statement due to statement timeout")
        return await super().mark_succeeded(job_id, *args, **kwargs)

    async def mark_succeeded_many(self, worker_id: Any, items: Any, *args: Any) -> Any:
        if any(item.job_id == self.held for item in items):
            raise StatementTimeout("canceling statement due to statement timeout")
        return await super().mark_succeeded_many(worker_id, items, *args)


async def test_a_held_row_is_retried_with_a_heartbeat_that_only_counts() -> None:
    # The worker cannot tell which job a count-only heartbeat skipped: it must not read
    # the count as this job's renewal and refuse its write.
    @actor(name="quick")
    async def quick(payload: dict[str, Any], ctx: Any) -> str:
        backend.held = ctx.job_id  # for three leases, from the write's first try
        asyncio.get_running_loop().call_later(1.5, setattr, backend, "held", None)
        return "done"

    backend = CountOnlyHeldRow()
    row = await _one_job(backend, quick)
    assert row.status is JobStatus.SUCCEEDED and row.result == "done"


def test_every_transient_shape_the_architecture_names_is_transient() -> None:
    # architecture.md, "Transient error handling": one tuple, every loop. A shape
    # dropped from it ends a loop (five in a row end the worker) on a PG restart or a
    # saturated server instead of retrying at the next tick.
    import asyncpg
    from asyncpg import exceptions as pg

    errors = transient_errors()
    named = [
        TimeoutError,
        asyncpg.PostgresConnectionError,
        asyncpg.InterfaceError,
        OSError,
        pg.QueryCanceledError,  # 57014
        pg.AdminShutdownError,  # 57P01
        pg.CannotConnectNowError,  # 57P03
        pg.TooManyConnectionsError,  # 53300
        pg.DeadlockDetectedError,  # 40P01
        pg.SerializationError,  # 40001
        pg.IdleSessionTimeoutError,
        pg.IdleInTransactionSessionTimeoutError,
    ]
    assert [kind for kind in named if not issubclass(kind, errors)] == []
    excluded = [pg.InvalidPasswordError, pg.InvalidAuthorizationSpecificationError]
    assert [kind for kind in excluded if issubclass(kind, errors)] == []
