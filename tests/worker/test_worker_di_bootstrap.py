"""A worker creates its actors' shared values as it starts, before its first job
(in-process, on the in-memory backend)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import structlog.testing

from taskq import (
    ConfigurationError,
    JobStatus,
    ProviderRegistry,
    Scope,
    TaskQ,
    WorkerSettings,
    actor,
)
from taskq.worker import Worker, _watchdog
from taskq_testing import TEST_SETTINGS
from tests.worker.running import running


class _Model:
    """Slow to load (a sync provider: it blocks the event loop while it loads)."""


class _Client:
    """A PROCESS-wide client."""


class _LoopDb:
    """Made from the event loop thread's THREAD value."""

    def __init__(self, conn: _ThreadConn) -> None:
        self.conn = conn


class _ThreadConn:
    def __init__(self) -> None:
        self.thread = threading.current_thread().name


class _Repo:
    """TRANSIENT: one per job, built on a LOOP value."""

    def __init__(self, db: _LoopDb) -> None:
        self.db = db


class _PoolConn:
    """THREAD, for a sync actor: its pool thread's own, made at first use there."""


async def _until(condition: Any, seconds: float = 5.0) -> None:
    async with asyncio.timeout(seconds):
        while True:
            if condition():
                return
            await asyncio.sleep(0.01)


@pytest.fixture
def trips(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The watchdog's trips, recorded instead of ending the test process."""
    tripped: list[str] = []

    def trip(detector: str, reason: str, *, in_loop: bool = True) -> None:
        tripped.append(f"{detector}: {reason}")

    monkeypatch.setattr(_watchdog, "trip", trip)
    return tripped


async def test_a_slow_sync_provider_does_not_trip_the_loop_lag_watchdog(trips: list[str]) -> None:
    # Created by the first job that needed it, a sync provider slower than the loop-lag
    # budget blocked the loop with the watchdog armed: it ended the worker (os._exit),
    # and the next one, and the next.
    loads: list[_Model] = []

    def load_model() -> _Model:
        time.sleep(1.5)  # longer than the loop-lag budget, on the loop
        loads.append(_Model())
        return loads[-1]

    @actor(name="infer")
    async def infer(payload: dict[str, Any], model: _Model) -> int:
        return id(model)

    providers = ProviderRegistry()
    providers.register(_Model, load_model, scope=Scope.LOOP)
    tq = TaskQ("memory://", actors=[infer], providers=providers)
    settings = {
        **TEST_SETTINGS,
        "watchdog_enabled": "true",
        "watchdog_loop_lag_budget": "500ms",
        "watchdog_loop_lag_startup_grace": "100ms",
        "watchdog_check_interval": "50ms",
    }
    async with tq, running(tq, settings):
        await asyncio.sleep(0.6)  # the watchdog is armed (its grace is over)
        job = await tq.client.enqueue(infer, {})
        result = await tq.client.wait_for_result(job.id, timeout=10)
    assert trips == []
    assert len(loads) == 1 and result == id(loads[0])


async def test_shared_values_are_created_once_at_start_and_are_the_jobs_own() -> None:
    made: list[str] = []
    closed: list[str] = []
    seen: dict[str, list[Any]] = {}  # (db, client) pairs and bare clients

    def client() -> Iterator[_Client]:
        made.append("client")
        yield _Client()
        closed.append("client")

    def thread_conn() -> Iterator[_ThreadConn]:
        made.append(f"thread_conn in {threading.current_thread().name}")
        yield _ThreadConn()
        closed.append("thread_conn")

    def pool_conn() -> _PoolConn:
        made.append(f"pool_conn in {threading.current_thread().name}")
        return _PoolConn()

    def loop_db(conn: _ThreadConn, client: _Client) -> Iterator[_LoopDb]:
        made.append("loop_db")
        yield _LoopDb(conn)
        closed.append("loop_db")

    def repo(db: _LoopDb) -> _Repo:
        made.append("repo")
        return _Repo(db)

    @actor(name="reads")
    async def reads(payload: dict[str, Any], repo: _Repo, client: _Client) -> None:
        seen.setdefault("reads", []).append((repo.db, client))

    @actor(name="reads_sync")
    def reads_sync(payload: dict[str, Any], client: _Client, conn: _PoolConn) -> None:
        seen.setdefault("reads_sync", []).append(client)

    providers = ProviderRegistry()
    providers.register(_Client, client, scope=Scope.PROCESS)
    providers.register(_ThreadConn, thread_conn, scope=Scope.THREAD)
    providers.register(_PoolConn, pool_conn, scope=Scope.THREAD)
    providers.register(_LoopDb, loop_db, scope=Scope.LOOP)
    providers.register(_Repo, repo, scope=Scope.TRANSIENT)
    tq = TaskQ("memory://", actors=[reads, reads_sync], providers=providers)
    async with tq:
        async with running(tq, TEST_SETTINGS) as worker:
            # No job yet: the shared values exist already, dependencies first; the
            # TRANSIENT one and the sync actor's pool-thread one do not.
            await _until(lambda: "loop_db" in made)
            loop_thread = threading.current_thread().name
            assert made == [f"thread_conn in {loop_thread}", "client", "loop_db"]
            jobs = [await tq.client.enqueue(reads, {}) for _ in range(2)]
            jobs.append(await tq.client.enqueue(reads_sync, {}))
            for job in jobs:
                await tq.client.wait_for_result(job.id, timeout=10)
            assert closed == []
        assert worker.processed == 3
    assert made[:3] == [f"thread_conn in {loop_thread}", "client", "loop_db"]
    assert sorted(made[3:])[1:] == ["repo", "repo"]  # one per job
    assert min(made[3:]).startswith("pool_conn in taskq-sync-actor")  # at first use
    # The very values created at the start, in every job.
    (db_1, client_1), (db_2, client_2) = seen["reads"]
    assert db_1 is db_2 and client_1 is client_2 is seen["reads_sync"][0]
    assert closed == ["loop_db", "thread_conn", "client"]  # once each, at the stop


async def test_a_provider_that_fails_stops_the_start_and_no_job_is_taken() -> None:
    closed: list[str] = []

    def client() -> Iterator[_Client]:
        yield _Client()
        closed.append("client")

    def load_model(client: _Client) -> _Model:
        raise PermissionError("the model store refused the credentials\n(403)")

    @actor(name="infer")
    async def infer(payload: dict[str, Any], model: _Model) -> None:
        return None

    providers = ProviderRegistry()
    providers.register(_Client, client, scope=Scope.PROCESS)
    providers.register(_Model, load_model, scope=Scope.LOOP)
    tq = TaskQ("memory://", actors=[infer], providers=providers)
    async with tq:
        job = await tq.client.enqueue(infer, {})
        worker = Worker(tq, WorkerSettings.load(dict(TEST_SETTINGS), env={}))
        with pytest.raises(ConfigurationError) as raised:
            await asyncio.wait_for(worker.run(), 10)
        row = await tq.client.get(job.id)
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(
        "the worker cannot start: the LOOP-scoped provider of _Model "
        "(test_a_provider_that_fails_stops_the_start_and_no_job_is_taken.<locals>.load_model), "
        "needed by actor 'infer', raised PermissionError"
    )
    assert "PermissionError: the model store refused the credentials (403)" in message
    assert isinstance(raised.value.__cause__, PermissionError)
    assert row is not None and row.status is JobStatus.PENDING and row.attempt == 0
    assert worker.processed == 0
    assert closed == ["client"]  # what was created before is torn down


async def test_only_the_actors_of_the_workers_queues_get_their_values_at_start() -> None:
    made: list[str] = []

    def model() -> _Model:
        made.append("model")
        return _Model()

    def client() -> _Client:
        made.append("client")
        return _Client()

    @actor(name="gpu_work", queue="gpu")
    async def gpu_work(payload: dict[str, Any], model: _Model) -> None:
        return None

    @actor(name="light_work", queue="light")
    async def light_work(payload: dict[str, Any], client: _Client) -> None:
        return None

    providers = ProviderRegistry()
    providers.register(_Model, model, scope=Scope.LOOP)
    providers.register(_Client, client, scope=Scope.LOOP)
    tq = TaskQ("memory://", actors=[gpu_work, light_work], providers=providers)
    async with tq, running(tq, {**TEST_SETTINGS, "queues": "light"}):
        await _until(lambda: made)
        await asyncio.sleep(0.1)
    assert made == ["client"]  # not the model of a queue this worker does not work


async def test_eager_dependencies_off_creates_them_at_first_use() -> None:
    made: list[str] = []

    def model() -> _Model:
        made.append("model")
        return _Model()

    @actor(name="infer")
    async def infer(payload: dict[str, Any], model: _Model) -> None:
        return None

    providers = ProviderRegistry()
    providers.register(_Model, model, scope=Scope.LOOP)
    tq = TaskQ("memory://", actors=[infer], providers=providers)
    async with tq, running(tq, {**TEST_SETTINGS, "eager_dependencies": "false"}):
        await asyncio.sleep(0.2)
        assert made == []
        job = await tq.client.enqueue(infer, {})
        await tq.client.wait_for_result(job.id, timeout=10)
        assert made == ["model"]


async def test_the_start_logs_how_long_the_values_took() -> None:
    @actor(name="infer")
    async def infer(payload: dict[str, Any], model: _Model) -> None:
        return None

    providers = ProviderRegistry()
    providers.register(_Model, _Model, scope=Scope.LOOP)
    tq = TaskQ("memory://", actors=[infer], providers=providers)
    with structlog.testing.capture_logs() as logs:
        async with tq, running(tq, TEST_SETTINGS):
            await _until(lambda: any(e["event"] == "taskq.worker-started" for e in logs))
    events = [e["event"] for e in logs]
    assert events.index("taskq.di-bootstrapped") < events.index("taskq.worker-started")
    done = next(e for e in logs if e["event"] == "taskq.di-bootstrapped")
    assert done["values"] == 1


def test_needs_are_listed_dependencies_first_each_once() -> None:
    def loop_db(conn: _ThreadConn, client: _Client) -> _LoopDb:
        raise AssertionError("never called")

    async def reads(payload: dict[str, Any], repo: _Repo, db: _LoopDb) -> None:
        return None

    def reads_sync(payload: dict[str, Any], conn: _ThreadConn, client: _Client) -> None:
        return None

    providers = ProviderRegistry()
    providers.register(_Client, _Client, scope=Scope.PROCESS)
    providers.register(_ThreadConn, _ThreadConn, scope=Scope.THREAD)
    providers.register(_LoopDb, loop_db, scope=Scope.LOOP)
    providers.register(_Repo, _Repo, scope=Scope.TRANSIENT)
    from taskq._di import ActorSpec
    from taskq._di.bootstrap import shared_needs

    # The sync actor's THREAD value is its pool thread's: not a start-up one. Its
    # PROCESS value is.
    sync_only = shared_needs(providers, {"reads_sync": ActorSpec(reads_sync, ("payload",))})
    assert [(n.entry.name, n.scope) for n in sync_only] == [("_Client", Scope.PROCESS)]
    needs = shared_needs(
        providers,
        {
            "reads_sync": ActorSpec(reads_sync, ("payload",)),
            "reads": ActorSpec(reads, ("payload",)),
        },
    )
    assert [(n.entry.name, n.scope) for n in needs] == [
        ("_Client", Scope.PROCESS),
        ("_ThreadConn", Scope.THREAD),  # the loop thread's, for the LOOP value
        ("_LoopDb", Scope.LOOP),
    ]
    assert needs[1].actor == "reads"
    assert needs[1].path == (
        "actor 'reads'",
        "_Repo (TRANSIENT)",
        "_LoopDb (LOOP)",
        "_ThreadConn (THREAD)",
    )


async def test_no_job_is_taken_while_the_values_are_created() -> None:
    # /readyz says why the worker is not ready yet; the job waits, untouched.
    entered = asyncio.Event()
    release = asyncio.Event()

    async def open_client() -> _Client:
        entered.set()
        await release.wait()
        return _Client()

    @actor(name="calls")
    async def calls(payload: dict[str, Any], client: _Client) -> str:
        return "ok"

    providers = ProviderRegistry()
    providers.register(_Client, open_client, scope=Scope.LOOP)
    tq = TaskQ("memory://", actors=[calls], providers=providers)
    async with tq:
        job = await tq.client.enqueue(calls, {})
        async with running(tq, TEST_SETTINGS) as worker:
            await asyncio.wait_for(entered.wait(), 5)
            await asyncio.sleep(0.2)  # several poll intervals
            assert worker.startup.describe() == {"reason": "creating the actors' dependencies"}
            row = await tq.client.get(job.id)
            assert row is not None and row.status is JobStatus.PENDING and row.attempt == 0
            release.set()
            assert await tq.client.wait_for_result(job.id, timeout=10) == "ok"


async def test_a_stop_during_the_start_creates_no_more_values() -> None:
    entered = asyncio.Event()
    release = asyncio.Event()
    made: list[str] = []
    closed: list[str] = []

    async def open_client() -> AsyncIterator[_Client]:
        entered.set()
        await release.wait()
        made.append("client")
        yield _Client()
        closed.append("client")

    def load_model() -> _Model:
        made.append("model")
        return _Model()

    @actor(name="calls")
    async def calls(payload: dict[str, Any], client: _Client, model: _Model) -> None:
        return None

    providers = ProviderRegistry()
    providers.register(_Client, open_client, scope=Scope.LOOP)
    providers.register(_Model, load_model, scope=Scope.LOOP)
    tq = TaskQ("memory://", actors=[calls], providers=providers)
    async with tq:
        worker = Worker(tq, WorkerSettings.load(dict(TEST_SETTINGS), env={}))
        run = asyncio.create_task(worker.run())
        await asyncio.wait_for(entered.wait(), 5)
        worker.stop()
        release.set()
        await asyncio.wait_for(run, 10)
    assert made == ["client"]  # the model, not yet begun, is left
    assert closed == ["client"]


async def _refused(*args: Any, **kwargs: Any) -> None:
    raise ConnectionResetError("the database went away")


async def test_a_start_that_fails_once_the_values_are_made_tears_them_down(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The registry row refused (the database away at the start) once the bootstrap had
    # made the values: run() raised and none was ever torn down (a pool left open).
    closed: list[str] = []

    def client() -> Iterator[_Client]:
        yield _Client()
        closed.append("client")

    def load_model(client: _Client) -> Iterator[_Model]:
        yield _Model()
        closed.append("model")

    @actor(name="calls")
    async def calls(payload: dict[str, Any], model: _Model) -> None:
        return None

    providers = ProviderRegistry()
    providers.register(_Client, client, scope=Scope.PROCESS)
    providers.register(_Model, load_model, scope=Scope.LOOP)
    tq = TaskQ("memory://", actors=[calls], providers=providers)
    async with tq:
        monkeypatch.setattr(tq.backend, "register_worker", _refused)
        worker = Worker(tq, WorkerSettings.load(dict(TEST_SETTINGS), env={}))
        with pytest.raises(ConnectionResetError):
            await asyncio.wait_for(worker.run(), 10)
    assert closed == ["model", "client"]  # each once, the last made first


async def test_a_start_that_fails_after_a_stop_leaves_no_shutdown_watchdog_armed(
    trips: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The stop during the start armed the shutdown watchdog; the start then failed, and
    # run() raised without disarming it: it ended the process hosting the worker (a
    # test run, an application) a termination_grace_period later (os._exit).
    entered = asyncio.Event()
    release = asyncio.Event()

    async def open_client() -> _Client:
        entered.set()
        await release.wait()
        return _Client()

    @actor(name="calls")
    async def calls(payload: dict[str, Any], client: _Client) -> None:
        return None

    providers = ProviderRegistry()
    providers.register(_Client, open_client, scope=Scope.LOOP)
    tq = TaskQ("memory://", actors=[calls], providers=providers)
    settings = {
        **TEST_SETTINGS,
        "watchdog_enabled": "true",
        "termination_grace_period": "500ms",
        "drain_grace_period": "100ms",
        "cancellation_grace_period": "100ms",
        "cleanup_grace_period": "100ms",
    }
    async with tq:
        monkeypatch.setattr(tq.backend, "register_worker", _refused)
        worker = Worker(tq, WorkerSettings.load(settings, env={}))
        run = asyncio.create_task(worker.run())
        await asyncio.wait_for(entered.wait(), 5)
        worker.stop()
        release.set()
        with pytest.raises(ConnectionResetError):
            await asyncio.wait_for(run, 10)
        try:
            await asyncio.sleep(1.0)  # past the termination grace period
            assert trips == []
        finally:
            worker.shutdown_done()  # a trip is recorded, not exited: stop its thread


async def test_a_stop_ends_the_wait_for_an_async_provider_that_hangs() -> None:
    # Its service away, the provider waits on; the stop waited with it, for ever (or
    # until the shutdown watchdog ended the process), where a job waiting for the same
    # value is cancelled by the stop.
    entered = asyncio.Event()
    closed: list[str] = []

    async def open_client() -> AsyncIterator[_Client]:
        entered.set()
        await asyncio.Event().wait()  # never answers
        yield _Client()
        closed.append("client")

    @actor(name="calls")
    async def calls(payload: dict[str, Any], client: _Client) -> None:
        return None

    providers = ProviderRegistry()
    providers.register(_Client, open_client, scope=Scope.LOOP)
    tq = TaskQ("memory://", actors=[calls], providers=providers)
    async with tq:
        job = await tq.client.enqueue(calls, {})
        worker = Worker(tq, WorkerSettings.load(dict(TEST_SETTINGS), env={}))
        run = asyncio.create_task(worker.run())
        await asyncio.wait_for(entered.wait(), 5)
        worker.stop()
        await asyncio.wait_for(run, 5)
        row = await tq.client.get(job.id)
    assert row is not None and row.status is JobStatus.PENDING and row.attempt == 0
    assert worker.processed == 0
    assert closed == []  # never made
