"""The worker runtime end to end on the in-memory backend (in-process)."""

from __future__ import annotations

import asyncio
import contextvars
import enum
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID, uuid4

import pytest
import structlog.testing
from pydantic import BaseModel, ConfigDict, model_validator

from taskq import (
    Context,
    FixedBackoff,
    JobFailedError,
    JobRow,
    JobStatus,
    PayloadValidationError,
    ProviderRegistry,
    QueueConfig,
    RetryAfter,
    Scope,
    Snooze,
    TaskQ,
    UnknownActorError,
    WorkerSettings,
    actor,
)
from taskq.backend.memory import InMemoryBackend
from taskq.models import EnqueueArgs
from taskq.worker import Worker
from taskq_testing import TEST_SETTINGS, run_until_idle
from tests.worker.flaky_backend import WritesFailWhileAway
from tests.worker.running import phase_logged

_RARE_HEARTBEATS: dict[str, Any] = {
    "heartbeat_interval": "20s",
    "lock_lease": "80s",
    "leader_lease": "40s",
    "cron_catch_up": "2m",
}
"""Heartbeats 20 s apart: nothing of the worker's own renews or reads in between."""


class Add(BaseModel):
    a: int
    b: int


@actor(queue="default")
async def add(payload: Add) -> int:
    return payload.a + payload.b


@actor
def add_sync(payload: Add) -> dict[str, Any]:
    return {"sum": payload.a + payload.b, "thread": threading.current_thread().name}


attempts: dict[str, int] = {}


@actor(max_attempts=3, retry_backoff=FixedBackoff(timedelta(milliseconds=10)))
async def flaky(payload: dict[str, Any]) -> str:
    key = payload["key"]
    attempts[key] = attempts.get(key, 0) + 1
    if attempts[key] < payload["succeed_on"]:
        raise RuntimeError(f"attempt {attempts[key]} failed")
    return "ok"


@actor
async def snoozer(payload: dict[str, Any], ctx: Context) -> int:
    if ctx.attempt < 3:
        raise Snooze(0.01)
    return ctx.attempt


@actor(max_attempts=2)
async def rate_limited(payload: dict[str, Any]) -> None:
    raise RetryAfter(0.01)


@actor(timeout=0.05, max_attempts=1)
async def slow(payload: dict[str, Any]) -> None:
    await asyncio.sleep(5)


class Counter:
    def __init__(self) -> None:
        self.calls = 0


@actor
async def injected(payload: dict[str, Any], counter: Counter, ctx: Context) -> int:
    counter.calls += 1
    await ctx.progress({"step": 1})
    await ctx.progress({"step": 2})
    return counter.calls


def make_app() -> TaskQ:
    providers = ProviderRegistry()
    providers.register(Counter, Counter, scope=Scope.LOOP)
    return TaskQ(
        "memory://",
        actors=[add, add_sync, flaky, snoozer, rate_limited, slow, injected],
        providers=providers,
    )


async def test_jobs_of_every_shape_reach_their_terminal_state() -> None:
    attempts.clear()
    tq = make_app()
    async with tq:
        c = tq.client
        ok = await c.enqueue(add, Add(a=1, b=2))
        ok_sync = await c.enqueue("add_sync", {"a": 2, "b": 3})
        retried = await c.enqueue(flaky, {"key": "r", "succeed_on": 2})
        exhausted = await c.enqueue(flaky, {"key": "x", "succeed_on": 99})
        snoozed = await c.enqueue(snoozer, {})
        after = await c.enqueue(rate_limited, {})
        timed_out = await c.enqueue(slow, {})
        di = await c.enqueue(injected, {})
        worker = await run_until_idle(tq)

        assert worker.processed >= 8
        assert await c.wait_for_result(ok.id, timeout=1) == 3
        result = await c.wait_for_result(ok_sync.id, timeout=1)
        assert result["sum"] == 5 and result["thread"].startswith("taskq-sync-actor")
        assert await c.wait_for_result(retried.id, timeout=1) == "ok"
        assert [a.outcome for a in await c.get_attempts(retried.id)] == ["failed", "succeeded"]

        with pytest.raises(JobFailedError, match="RuntimeError: attempt 3 failed"):
            await c.wait_for_result(exhausted.id, timeout=1)
        assert len(await c.get_attempts(exhausted.id)) == 3

        assert await c.wait_for_result(snoozed.id, timeout=1) == 3
        snoozed_row = await c.get(snoozed.id)
        assert snoozed_row is not None and snoozed_row.max_attempts == 3 + 2

        after_row = await c.get(after.id)
        assert after_row is not None and after_row.status is JobStatus.FAILED
        assert [a.outcome for a in await c.get_attempts(after.id)] == ["retry_after", "retry_after"]

        slow_row = await c.get(timed_out.id)
        assert slow_row is not None and slow_row.status is JobStatus.FAILED
        assert slow_row.error is not None and "timeout" in slow_row.error.message

        di_row = await c.get(di.id)
        assert di_row is not None and di_row.status is JobStatus.SUCCEEDED
        assert di_row.progress_seq == 2 and di_row.progress_state == {"step": 2}


async def test_enqueue_validates_payload_and_actor() -> None:
    tq = make_app()
    async with tq:
        with pytest.raises(PayloadValidationError, match="b: Field required"):
            await tq.client.enqueue(add, {"a": 1})
        with pytest.raises(UnknownActorError, match="registered actors: add"):
            await tq.client.enqueue("nope", {})
        assert await tq.client.list_jobs() == []


@pytest.mark.parametrize("heartbeats", ["often", "rarely"])
async def test_cooperative_cancel_ends_a_running_job_cancelled(heartbeats: str) -> None:
    # Rarely: 20 s apart, so only the cancel wake of the worker's own subscription
    # can bring the request to the job in time.
    slow = _RARE_HEARTBEATS
    started = asyncio.Event()

    @actor(name="waits")
    async def waits(payload: dict[str, Any], ctx: Context) -> str:
        started.set()
        await ctx.cancel_event.wait()
        return "stopped early"

    tq = TaskQ("memory://", actors=[waits])
    async with tq:
        job = await tq.client.enqueue(waits, {})
        overrides = slow if heartbeats == "rarely" else {}
        runner = asyncio.create_task(run_until_idle(tq, **overrides))
        await asyncio.wait_for(started.wait(), 5)
        assert isinstance(tq.backend, InMemoryBackend)
        assert tq.backend._store.worker_cancel_wake_subscribers, "not subscribed per worker"
        assert await tq.backend.write_cancel_request(job.id, "user asked")
        await asyncio.wait_for(runner, 10)
        row = await tq.client.get(job.id)
        assert row is not None and row.status is JobStatus.CANCELLED


async def test_sub_jobs_are_flushed_only_after_the_parent_succeeds() -> None:
    @actor(name="child")
    async def child(payload: dict[str, Any]) -> None:
        return None

    @actor(name="parent", max_attempts=1)
    async def parent(payload: dict[str, Any], ctx: Context) -> None:
        ctx.enqueue(child, {"n": 1})
        if payload["fail"]:
            raise ValueError("no")

    tq = TaskQ("memory://", actors=[child, parent])
    async with tq:
        await tq.client.enqueue(parent, {"fail": False})
        await tq.client.enqueue(parent, {"fail": True})
        await run_until_idle(tq)
        children = await tq.client.list_jobs(actor="child")
        assert [c.payload for c in children] == [{"n": 1}]
        assert children[0].status is JobStatus.SUCCEEDED


class _OffersTransactions(InMemoryBackend):
    """Counts the transactions the worker opens through ``transaction()``."""

    def __init__(self, simulates: bool) -> None:
        super().__init__()
        self.supports_transactional_simulation = simulates  # type: ignore[misc]
        self.opened = 0

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        self.opened += 1
        yield None  # the in-memory methods ignore the connection


@pytest.mark.parametrize("simulates", [True, False])
async def test_sub_jobs_go_through_a_transaction_only_when_the_backend_does_not_simulate(
    simulates: bool,
) -> None:
    @actor(name="child")
    async def child(payload: dict[str, Any]) -> None:
        return None

    @actor(name="parent")
    async def parent(payload: dict[str, Any], ctx: Context) -> None:
        ctx.enqueue(child, {})

    backend = _OffersTransactions(simulates)
    tq = TaskQ("memory://", actors=[child, parent], backend=backend)
    async with tq:
        await tq.client.enqueue(parent, {})
        await run_until_idle(tq)
        assert len(await tq.client.list_jobs(actor="child")) == 1
    assert backend.opened == (0 if simulates else 1)


class _HandBackDown(InMemoryBackend):
    """The statement handing back unstarted jobs fails (the database went away)."""

    async def hand_back_unstarted(
        self, worker_id: UUID, jobs: Sequence[tuple[UUID, int | None]], **kwargs: Any
    ) -> int:
        raise ConnectionError("connection lost")


async def test_unstarted_jobs_a_failed_hand_back_could_not_return_stay_for_the_sweep() -> None:
    started = asyncio.Event()

    @actor(name="holds")
    async def holds(payload: dict[str, Any], ctx: Context) -> None:
        started.set()
        await ctx.cancel_event.wait()

    tq = TaskQ("memory://", actors=[holds], backend=_HandBackDown())
    async with tq:
        jobs = [await tq.client.enqueue(holds, {}) for _ in range(3)]
        worker = Worker(
            tq,
            WorkerSettings.load(
                {
                    **TEST_SETTINGS,
                    "concurrency": 1,
                    "prefetch": 2,
                    "drain_grace_period": "50ms",
                },
                env={},
            ),
        )
        runner = asyncio.create_task(worker.run())
        await asyncio.wait_for(started.wait(), 5)
        while len(await tq.client.list_jobs(status="running")) < 3:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        worker.stop()
        await asyncio.wait_for(runner, 10)  # the failure does not wedge the shutdown
        rows = [await tq.client.get(job.id) for job in jobs]
        # The one that ran was handed back as it stopped; the two prefetched ones keep
        # their lock until the lease runs out and the reclaim sweep re-pends them.
        assert sorted(r.status for r in rows if r) == [
            JobStatus.PENDING,
            JobStatus.RUNNING,
            JobStatus.RUNNING,
        ]


class _NoUnstartedHandBack(InMemoryBackend):
    """A backend without ``SupportsUnstartedHandBack``: the worker hands its unstarted
    jobs back one by one."""

    hand_back_unstarted = None  # type: ignore[assignment]


@pytest.mark.parametrize("backend_type", [InMemoryBackend, _NoUnstartedHandBack])
async def test_a_stopping_worker_records_its_prefetched_jobs_as_never_started(
    backend_type: type[InMemoryBackend],
) -> None:
    # Two jobs wait for the one slot (prefetched) when the worker stops. Their attempts
    # read "interrupted", from dispatch to hand-back, as if they ran that long.
    started = asyncio.Event()

    @actor(name="holds")
    async def holds(payload: dict[str, Any], ctx: Context) -> None:
        started.set()
        await ctx.cancel_event.wait()

    tq = TaskQ("memory://", actors=[holds], backend=backend_type())
    async with tq:
        jobs = [await tq.client.enqueue(holds, {}) for _ in range(3)]
        settings = {**TEST_SETTINGS, "concurrency": 1, "prefetch": 2, "drain_grace_period": "50ms"}
        worker = Worker(tq, WorkerSettings.load(settings, env={}))
        runner = asyncio.create_task(worker.run())
        await asyncio.wait_for(started.wait(), 5)
        while len(await tq.client.list_jobs(status="running")) < 3:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        worker.stop()
        await asyncio.wait_for(runner, 10)
        outcomes = []
        for job in jobs:
            row = await tq.client.get(job.id)
            assert row is not None and row.status is JobStatus.PENDING
            assert row.max_attempts == job.max_attempts + 1  # no attempt used
            [attempt] = await tq.client.get_attempts(job.id)
            [*_, event] = await tq.client.get_events(job.id)
            assert event.detail.get("reason") == attempt.outcome
            # Held, not run: no duration. The one that ran has one.
            assert (attempt.duration is None) is (attempt.outcome == "unstarted")
            outcomes.append(attempt.outcome)
        assert sorted(outcomes) == ["interrupted", "unstarted", "unstarted"]


class _ReplyLostAtStop(InMemoryBackend):
    """The first dispatch locks its jobs, then its reply is lost, as the worker is told
    to stop: the producer never gets another turn to hand them back."""

    def __init__(self) -> None:
        super().__init__()
        self.stop_worker: Any = None

    async def dispatch_actors_batch(self, *args: Any, **kwargs: Any) -> list[Any]:
        rows = await super().dispatch_actors_batch(*args, **kwargs)
        if rows and self.stop_worker is not None:
            self.stop_worker()
            self.stop_worker = None
            raise ConnectionError("the reply was lost")
        return rows


async def test_a_stopping_worker_hands_back_jobs_whose_dispatch_reply_was_lost() -> None:
    tq = TaskQ("memory://", actors=[add], backend=_ReplyLostAtStop())
    async with tq:
        jobs = [await tq.client.enqueue(add, {"a": 1, "b": i}) for i in range(3)]
        worker = Worker(tq, WorkerSettings.load(dict(TEST_SETTINGS), env={}))
        assert isinstance(tq.backend, _ReplyLostAtStop)
        tq.backend.stop_worker = worker.stop
        await asyncio.wait_for(worker.run(), 10)
        rows = [await tq.client.get(job.id) for job in jobs]
        # Back in pending at once, not locked until the lease runs out (whose reclaim
        # would spend an attempt on jobs that never ran).
        assert [r.status for r in rows if r] == [JobStatus.PENDING] * 3
        for job in jobs:
            assert [a.outcome for a in await tq.client.get_attempts(job.id)] == ["unstarted"]


async def test_the_last_attempts_failure_is_logged_as_final() -> None:
    import structlog.testing

    @actor(name="fails_twice", max_attempts=2, retry_backoff=FixedBackoff(timedelta(0)))
    async def fails_twice(payload: dict[str, Any]) -> None:
        raise RuntimeError("no")

    tq = TaskQ("memory://", actors=[fails_twice])
    async with tq:
        await tq.client.enqueue(fails_twice, {})
        with structlog.testing.capture_logs() as logs:
            await run_until_idle(tq)
    decisions = [e["decision"] for e in logs if e["event"] == "taskq.job-raised"]
    assert decisions == ["retry", "fail"]


async def test_a_validation_error_the_actor_raises_is_retried_like_any_other() -> None:
    # API.md: any exception but Snooze and RetryAfter is retried until attempts run out.
    # A pydantic error of a reply the actor parsed may pass on the next attempt; only
    # the job's own payload, checked before the actor runs, fails without a retry.
    replies = iter(["not a number", "42"])

    @actor(name="parses_a_reply", max_attempts=2, retry_backoff=FixedBackoff(timedelta(0)))
    async def parses_a_reply(payload: dict[str, Any]) -> int:
        return Add.model_validate({"a": next(replies), "b": 0}).a

    tq = TaskQ("memory://", actors=[parses_a_reply])
    async with tq:
        job = await tq.client.enqueue(parses_a_reply, {})
        await run_until_idle(tq)
        row = await tq.client.get(job.id)
        assert row is not None and (row.status, row.result) == ("succeeded", 42)
        outcomes = [a.outcome for a in await tq.client.get_attempts(job.id)]
        assert outcomes == ["failed", "succeeded"]


class _Colour(enum.Enum):
    RED = "red"


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True)
    at: datetime
    ref: UUID
    colour: _Colour


async def test_a_strict_payload_model_with_times_ids_and_enums_runs() -> None:
    # Stored as JSON strings, validated back in pydantic's strict Python mode, which
    # wants the objects: every such payload was refused at enqueue.
    seen: list[_Strict] = []

    @actor(name="strict_payload")
    async def strict_payload(payload: _Strict) -> None:
        seen.append(payload)

    sent = _Strict(at=datetime(2026, 12, 4, 12, 0, tzinfo=UTC), ref=uuid4(), colour=_Colour.RED)
    tq = TaskQ("memory://", actors=[strict_payload])
    async with tq:
        job = await tq.client.enqueue(strict_payload, sent)
        assert job.payload == {"at": "2026-12-04T12:00:00Z", "ref": str(sent.ref), "colour": "red"}
        # As JSON gives it (`taskq enqueue`, another language's producer): taken too.
        await tq.client.enqueue("strict_payload", job.payload)
        with pytest.raises(PayloadValidationError, match="colour"):
            await tq.client.enqueue(strict_payload, {**job.payload, "colour": "blue"})
        await run_until_idle(tq)
    assert seen == [sent, sent]


async def test_a_payload_the_worker_finds_invalid_is_logged_with_the_job() -> None:
    # Enqueued by another application's model (or one changed since): the job failed
    # with no line in the worker's log.
    import structlog.testing

    @actor(name="counts_things", max_attempts=3)
    async def counts(payload: _Strict) -> None: ...

    tq = TaskQ("memory://", actors=[counts])
    async with tq:
        good = {"at": "2026-12-04T12:00:00Z", "ref": str(uuid4()), "colour": "red"}
        args = tq.client.build_args(counts, good)
        stored = await tq.backend.enqueue(args.model_copy(update={"payload": {"at": "soon"}}))
        merge = structlog.contextvars.merge_contextvars
        with structlog.testing.capture_logs(processors=[merge]) as logs:
            await run_until_idle(tq)
        row = await tq.client.get(stored.id)
    assert row is not None and row.status is JobStatus.FAILED and row.attempt == 1
    [entry] = [e for e in logs if e["event"] == "taskq.job-payload-invalid"]
    assert entry["job_id"] == str(stored.id) and "at" in entry["error"]


class _Aborted(BaseException):
    """Not an ``Exception``, as some libraries' own are (a test runner's failure)."""


@pytest.mark.parametrize("raised", ["cancelled", "base exception"])
async def test_an_actor_raising_a_base_exception_spends_its_attempt(raised: str) -> None:
    # A CancelledError of the actor's own (no cancel of the attempt), or another
    # BaseException, ended the job's task with no outcome: the job was handed back
    # unstarted and ran again, forever, with no attempt spent.
    runs: list[int] = []

    @actor(name="raises_base", max_attempts=2, retry_backoff=FixedBackoff(timedelta(0)))
    async def raises_base(payload: dict[str, Any]) -> None:
        runs.append(1)
        if raised == "base exception":
            raise _Aborted("stop")
        helper = asyncio.ensure_future(asyncio.sleep(10))
        helper.cancel()
        await helper  # a future someone else cancelled

    tq = TaskQ("memory://", actors=[raises_base])
    async with tq:
        job = await tq.client.enqueue(raises_base, {})
        await run_until_idle(tq, timeout=10)
        row = await tq.client.get(job.id)
        assert row is not None and row.status == "failed" and row.error is not None
        assert row.error.error_class.endswith(
            "CancelledError" if raised == "cancelled" else "_Aborted"
        )
        assert [a.outcome for a in await tq.client.get_attempts(job.id)] == ["failed", "failed"]
    assert len(runs) == 2


async def test_sys_exit_in_a_sync_actor_fails_its_job_not_the_worker() -> None:
    # The thread's SystemExit came back through a task, which re-raised it out of the
    # event loop: the worker ended, running jobs and all.
    import sys

    @actor(name="exits", max_attempts=1)
    def exits(payload: dict[str, Any]) -> None:
        sys.exit(3)

    tq = TaskQ("memory://", actors=[exits, add])
    async with tq:
        job = await tq.client.enqueue(exits, {})
        other = await tq.client.enqueue(add, {"a": 1, "b": 1})
        await run_until_idle(tq, timeout=10)
        row = await tq.client.get(job.id)
        assert row is not None and row.status == "failed" and row.error is not None
        assert row.error.error_class == "SystemExit"
        assert await tq.client.wait_for_result(other.id, timeout=0) == 2


class SlowResource:
    """A dependency whose creation waits (a pool with no free connection)."""


async def _slow_resource() -> SlowResource:
    await asyncio.sleep(30)
    return SlowResource()


async def test_the_attempt_timeout_covers_resolving_the_actors_dependencies() -> None:
    # Only the call was under the timeout: a provider that hung held the slot for good.
    @actor(name="needs_slow_resource", timeout=0.2, max_attempts=1)
    async def needs_slow_resource(payload: dict[str, Any], resource: SlowResource) -> str:
        return "ran"

    providers = ProviderRegistry()
    providers.register(SlowResource, _slow_resource, scope=Scope.TRANSIENT)
    tq = TaskQ("memory://", actors=[needs_slow_resource], providers=providers)
    async with tq:
        job = await tq.client.enqueue(needs_slow_resource, {})
        await run_until_idle(tq, timeout=10)
        row = await tq.client.get(job.id)
        assert row is not None and row.status == "failed" and row.error is not None
        assert row.error.error_class.endswith("TimeoutError")
        assert "timeout of 0.2s" in row.error.message


class _Model:
    """Slow to load, shared by every job on the loop."""


async def test_a_shared_value_slower_to_create_than_a_jobs_timeout_is_created_once() -> None:
    # Each job's timeout cancelled the shared creation it had started: every attempt
    # of every job failed, and the value was never created.
    loads: list[str] = []

    async def load_model() -> _Model:
        loads.append("started")
        await asyncio.sleep(0.5)
        loads.append("finished")
        return _Model()

    @actor(
        name="needs_the_model",
        timeout=0.2,
        max_attempts=5,
        retry_backoff=FixedBackoff(timedelta(milliseconds=100)),
    )
    async def infer(payload: dict[str, Any], model: _Model) -> str:
        return "ok"

    providers = ProviderRegistry()
    providers.register(_Model, load_model, scope=Scope.LOOP)
    tq = TaskQ("memory://", actors=[infer], providers=providers)
    async with tq:
        jobs = [await tq.client.enqueue(infer, {}) for _ in range(3)]
        await run_until_idle(tq, timeout=10)
        rows = [await tq.client.get(job.id) for job in jobs]
    assert [r.status for r in rows if r] == [JobStatus.SUCCEEDED] * 3
    assert loads == ["started", "finished"]


class _Tx:
    """A transaction: committed when its scope ends well, rolled back otherwise."""


class _SyncTx(_Tx):
    pass


async def test_a_context_manager_provider_is_told_the_actors_error() -> None:
    # Exited with (None, None, None) whatever happened: a transaction provider
    # committed the work of a job that failed.
    endings: list[str] = []

    class Transaction:
        async def __aenter__(self) -> _Tx:
            return _Tx()

        async def __aexit__(self, kind: object, error: BaseException | None, tb: object) -> None:
            if error is None:
                endings.append("commit")
                return
            endings.append(f"rollback: {error}")
            raise error  # as some libraries' own exits do

    @contextmanager
    def sync_transaction() -> Iterator[_SyncTx]:
        try:
            yield _SyncTx()
        except Exception as exc:
            endings.append(f"sync rollback: {exc}")
            raise
        endings.append("sync commit")

    @actor(name="writes", max_attempts=2, retry_backoff=FixedBackoff(timedelta(0)))
    async def writes(payload: dict[str, Any], tx: _Tx, ctx: Context) -> None:
        if ctx.attempt == 1:
            raise ValueError("attempt 1 failed")

    @actor(name="writes_sync", max_attempts=1)
    def writes_sync(payload: dict[str, Any], tx: _SyncTx) -> None:
        raise ValueError("sync failed")

    providers = ProviderRegistry()
    providers.register_context(_Tx, Transaction, scope=Scope.TRANSIENT)
    providers.register(_SyncTx, sync_transaction, scope=Scope.TRANSIENT)
    tq = TaskQ("memory://", actors=[writes, writes_sync], providers=providers)
    async with tq:
        job = await tq.client.enqueue(writes, {})
        await tq.client.enqueue(writes_sync, {})
        await run_until_idle(tq)
        [failed, _] = await tq.client.get_attempts(job.id)
    assert sorted(endings) == ["commit", "rollback: attempt 1 failed", "sync rollback: sync failed"]
    # The error recorded is the actor's, its traceback without the provider's frames.
    assert failed.error is not None and failed.error.traceback is not None
    assert "__aexit__" not in failed.error.traceback


_tenant: contextvars.ContextVar[str] = contextvars.ContextVar("tenant", default="none")


class _Tenant(str):
    pass


def _tenant_scope(resets: list[str]) -> Callable[[], AsyncIterator[_Tenant]]:
    """A provider that sets ``_tenant`` to "acme" as it enters and resets it as it exits,
    appending what ``_tenant`` reads then to ``resets``."""

    async def tenant_scope() -> AsyncIterator[_Tenant]:
        token = _tenant.set("acme")
        try:
            yield _Tenant("acme")
        finally:
            _tenant.reset(token)
            resets.append(_tenant.get())

    return tenant_scope


async def _tenanted_run(job_actor: Any) -> tuple[JobRow | None, list[str]]:
    """One job of ``job_actor``, whose ``_Tenant`` is :func:`_tenant_scope`'s (TRANSIENT):
    its stored row, and what ``_tenant`` read after each reset."""
    resets: list[str] = []
    providers = ProviderRegistry()
    providers.register(_Tenant, _tenant_scope(resets), scope=Scope.TRANSIENT)
    tq = TaskQ("memory://", actors=[job_actor], providers=providers)
    async with tq:
        job = await tq.client.enqueue(job_actor, {})
        await run_until_idle(tq)
        return await tq.client.get(job.id), resets


async def test_an_async_provider_that_sets_a_context_variable_resets_it_at_teardown() -> None:
    # Its teardown ran in a task of its own, in a copy of the job's context: the token
    # was "created in a different Context", the teardown failed, and so did every job.

    @actor(name="tenanted", max_attempts=1)
    async def tenanted(payload: dict[str, Any], who: _Tenant) -> str:
        return _tenant.get()

    row, resets = await _tenanted_run(tenanted)
    assert row is not None
    assert (row.status, row.result, row.error) == ("succeeded", "acme", None)
    assert resets == ["none"]


class _Session(str):
    pass


@pytest.mark.parametrize("scope", [Scope.TRANSIENT, Scope.LOOP, Scope.PROCESS])
@pytest.mark.parametrize("sync", [False, True], ids=["async-actor", "sync-actor"])
async def test_an_async_provider_is_exited_in_the_task_that_entered_it(
    scope: Scope, sync: bool
) -> None:
    # Entered in one task (the job's, a creation's) and exited in another (the
    # teardown's, the stop's): an anyio task group or cancel scope, which checks this,
    # raised "exit cancel scope in a different task", which failed every job
    # (TRANSIENT) or skipped the cleanup.
    endings: list[str] = []

    @asynccontextmanager
    async def session() -> AsyncIterator[_Session]:
        entered_in = asyncio.current_task()
        yield _Session("open")
        if asyncio.current_task() is not entered_in:
            raise RuntimeError("exited in a different task than it was entered in")
        endings.append("closed")

    if sync:

        @actor(name="uses_session", max_attempts=1)
        def uses_session(payload: dict[str, Any], session: _Session) -> str:
            return str(session)

    else:

        @actor(name="uses_session", max_attempts=1)
        async def uses_session(payload: dict[str, Any], session: _Session) -> str:
            return str(session)

    providers = ProviderRegistry()
    providers.register(_Session, session, scope=scope)
    tq = TaskQ("memory://", actors=[uses_session], providers=providers)
    with structlog.testing.capture_logs() as logs:
        async with tq:
            job = await tq.client.enqueue(uses_session, {})
            await run_until_idle(tq)
            row = await tq.client.get(job.id)
    assert row is not None
    assert (row.status, row.result, row.error) == ("succeeded", "open", None)
    assert endings == ["closed"]
    assert [e for e in logs if e["event"] == "taskq.di-teardown-failed"] == []


async def test_a_sync_actors_async_provider_resets_the_context_variable_it_set() -> None:
    # Made on the loop in a task of its own and exited from the job's: the token was
    # "created in a different Context", and every job failed on its teardown.

    @actor(name="tenanted_sync", max_attempts=1)
    def tenanted_sync(payload: dict[str, Any], who: _Tenant) -> str:
        return str(who)

    row, resets = await _tenanted_run(tenanted_sync)
    assert row is not None
    assert (row.status, row.result, row.error) == ("succeeded", "acme", None)
    assert resets == ["none"]


class _SlowConn:
    pass


async def test_a_sync_actor_past_its_limit_while_its_values_are_made_does_not_start() -> None:
    # Its thread went on to run the body once they were made: work done for an attempt
    # already failed on its limit (and done again by the retry; a stop's, handed back).
    making, release = threading.Event(), threading.Event()
    steps: list[str] = []

    def slow_conn() -> Iterator[_SlowConn]:
        making.set()
        release.wait(10)
        yield _SlowConn()
        steps.append("closed")

    @actor(name="slow_start", max_attempts=1, timeout=0.1)
    def slow_start(payload: dict[str, Any], conn: _SlowConn) -> None:
        steps.append("body")

    providers = ProviderRegistry()
    providers.register(_SlowConn, slow_conn, scope=Scope.TRANSIENT)
    tq = TaskQ("memory://", actors=[slow_start], providers=providers)
    with structlog.testing.capture_logs() as logs:
        async with tq:
            job = await tq.client.enqueue(slow_start, {})
            running = asyncio.create_task(run_until_idle(tq))

            async def past_its_limit() -> None:
                while not any(e["event"] == "taskq.sync-actor-past-limit" for e in logs):  # noqa: ASYNC110 - the consumer's own log
                    await asyncio.sleep(0.01)

            await asyncio.wait_for(past_its_limit(), 10)
            assert making.is_set()
            release.set()
            await running
            row = await tq.client.get(job.id)
    assert row is not None and row.error is not None
    assert (row.status, row.error.error_class) == ("failed", "TimeoutError")
    assert steps == ["closed"]


async def test_a_sync_actors_async_dependency_still_being_made_is_cut_at_its_limit() -> None:
    # Made on the loop while its thread waited: the limit ended the job's wait, not the
    # making (a connection from a pool with none free), so the job held its slot past
    # its limit until the cancel controller failed it, its thread left waiting for ever.
    steps: list[str] = []

    async def pooled_conn() -> AsyncIterator[_SlowConn]:
        try:
            await asyncio.Event().wait()  # no connection comes free
        except asyncio.CancelledError:
            steps.append("cut")
            raise
        yield _SlowConn()

    @actor(name="waits_for_conn", max_attempts=1, timeout=0.1)
    def waits_for_conn(payload: dict[str, Any], conn: _SlowConn) -> None:
        steps.append("body")

    providers = ProviderRegistry()
    providers.register(_SlowConn, pooled_conn, scope=Scope.TRANSIENT)
    tq = TaskQ("memory://", actors=[waits_for_conn], providers=providers)
    async with tq:
        job = await tq.client.enqueue(waits_for_conn, {})
        # Bounds a hang, not a duration: the job ends once its limit cuts the making.
        await asyncio.wait_for(run_until_idle(tq), 30)
        row = await tq.client.get(job.id)
    assert row is not None and row.error is not None
    assert (row.status, row.error.error_class) == ("failed", "TimeoutError")
    assert steps == ["cut"]


class _Pool:
    pass


async def test_a_shared_value_is_created_outside_the_context_of_the_job_that_asked() -> None:
    # It was created in a copy of the first job's context: a task it started (a pool's
    # health check) logged with that job's id, actor and attempt for the worker's life.
    seen: list[dict[str, Any]] = []
    ticked = asyncio.Event()

    async def open_pool() -> AsyncIterator[_Pool]:
        async def health() -> None:
            while True:
                seen.append(dict(structlog.contextvars.get_contextvars()))
                ticked.set()
                await asyncio.sleep(0.01)

        checking = asyncio.create_task(health())
        yield _Pool()
        checking.cancel()

    @actor(name="pooled", max_attempts=1)
    async def pooled(payload: dict[str, Any], pool: _Pool) -> None:
        await ticked.wait()

    providers = ProviderRegistry()
    providers.register(_Pool, open_pool, scope=Scope.LOOP)
    tq = TaskQ("memory://", actors=[pooled], providers=providers)
    async with tq:
        await tq.client.enqueue(pooled, {})
        await run_until_idle(tq)
    assert seen
    assert [s for s in seen if "job_id" in s] == []


async def test_a_sync_actors_values_are_closed_in_its_own_thread() -> None:
    # They were closed on the event loop's thread: a thread-bound resource (a sqlite
    # connection) refused, and a blocking close stalled every job and heartbeat.
    closed: list[tuple[str, str]] = []

    @contextmanager
    def connection() -> Iterator[sqlite3.Connection]:
        conn = sqlite3.connect(":memory:")  # usable only in the thread that made it
        try:
            yield conn
        except Exception:
            closed.append(("rollback", threading.current_thread().name))
            conn.close()
            raise
        closed.append(("commit", threading.current_thread().name))
        conn.close()

    threads: dict[bool, str] = {}

    @actor(name="reads_sqlite", max_attempts=1)
    def reads(payload: dict[str, Any], conn: sqlite3.Connection) -> int:
        threads[payload["slow"]] = threading.current_thread().name
        if payload["slow"]:
            time.sleep(0.4)  # past its timeout
        return int(conn.execute("SELECT 1").fetchone()[0])

    providers = ProviderRegistry()
    providers.register(sqlite3.Connection, connection, scope=Scope.TRANSIENT)
    tq = TaskQ("memory://", actors=[reads], providers=providers)
    async with tq:
        ok = await tq.client.enqueue(reads, {"slow": False})
        late = await tq.client.enqueue(reads, {"slow": True}, timeout=0.1)
        await run_until_idle(tq)
        ok_row, late_row = await tq.client.get(ok.id), await tq.client.get(late.id)
    assert ok_row is not None and ok_row.status is JobStatus.SUCCEEDED and ok_row.result == 1
    assert late_row is not None and late_row.status is JobStatus.FAILED
    assert late_row.error is not None and late_row.error.error_class == "TimeoutError"
    # Each closed in the thread that ran its actor; the one past its limit rolled back.
    assert sorted(closed) == sorted([("commit", threads[False]), ("rollback", threads[True])])
    assert "MainThread" not in threads.values()


async def test_a_cancel_landing_while_a_sync_actors_transaction_commits_keeps_its_outcome() -> None:
    # Its thread had returned and was committing when the forced cancel came: the job
    # ended cancelled (a stop's: handed back, to run again) with its work committed.
    committed = threading.Event()
    returned = threading.Event()

    @contextmanager
    def transaction() -> Iterator[_SyncTx]:
        yield _SyncTx()
        time.sleep(0.6)  # the commit
        committed.set()

    @actor(name="commits_slowly", max_attempts=3)
    def writes(payload: dict[str, Any], tx: _SyncTx) -> str:
        returned.set()
        return "written"

    providers = ProviderRegistry()
    providers.register(_SyncTx, transaction, scope=Scope.TRANSIENT)
    tq = TaskQ("memory://", actors=[writes], providers=providers)
    async with tq:
        job = await tq.client.enqueue(writes, {})
        graces: dict[str, Any] = {"cancellation_grace_period": "50ms", "cleanup_grace_period": "5s"}
        runner = asyncio.create_task(run_until_idle(tq, **graces))
        assert await asyncio.to_thread(returned.wait, 5)
        assert await tq.client.cancel(job.id)  # forced 50 ms after its worker sees it
        await asyncio.wait_for(runner, 10)
        row = await tq.client.get(job.id)
        attempts = await tq.client.get_attempts(job.id)
    assert committed.is_set()
    assert row is not None and row.status is JobStatus.SUCCEEDED and row.result == "written"
    assert [a.outcome for a in attempts] == ["succeeded"]


async def test_an_async_actor_behind_a_sync_decorator_fails_saying_so() -> None:
    # functools.wraps keeps no async-ness: the worker called it in a thread, got a
    # coroutine back, and failed the job as "result is not JSON-serialisable".
    import functools

    def logged(fn: Any) -> Any:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return fn(*args, **kwargs)

        return wrapper

    @actor(name="wrapped_async", max_attempts=3)
    @logged
    async def wrapped_async(payload: dict[str, Any]) -> None:
        return None

    tq = TaskQ("memory://", actors=[wrapped_async])
    async with tq:
        job = await tq.client.enqueue(wrapped_async, {})
        await run_until_idle(tq)
        row = await tq.client.get(job.id)
    assert row is not None and row.status == "failed" and row.error is not None
    assert "returned a coroutine" in row.error.message and row.attempt == 1


class _Changed(BaseModel):
    n: int
    strict: bool = False

    @model_validator(mode="after")
    def _checked(self) -> _Changed:
        if self.strict:  # a rule added after jobs were enqueued, with a bug in it
            raise TypeError("unsupported operand type(s) for +: 'int' and 'NoneType'")
        return self


async def test_a_payload_validator_raising_a_type_error_fails_the_job_with_that_error() -> None:
    # It was recorded as OutcomeNotRecorded ("the outcome could not be recorded").
    @actor(name="validated_late", max_attempts=3)
    async def validated_late(payload: _Changed) -> None:
        return None

    tq = TaskQ("memory://", actors=[validated_late])
    async with tq:
        job = await tq.backend.enqueue(
            EnqueueArgs(actor="validated_late", payload={"n": 1, "strict": True})
        )
        await run_until_idle(tq)
        row = await tq.client.get(job.id)
    assert row is not None and row.status == "failed" and row.error is not None
    assert (row.error.error_class, row.attempt) == ("TypeError", 1)


async def test_progress_no_backend_can_store_is_refused_and_forgotten() -> None:
    # Kept on the context though refused, it went with every outcome write: the job
    # failed for good (OutcomeNotRecorded), whether or not the actor carried on.
    @actor(name="carries_on", max_attempts=3)
    async def carries_on(payload: dict[str, Any], ctx: Context) -> str:
        state: dict[str, Any] = {"done": [1]}
        await ctx.progress(state)
        with pytest.raises(ValueError, match="not a JSON number"):
            await ctx.progress({"ratio": float("nan")})
        # No JSON object: a row whose progress_state failed its own model on reading.
        for shapeless in ("50%", [1, 2], 5, None):
            with pytest.raises(TypeError, match="progress must be a dict"):
                await ctx.progress(shapeless)  # type: ignore[arg-type]
        state["done"].append(float("nan"))  # not reported: not its progress
        return "done"

    @actor(name="lets_it_raise", max_attempts=3, retry_backoff=lambda _: timedelta(0))
    async def lets_it_raise(payload: dict[str, Any], ctx: Context) -> None:
        await ctx.progress({"ratio": float("inf")})

    tq = TaskQ("memory://", actors=[carries_on, lets_it_raise])
    async with tq:
        carried = await tq.client.enqueue(carries_on, {})
        raised = await tq.client.enqueue(lets_it_raise, {})
        await run_until_idle(tq)
        done, failed = await tq.client.get(carried.id), await tq.client.get(raised.id)
    assert done is not None and done.status == "succeeded"
    assert done.progress_state == {"done": [1]}
    # The actor's own error, on every attempt.
    assert failed is not None and failed.status == "failed" and failed.attempt == 3
    assert (
        failed.error is not None and failed.error.error_class == "taskq.errors.UnstorableValueError"
    )


@pytest.mark.parametrize("gate", ["actor cap", "identity", "queue cap"])
async def test_jobs_held_back_by_a_gate_start_when_it_opens_not_at_the_next_poll(
    gate: str,
) -> None:
    # Nothing else wakes a worker when such a job ends (no enqueue, no NOTIFY): they
    # drained one per poll interval. Here the poll never comes.
    @actor(name="capped_one", max_concurrent=1)
    async def capped_one(payload: dict[str, Any]) -> None:
        await asyncio.sleep(0.01)

    @actor(name="plain_one", queue="narrow")
    async def plain_one(payload: dict[str, Any]) -> None:
        await asyncio.sleep(0.01)

    chosen, options = {
        "actor cap": (capped_one, {}),
        "identity": (plain_one, {"identity_key": "one"}),
        "queue cap": (plain_one, {}),
    }[gate]
    tq = TaskQ(
        "memory://",
        actors=[capped_one, plain_one],
        queues=[QueueConfig(queue="narrow", max_concurrent=1)] if gate == "queue cap" else [],
    )
    settings = {**TEST_SETTINGS, "poll_interval": "1h", "concurrency": 4}
    async with tq:
        jobs = [await tq.client.enqueue(chosen, {}, **options) for _ in range(5)]
        worker = Worker(tq, WorkerSettings.load(settings, env={}))
        run = asyncio.create_task(worker.run())
        try:
            async with asyncio.timeout(10):
                for job in jobs:
                    while (row := await tq.client.get(job.id)) is None or not row.is_terminal:  # noqa: ASYNC110
                        await asyncio.sleep(0.01)
        finally:
            worker.stop()
            await asyncio.wait_for(run, 10)


class _LoopValue:
    pass


class _ThreadValue:
    pass


class _ProcessValue:
    pass


async def test_a_stop_cut_in_a_loop_teardown_still_closes_the_thread_and_process_scopes() -> None:
    # A LOOP teardown that a cancellation cut (here: one that raises it) skipped the
    # THREAD and PROCESS teardowns: a process-wide pool or file was never closed.
    closed: list[str] = []

    async def loop_value() -> AsyncIterator[_LoopValue]:
        yield _LoopValue()
        raise asyncio.CancelledError  # as a stop's cancellation landing here does

    def thread_value() -> Iterator[_ThreadValue]:
        yield _ThreadValue()
        closed.append("thread")

    def process_value() -> Iterator[_ProcessValue]:
        yield _ProcessValue()
        closed.append("process")

    @actor(name="uses_every_scope")
    async def uses_every_scope(
        payload: dict[str, Any], a: _LoopValue, b: _ThreadValue, c: _ProcessValue
    ) -> None:
        return None

    providers = ProviderRegistry()
    providers.register(_LoopValue, loop_value, scope=Scope.LOOP)
    providers.register(_ThreadValue, thread_value, scope=Scope.THREAD)
    providers.register(_ProcessValue, process_value, scope=Scope.PROCESS)
    tq = TaskQ("memory://", actors=[uses_every_scope], providers=providers)
    async with tq:
        await tq.client.enqueue(uses_every_scope, {})
        with pytest.raises(asyncio.CancelledError):
            await run_until_idle(tq, timeout=10)
    assert closed == ["thread", "process"]


class _ThreadDb:
    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn


async def test_thread_values_of_sync_actors_are_closed_in_their_own_threads() -> None:
    # A THREAD-scoped sqlite connection (the scope's textbook use) was closed on the
    # loop's thread at stop: sqlite refused it (ProgrammingError, logged) and the
    # connection was never closed.
    made: dict[int, str] = {}
    closed_in: list[tuple[int, int]] = []

    def thread_db() -> Iterator[_ThreadDb]:
        made[threading.get_ident()] = threading.current_thread().name
        conn = sqlite3.connect(":memory:")
        yield _ThreadDb(conn)
        closed_in.append((threading.get_ident(), id(conn)))
        conn.close()  # ProgrammingError in any other thread

    @actor(name="uses_thread_db")
    def uses_thread_db(payload: dict[str, Any], db: _ThreadDb) -> int:
        time.sleep(0.05)  # several at once: each in a thread of its own
        return int(db.conn.execute("select 1").fetchone()[0])

    providers = ProviderRegistry()
    providers.register(_ThreadDb, thread_db, scope=Scope.THREAD)
    tq = TaskQ("memory://", actors=[uses_thread_db], providers=providers)
    async with tq:
        jobs = [await tq.client.enqueue(uses_thread_db, {}) for _ in range(6)]
        with structlog.testing.capture_logs() as logs:
            await run_until_idle(tq, timeout=10, concurrency=3)
        assert [await tq.client.wait_for_result(j.id, timeout=0) for j in jobs] == [1] * 6
    assert len(made) > 1, "the jobs ran in one thread: the test shows nothing"
    assert all(name.startswith("taskq-sync-actor") for name in made.values())
    assert sorted(thread for thread, _ in closed_in) == sorted(made)
    failures = [e for e in logs if e["event"].startswith("taskq.di-teardown")]
    assert failures == []


async def test_a_stop_cancelled_while_thread_values_close_still_closes_the_process_scope() -> None:
    # The sync actors' THREAD values close in their threads, an await of the stop's: a
    # cancellation landing there skipped every scope's close after it.
    closing = threading.Event()
    closed: list[str] = []

    def thread_value() -> Iterator[_ThreadValue]:
        yield _ThreadValue()
        closing.set()
        time.sleep(0.5)
        closed.append("thread")

    def process_value() -> Iterator[_ProcessValue]:
        yield _ProcessValue()
        closed.append("process")

    @actor(name="uses_thread_and_process")
    def uses_both(payload: dict[str, Any], a: _ThreadValue, b: _ProcessValue) -> None:
        return None

    providers = ProviderRegistry()
    providers.register(_ThreadValue, thread_value, scope=Scope.THREAD)
    providers.register(_ProcessValue, process_value, scope=Scope.PROCESS)
    tq = TaskQ("memory://", actors=[uses_both], providers=providers)
    async with tq:
        job = await tq.client.enqueue(uses_both, {})
        worker = Worker(tq, WorkerSettings.load(dict(TEST_SETTINGS), env={}))
        run = asyncio.create_task(worker.run())
        await tq.client.wait_for_result(job.id, timeout=10)
        worker.stop()
        assert await asyncio.to_thread(closing.wait, 10)
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run
    assert "process" in closed


async def test_until_idle_ends_when_only_jobs_of_unknown_actors_are_left() -> None:
    import structlog.testing

    from taskq.models import EnqueueArgs

    tq = TaskQ("memory://", actors=[add])
    async with tq:
        # Enqueued by another application (the backend takes any actor name).
        ghost = await tq.backend.enqueue(EnqueueArgs(actor="ghost.actor"))
        known = await tq.client.enqueue(add, {"a": 1, "b": 2})
        with (
            structlog.testing.capture_logs() as logs,
            pytest.raises(
                UnknownActorError, match="does not define wait in its queues: 'ghost.actor'"
            ),
        ):
            await run_until_idle(tq, timeout=10)  # would wait for the ghost job forever
        assert await tq.client.wait_for_result(known.id, timeout=0) == 3
        # Left for a worker that knows its actor: never locked, nor handed back.
        assert await tq.client.get(ghost.id) == ghost
        assert await tq.client.get_attempts(ghost.id) == []
    errors = [e for e in logs if e["event"] == "taskq.idle-but-jobs-of-unknown-actors"]
    assert [e["actors"] for e in errors] == [["ghost.actor"]]  # once, not per reading


class _NoActorDispatch(InMemoryBackend):
    """A backend without ``SupportsActorDispatch`` (a third-party one, say): the worker
    dispatches every actor's jobs, and hands back those of actors it does not know."""

    dispatch_actors_batch = None  # type: ignore[assignment]


async def test_without_actor_dispatch_a_job_of_an_unknown_actor_is_handed_back() -> None:
    import structlog.testing

    from taskq.backend import SupportsActorDispatch
    from taskq.models import EnqueueArgs

    backend = _NoActorDispatch()
    assert not isinstance(backend, SupportsActorDispatch)
    tq = TaskQ("memory://", actors=[add], backend=backend)
    async with tq:
        ghost = await tq.backend.enqueue(EnqueueArgs(actor="ghost.actor"))
        known = await tq.client.enqueue(add, {"a": 1, "b": 2})
        with structlog.testing.capture_logs() as logs, pytest.raises(UnknownActorError):
            await run_until_idle(tq, timeout=10)  # would bounce the ghost job forever
        assert await tq.client.wait_for_result(known.id, timeout=0) == 3
        row = await tq.client.get(ghost.id)
        assert row is not None and row.status is not JobStatus.RUNNING
        # Its history says why it did not run (it read as a rate-limit denial).
        bounces = {a.outcome for a in await tq.client.get_attempts(ghost.id)}
        assert bounces == {"unknown_actor"}
        assert row.max_attempts == 3 + row.attempt  # none of its attempts was used
    errors = [e for e in logs if e["event"] == "taskq.idle-but-jobs-of-unknown-actors"]
    assert errors and all(e["actors"] == ["ghost.actor"] for e in errors)


async def test_the_batch_prune_cutoff_comes_from_the_backends_clock_not_the_hosts() -> None:
    from datetime import UTC, datetime
    from types import SimpleNamespace
    from uuid import uuid4

    from taskq.backend import FakeClock
    from taskq.worker.maintenance import prune_once

    clock = FakeClock(datetime(2031, 1, 1, tzinfo=UTC))  # years ahead of this host
    backend = InMemoryBackend(clock=clock)
    await backend.open()
    batch = uuid4()
    await backend.create_batch(batch, "q", 0, None, None, None)
    await backend.complete_batch(batch)
    settings = WorkerSettings.load({}, env={})
    state: Any = SimpleNamespace(settings=settings, backend=backend)
    assert (await prune_once(state, backend))["batches_pruned"] == 0  # completed just now
    clock.advance(min(settings.prune_retention.values()) + timedelta(days=1))
    assert (await prune_once(state, backend))["batches_pruned"] == 1
    assert await backend.get_batch(batch) is None


class _SlowToConfirm(InMemoryBackend):
    """Leads at once; every later confirmation hangs (a slow database) until cancelled."""

    def leader_elector(self, worker_id: UUID, *, lease: timedelta) -> Any:
        calls = 0

        class Elector:
            async def try_acquire(self) -> bool:
                nonlocal calls
                calls += 1
                if calls > 1:
                    await asyncio.sleep(3600)
                return True

            async def release(self) -> None:
                return None

        return Elector()


async def test_a_stop_during_a_leadership_check_steps_down_without_a_lost_warning() -> None:
    from structlog.testing import capture_logs

    @actor(name="quick")
    async def quick(payload: dict[str, Any]) -> None:
        await asyncio.sleep(0.3)  # the election loop is inside its second check by then

    tq = TaskQ("memory://", actors=[quick], backend=_SlowToConfirm())
    async with tq:
        await tq.client.enqueue(quick, {})
        with capture_logs() as logs:
            await run_until_idle(tq)
    events = [entry["event"] for entry in logs]
    assert "taskq.leader-elected" in events
    assert "taskq.leader-stepped-down" in events
    assert "taskq.leader-lost" not in events


async def test_a_prefetched_jobs_wait_for_a_slot_comes_out_of_its_deadline() -> None:
    # Its limit was counted from its dispatch as if it started then: a job that waited
    # behind another ran past its schedule_to_close by as long as it waited.
    release = asyncio.Event()

    @actor(name="holds_the_only_slot")
    async def holds(payload: dict[str, Any]) -> None:
        await release.wait()

    @actor(name="due_soon", max_attempts=1)
    async def due_soon(payload: dict[str, Any]) -> str:
        await asyncio.sleep(1.0)
        return "too late"

    tq = TaskQ("memory://", actors=[holds, due_soon])
    async with tq:
        await tq.client.enqueue(holds, {})
        late = await tq.client.enqueue(due_soon, {}, schedule_to_close=1.5)
        runner = asyncio.create_task(run_until_idle(tq, concurrency=1, prefetch=1))
        await asyncio.sleep(1.0)  # dispatched at once, waiting here for the slot
        release.set()
        await asyncio.wait_for(runner, 10)
        row = await tq.client.get(late.id)
    assert row is not None and row.status is JobStatus.FAILED
    assert row.error is not None and row.error.error_class == "DeadlineExceeded"


async def test_a_job_running_into_its_deadline_fails_without_another_attempt() -> None:
    @actor(name="slow_past_deadline", max_attempts=3)
    async def slow(payload: dict[str, Any]) -> None:
        await asyncio.sleep(5)

    tq = TaskQ("memory://", actors=[slow])
    async with tq:
        job = await tq.client.enqueue(slow, {}, schedule_to_close=timedelta(milliseconds=300))
        await run_until_idle(tq, timeout=4)
        row = await tq.client.get(job.id)
        assert row is not None and row.status is JobStatus.FAILED
        assert row.error is not None and row.error.error_class == "DeadlineExceeded"
        assert len(await tq.client.get_attempts(job.id)) == 1


@actor(name="swallows_its_limit", max_attempts=1)
async def swallows(payload: dict[str, Any]) -> str:
    try:
        await asyncio.sleep(5)
    except asyncio.CancelledError:
        await asyncio.sleep(0.3)  # ignores the limit's cancellation, then returns
    return "done anyway"


@pytest.mark.parametrize(
    ("options", "error_class"),
    [
        ({"timeout": 0.2}, "TimeoutError"),
        ({"schedule_to_close": timedelta(milliseconds=200)}, "DeadlineExceeded"),
    ],
    ids=["timeout", "deadline"],
)
async def test_an_actor_that_swallows_its_limits_cancellation_still_fails_by_it(
    options: dict[str, Any], error_class: str
) -> None:
    # It ended succeeded, its limit never enforced (a sync actor past it failed).
    tq = TaskQ("memory://", actors=[swallows])
    async with tq:
        job = await tq.client.enqueue(swallows, {}, **options)
        await run_until_idle(tq, timeout=4)
        row = await tq.client.get(job.id)
        attempts = await tq.client.get_attempts(job.id)
    assert row is not None and row.status is JobStatus.FAILED and row.result is None
    assert row.error is not None and row.error.error_class == error_class
    assert [a.outcome for a in attempts] == ["failed"]


class _NoDeadlineSweep(InMemoryBackend):
    """The leader's deadline sweep never runs: only the worker can notice a deadline."""

    async def deadline_sweep(self, **kwargs: Any) -> int:
        return 0


async def test_a_job_dispatched_past_its_deadline_is_failed_not_run() -> None:
    ran: list[str] = []

    @actor(name="late")
    async def late(payload: dict[str, Any]) -> None:
        ran.append("ran")

    tq = TaskQ("memory://", actors=[late], backend=_NoDeadlineSweep())
    async with tq:
        job = await tq.client.enqueue(late, {}, schedule_to_close=timedelta(milliseconds=50))
        await asyncio.sleep(0.1)
        await run_until_idle(tq)
        row = await tq.client.get(job.id)
    assert ran == []
    assert row is not None and row.status is JobStatus.FAILED
    assert row.error is not None and row.error.error_class == "DeadlineExceeded"


async def test_a_timed_out_sync_attempt_is_not_retried_while_its_thread_runs() -> None:
    import time

    from taskq.retry import FixedBackoff

    spans: list[tuple[float, float]] = []

    @actor(name="sync_slow", max_attempts=2, timeout=0.2, retry_backoff=FixedBackoff(timedelta(0)))
    def sync_slow(payload: dict[str, Any]) -> None:
        started = time.monotonic()
        time.sleep(0.8)
        spans.append((started, time.monotonic()))

    tq = TaskQ("memory://", actors=[sync_slow])
    async with tq:
        job = await tq.client.enqueue(sync_slow, {})
        await run_until_idle(tq, timeout=10)
        row = await tq.client.get(job.id)
        attempts = await tq.client.get_attempts(job.id)
    assert row is not None and row.status is JobStatus.FAILED
    assert [a.error.error_class if a.error else None for a in attempts] == ["TimeoutError"] * 2
    first, second = sorted(spans)
    assert second[0] >= first[1]  # the retry began once the first thread had returned


_SHORT_STOP = {
    **TEST_SETTINGS,
    "drain_grace_period": "100ms",
    "cancellation_grace_period": "100ms",
    "cleanup_grace_period": "100ms",
    "termination_grace_period": "6s",
}


async def test_a_stop_keeps_writing_the_outcome_of_a_job_that_finished() -> None:
    from taskq.worker import Worker

    began, finished = asyncio.Event(), asyncio.Event()

    @actor(name="finishes_in_drain")
    async def finishes(payload: dict[str, Any]) -> str:
        began.set()
        await asyncio.sleep(0.3)
        finished.set()
        return "done"

    backend = WritesFailWhileAway()
    tq = TaskQ("memory://", actors=[finishes], backend=backend)
    async with tq:
        job = await tq.client.enqueue(finishes, {})
        settings = {**_SHORT_STOP, "drain_grace_period": "1s", "queues": ["default"]}
        worker = Worker(tq, WorkerSettings.load(settings, env={}))
        running = asyncio.create_task(worker.run())
        await asyncio.wait_for(began.wait(), 5)  # it finishes within the drain grace
        backend.away = True
        worker.stop()
        await finished.wait()
        await asyncio.sleep(1.5)  # past every grace but the hard wall: still retrying
        backend.away = False
        await asyncio.wait_for(running, 10)
        row = await tq.client.get(job.id)
    assert backend.failed_writes > 0
    assert row is not None and row.status is JobStatus.SUCCEEDED


async def test_marking_a_job_abandoned_at_the_stop_retries_a_lost_connection() -> None:
    from taskq.worker import Worker

    started = asyncio.Event()

    @actor(name="stubborn_until")
    async def stubborn(payload: dict[str, Any]) -> None:
        started.set()
        loop = asyncio.get_running_loop()
        end = loop.time() + 2.5
        while loop.time() < end:
            try:
                await asyncio.sleep(0.05)
            except asyncio.CancelledError:
                continue  # ignores every cancellation for a while

    backend = WritesFailWhileAway()
    tq = TaskQ("memory://", actors=[stubborn], backend=backend)
    async with tq:
        job = await tq.client.enqueue(stubborn, {})
        worker = Worker(tq, WorkerSettings.load({**_SHORT_STOP, "queues": ["default"]}, env={}))
        running = asyncio.create_task(worker.run())
        await asyncio.wait_for(started.wait(), 5)
        await tq.client.cancel(job.id)
        worker.stop()
        backend.away = True
        asyncio.get_running_loop().call_later(0.6, setattr, backend, "away", False)
        await asyncio.wait_for(running, 10)  # no transient error escapes the stop
        row = await tq.client.get(job.id)
        await asyncio.gather(*worker.lingering_tasks(), return_exceptions=True)
    assert backend.failed_writes > 0
    assert row is not None and row.status is JobStatus.ABANDONED


async def test_a_worker_told_no_queues_works_those_of_its_apps_actors() -> None:
    # With "default" alone, `taskq-worker app:tq` left the jobs of an actor on another
    # queue pending, and exited idle at once with --until-idle.
    @actor(name="resize", queue="images")
    async def resize(payload: dict[str, Any]) -> str:
        return "resized"

    tq = TaskQ("memory://", actors=[resize], queues=[QueueConfig(queue="fair")])
    async with tq:
        job = await tq.client.enqueue(resize, {})
        worker = Worker(tq, WorkerSettings.load({**TEST_SETTINGS, "until_idle": True}, env={}))
        await asyncio.wait_for(worker.run(), 10)
        row = await tq.client.get(job.id)
    assert worker.settings.queues == ["default", "fair", "images"]
    assert row is not None and (row.status, row.result) == (JobStatus.SUCCEEDED, "resized")
    # Named queues stay as named.
    told = WorkerSettings.load({"queues": "images"}, env={})
    assert Worker(tq, told).settings.queues == ["images"]


async def _ended_after_a_reclaim(
    backend: InMemoryBackend, clock: Any, name: str, ending: Exception | None
) -> tuple[JobRow | None, list[Any], list[Any]]:
    """One job of an actor ``name`` that ends (returns, or raises ``ending``) just as the
    reclaim takes it, its lease lapsed unseen on ``clock`` (``backend``'s): its row,
    attempts and events once the worker is done."""
    taken = asyncio.Event()
    release = asyncio.Event()

    @actor(name=name, max_attempts=1)
    async def ender(payload: dict[str, Any]) -> str:
        taken.set()
        await release.wait()
        if ending is not None:
            raise ending
        return "done"

    tq = TaskQ("memory://", actors=[ender], backend=backend)
    async with tq:
        job = await tq.client.enqueue(ender, {})
        running = asyncio.create_task(run_until_idle(tq, **_RARE_HEARTBEATS))
        await asyncio.wait_for(taken.wait(), 5)
        # Its lease lapses unseen (no heartbeat in between) and the reclaim takes it, as
        # the actor finishes: the worker has not run since (a frozen process's view).
        clock.advance(timedelta(minutes=5))
        release.set()
        assert await backend.reclaim_expired_locks(timedelta(0), timedelta(0)) == 1
        await asyncio.wait_for(running, 10)
        return (
            await tq.client.get(job.id),
            await tq.client.get_attempts(job.id),
            await tq.client.get_events(job.id),
        )


@pytest.mark.parametrize(
    ("ending", "outcome"),
    [
        (None, "succeeded"),
        (Snooze(timedelta(seconds=30)), "snoozed"),
        (RetryAfter(timedelta(seconds=30)), "retry_after"),
    ],
    ids=["success", "snooze", "retry_after"],
)
async def test_an_outcome_refused_after_a_reclaim_is_kept_as_a_late_outcome_event(
    ending: Exception | None, outcome: str
) -> None:
    # A worker frozen or cut off past its lease: the reclaim recorded the attempt
    # crashed, and the run's end was only a log line. The history said the job crashed;
    # it had in fact finished (or asked to run again later).
    from taskq.backend.clock import FakeClock

    clock = FakeClock()
    done, attempts, events = await _ended_after_a_reclaim(
        InMemoryBackend(clock=clock), clock, "late.ender", ending
    )
    assert done is not None and done.status is JobStatus.CRASHED  # the reclaim's verdict
    assert [a.outcome for a in attempts] == ["crashed"]
    [late] = [e for e in events if e.kind == "late_outcome"]
    assert late.detail == {
        "attempt": 1,
        "worker_id": str(attempts[0].worker_id),
        "outcome": outcome,
    }


async def test_a_late_outcome_whose_reply_was_lost_is_kept_once() -> None:
    # Its write landed and the reply was lost (a transient error): the retry wrote it
    # again, and the history said twice that the attempt came late.
    from taskq.backend.clock import FakeClock

    class LateReplyLost(InMemoryBackend):
        lost = False

        async def record_late_outcome(self, *args: Any, **kwargs: Any) -> bool:
            kept = await super().record_late_outcome(*args, **kwargs)
            if not self.lost:
                self.lost = True
                raise ConnectionResetError("reply lost")
            return kept

    clock = FakeClock()
    backend = LateReplyLost(clock=clock)
    _, _, events = await _ended_after_a_reclaim(backend, clock, "late.reply_lost", None)
    assert backend.lost
    assert [e.detail["outcome"] for e in events if e.kind == "late_outcome"] == ["succeeded"]


async def test_a_snooze_whose_reply_was_lost_is_no_late_outcome() -> None:
    # The snooze committed and its reply was lost: the retry found the job no longer
    # running, yet the attempt's own row says it was snoozed: no late outcome.
    from taskq.backend.clock import FakeClock

    answered = asyncio.Event()

    class LostReply(InMemoryBackend):
        lost = 1

        async def mark_snoozed(self, *args: Any, **kwargs: Any) -> Any:
            done = await super().mark_snoozed(*args, **kwargs)
            if self.lost:
                self.lost -= 1
                raise ConnectionResetError("the reply was lost")
            answered.set()
            return done

    runs: list[int] = []

    @actor(name="snoozes.once", max_attempts=1)
    async def snoozes(payload: dict[str, Any]) -> None:
        runs.append(1)
        if len(runs) == 1:
            raise Snooze(timedelta(minutes=5))

    clock = FakeClock()
    backend = LostReply(clock=clock)
    tq = TaskQ("memory://", actors=[snoozes], backend=backend)
    async with tq:
        job = await tq.client.enqueue(snoozes, {})
        # No heartbeat while the write is retried, to find the job gone and stop it.
        slow = _RARE_HEARTBEATS
        running = asyncio.create_task(run_until_idle(tq, **slow))
        await asyncio.wait_for(answered.wait(), 5)
        clock.advance(timedelta(minutes=10))
        await asyncio.wait_for(running, 10)
        row = await tq.client.get(job.id)
        events = await tq.client.get_events(job.id)
    assert backend.lost == 0  # the reply was lost
    assert row is not None and row.status is JobStatus.SUCCEEDED
    assert [e for e in events if e.kind == "late_outcome"] == []


async def test_a_failure_whose_reply_was_lost_is_no_late_outcome_once_the_job_runs_again() -> None:
    # The retry committed and its reply was lost, and another worker took the job
    # before the write was tried again: that try found the job on attempt 2 and the
    # worker took its own write for another's, adding a late outcome to a history
    # whose attempt 1 already said it failed.
    other = uuid4()
    moved_on = asyncio.Event()

    class LostReply(InMemoryBackend):
        lost = 1

        async def mark_failed_or_retry(self, *args: Any, **kwargs: Any) -> Any:
            done = await super().mark_failed_or_retry(*args, **kwargs)
            if self.lost:
                self.lost -= 1
                # Before the reply is lost, another worker takes the retry.
                assert await self.dispatch_batch(other, ["default"], 1, timedelta(minutes=5))
                raise ConnectionResetError("the reply was lost")
            moved_on.set()
            return done

    @actor(name="fails.once", max_attempts=2, retry_backoff=FixedBackoff(timedelta(0)))
    async def fails(payload: dict[str, Any]) -> None:
        raise ValueError("boom")

    backend = LostReply()
    tq = TaskQ("memory://", actors=[fails], backend=backend)
    async with tq:
        job = await tq.client.enqueue(fails, {})
        slow = _RARE_HEARTBEATS
        running = asyncio.create_task(run_until_idle(tq, **slow))
        await asyncio.wait_for(moved_on.wait(), 5)
        assert await backend.mark_succeeded(job.id, other, None)
        await asyncio.wait_for(running, 10)
        row = await tq.client.get(job.id)
        events = await tq.client.get_events(job.id)
        attempts = await tq.client.get_attempts(job.id)
    assert backend.lost == 0
    assert row is not None and row.status is JobStatus.SUCCEEDED
    assert [a.outcome for a in attempts] == ["failed", "succeeded"]
    assert [e.detail for e in events if e.kind == "late_outcome"] == []


def _reclaimed_before(
    method: str, clock: Any, *, outcome: str | None = None, away: bool = False
) -> Any:
    """An in-memory backend whose first ``method`` write (of ``outcome``, if given) meets
    the job reclaimed: its lease lapsed unseen (the worker frozen or cut off) and the
    reclaim took it just before the write. ``away``: that write fails (the database
    away), so the worker's heartbeat finds the job lost before the write's next try.
    ``reclaimed`` counts the jobs it took."""

    class ReclaimedFirst(InMemoryBackend):
        reclaimed: int | None = None

        async def _reclaim_once(self, kwargs: dict[str, Any]) -> None:
            if self.reclaimed is None and kwargs.get("outcome", outcome) == outcome:
                clock.advance(timedelta(hours=1))  # past any lease and cancel grace
                self.reclaimed = await self.reclaim_expired_locks(timedelta(0), timedelta(0))
                if away:
                    raise ConnectionRefusedError("database away")

        async def mark_failed_or_retry(self, *args: Any, **kwargs: Any) -> Any:
            if method == "mark_failed_or_retry":
                await self._reclaim_once(kwargs)
            return await super().mark_failed_or_retry(*args, **kwargs)

        async def mark_abandoned(self, *args: Any, **kwargs: Any) -> bool:
            if method == "mark_abandoned":
                await self._reclaim_once(kwargs)
            return await super().mark_abandoned(*args, **kwargs)

        async def mark_snoozed(self, *args: Any, **kwargs: Any) -> Any:
            if method == "mark_snoozed":
                await self._reclaim_once(kwargs)
            return await super().mark_snoozed(*args, **kwargs)

    return ReclaimedFirst(clock=clock)


def _ignores_cancellation(name: str, started: asyncio.Event, **options: Any) -> Any:
    """An actor (one attempt) that ignores every cancellation for a second."""

    @actor(name=name, max_attempts=1, **options)
    async def stubborn(payload: dict[str, Any]) -> str:
        started.set()
        loop = asyncio.get_running_loop()
        end = loop.time() + 1.0
        while loop.time() < end:
            try:
                await asyncio.sleep(0.02)
            except asyncio.CancelledError:
                continue
        return "late"

    return stubborn


_CANCEL_GRACES = {"cancellation_grace_period": "100ms", "cleanup_grace_period": "100ms"}


@pytest.mark.parametrize("away", [False, True], ids=["refused", "found_lost"])
async def test_a_failure_past_a_limit_refused_after_a_reclaim_is_kept_as_a_late_outcome(
    away: bool,
) -> None:
    # The cancel controller's write-off of an attempt still running past its timeout met
    # the job reclaimed: the history said only that the attempt crashed. "found_lost":
    # the write failed (the database away) and the heartbeat found the lock lost before
    # its next try, which was then skipped without a word.
    from taskq.backend.clock import FakeClock

    clock = FakeClock()
    backend = _reclaimed_before("mark_failed_or_retry", clock, away=away)
    started = asyncio.Event()
    stubborn = _ignores_cancellation("late.past_its_timeout", started, timeout=0.1)
    tq = TaskQ("memory://", actors=[stubborn], backend=backend)
    async with tq:
        job = await tq.client.enqueue(stubborn, {})
        settings = {**TEST_SETTINGS, **_CANCEL_GRACES, "queues": ["default"], "until_idle": True}
        worker = Worker(tq, WorkerSettings.load(settings, env={}))
        await asyncio.wait_for(worker.run(), 10)
        await asyncio.gather(*worker.lingering_tasks())
        row = await tq.client.get(job.id)
        attempts = await tq.client.get_attempts(job.id)
        events = await tq.client.get_events(job.id)
    assert backend.reclaimed == 1
    assert row is not None and row.status is JobStatus.CRASHED  # the reclaim's verdict
    assert [a.outcome for a in attempts] == ["crashed"]
    [late] = [e.detail for e in events if e.kind == "late_outcome"]
    assert late["outcome"] == "failed" and late["error_class"] == "TimeoutError"
    assert "still running" in late["error_message"]
    assert (late["attempt"], late["worker_id"]) == (1, str(attempts[0].worker_id))


async def _cancel_a_stubborn_job(backend: InMemoryBackend, name: str) -> tuple[Any, ...]:
    """A job a user cancelled while it ran, its actor ignoring every cancellation, so
    that the heartbeat's cancel controller abandons it (short graces), the worker
    running until idle. The job, its row, attempts and events."""
    started = asyncio.Event()
    stubborn = _ignores_cancellation(name, started)
    tq = TaskQ("memory://", actors=[stubborn], backend=backend)
    async with tq:
        job = await tq.client.enqueue(stubborn, {})
        settings = {**TEST_SETTINGS, **_CANCEL_GRACES, "queues": ["default"], "until_idle": True}
        worker = Worker(tq, WorkerSettings.load(settings, env={}))
        running = asyncio.create_task(worker.run())
        await asyncio.wait_for(started.wait(), 5)
        assert await tq.client.cancel(job.id)
        await asyncio.wait_for(running, 10)
        await asyncio.gather(*worker.lingering_tasks())
        row = await tq.client.get(job.id)
        attempts = await tq.client.get_attempts(job.id)
        events = await tq.client.get_events(job.id)
    return job, row, attempts, events


@pytest.mark.parametrize("away", [False, True], ids=["refused", "found_lost"])
async def test_an_abandonment_refused_after_a_reclaim_is_kept_as_a_late_outcome(away: bool) -> None:
    # A cancelled job whose actor ignored its forced cancel: the abandonment met the job
    # reclaimed, and the history said only what the reclaim made of it (cancelled).
    # "found_lost" as for a failure past a limit.
    from taskq.backend.clock import FakeClock

    clock = FakeClock()
    backend = _reclaimed_before("mark_abandoned", clock, away=away)
    _, row, attempts, events = await _cancel_a_stubborn_job(backend, "late.abandoned")
    assert backend.reclaimed == 1
    assert row is not None and row.status is JobStatus.CANCELLED  # the reclaim's verdict
    assert [a.outcome for a in attempts] == ["crashed"]
    [late] = [e.detail for e in events if e.kind == "late_outcome"]
    assert late == {"attempt": 1, "worker_id": str(attempts[0].worker_id), "outcome": "abandoned"}


async def test_an_abandonment_whose_reply_was_lost_is_no_late_outcome(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The abandonment committed and its reply was lost: by the next tick the heartbeat
    # found the job no longer running, yet the attempt's own row says it was abandoned.
    # That end is the worker's own: its batch hears of it (it never did).
    import taskq.worker.cancel

    applied: list[tuple[object, str]] = []

    async def apply(backend: Any, row: Any, outcome: str) -> None:
        applied.append((row.id, outcome))

    monkeypatch.setattr(taskq.worker.cancel, "apply_batch_terminal_outcome", apply)

    class LostReply(InMemoryBackend):
        lost = 1

        async def mark_abandoned(self, *args: Any, **kwargs: Any) -> bool:
            done = await super().mark_abandoned(*args, **kwargs)
            if self.lost:
                self.lost -= 1
                raise ConnectionResetError("the reply was lost")
            return done

    backend = LostReply()
    job, row, _, events = await _cancel_a_stubborn_job(backend, "abandoned.reply_lost")
    assert backend.lost == 0  # the reply was lost
    assert row is not None and row.status is JobStatus.ABANDONED
    assert [e.detail for e in events if e.kind == "late_outcome"] == []
    assert applied == [(job.id, "abandoned")]


async def test_a_shutdown_hand_back_refused_after_a_reclaim_is_kept_as_a_late_outcome() -> None:
    # A stop interrupted the job, and its hand-back met the job reclaimed: only a log
    # line said so, and the history said the attempt crashed.
    from taskq.backend.clock import FakeClock

    clock = FakeClock()
    backend = _reclaimed_before("mark_snoozed", clock, outcome="interrupted")
    started = asyncio.Event()

    @actor(name="late.interrupted", max_attempts=1)
    async def stops(payload: dict[str, Any], ctx: Context) -> str:
        started.set()
        await ctx.cancel_event.wait()
        return "stopped"

    tq = TaskQ("memory://", actors=[stops], backend=backend)
    async with tq:
        job = await tq.client.enqueue(stops, {})
        settings = {**TEST_SETTINGS, "drain_grace_period": "100ms", "queues": ["default"]}
        worker = Worker(tq, WorkerSettings.load(settings, env={}))
        running = asyncio.create_task(worker.run())
        await asyncio.wait_for(started.wait(), 5)
        worker.stop()
        await asyncio.wait_for(running, 10)
        row = await tq.client.get(job.id)
        attempts = await tq.client.get_attempts(job.id)
        events = await tq.client.get_events(job.id)
    assert backend.reclaimed == 1
    assert row is not None and row.status is JobStatus.CRASHED  # the reclaim's verdict
    assert [a.outcome for a in attempts] == ["crashed"]
    [late] = [e.detail for e in events if e.kind == "late_outcome"]
    assert late == {
        "attempt": 1,
        "worker_id": str(attempts[0].worker_id),
        "outcome": "interrupted",
    }


def _cancelled_then_stubborn(name: str, started: asyncio.Event, observed: asyncio.Event) -> Any:
    """An actor (one attempt) that runs until it sees its cancel, then ignores every
    cancellation for a second and a half."""

    @actor(name=name, max_attempts=1)
    async def stubborn(payload: dict[str, Any], ctx: Context) -> str:
        started.set()
        await ctx.cancel_event.wait()
        observed.set()
        loop = asyncio.get_running_loop()
        end = loop.time() + 1.5
        while loop.time() < end:
            try:
                await asyncio.sleep(0.02)
            except asyncio.CancelledError:
                continue
        return "late"

    return stubborn


async def _stop_a_cancelled_stubborn_job(backend: InMemoryBackend, name: str) -> tuple[Any, ...]:
    """A job a user cancelled, its actor ignoring it, met by a stop (a second signal: no
    drain or cooperative wait), so that the stop's own ABANDONING writes it off; the
    heartbeat's cancel controller, given a long grace, never does. Its row, attempts and
    events, and the worker's log."""
    started, observed = asyncio.Event(), asyncio.Event()
    stubborn = _cancelled_then_stubborn(name, started, observed)
    tq = TaskQ("memory://", actors=[stubborn], backend=backend)
    settings = {
        **TEST_SETTINGS,
        "cancellation_grace_period": "30s",
        "cleanup_grace_period": "100ms",
        "termination_grace_period": "60s",
        "queues": ["default"],
    }
    async with tq:
        job = await tq.client.enqueue(stubborn, {})
        worker = Worker(tq, WorkerSettings.load(settings, env={}))
        running = asyncio.create_task(worker.run())
        await asyncio.wait_for(started.wait(), 5)
        assert await tq.client.cancel(job.id)
        await asyncio.wait_for(observed.wait(), 5)  # the worker heard of the cancel
        with structlog.testing.capture_logs() as logs:
            worker.stop()
            worker.escalate()
            await asyncio.wait_for(running, 10)
        await asyncio.gather(*worker.lingering_tasks())
        row = await tq.client.get(job.id)
        attempts = await tq.client.get_attempts(job.id)
        events = await tq.client.get_events(job.id)
    return row, attempts, events, [entry["event"] for entry in logs]


async def test_a_stops_abandonment_refused_after_a_reclaim_is_kept_as_a_late_outcome() -> None:
    # The stop's own abandonment of a user-cancelled job that ignored its cancel met the
    # job reclaimed: only taskq.abandon-not-written was logged, and the history said only
    # what the reclaim made of it (cancelled, the attempt crashed).
    from taskq.backend.clock import FakeClock

    clock = FakeClock()
    backend = _reclaimed_before("mark_abandoned", clock)
    row, attempts, events, logs = await _stop_a_cancelled_stubborn_job(
        backend, "late.stop_abandoned"
    )
    assert backend.reclaimed == 1
    assert row is not None and row.status is JobStatus.CANCELLED  # the reclaim's verdict
    assert [a.outcome for a in attempts] == ["crashed"]
    [late] = [e.detail for e in events if e.kind == "late_outcome"]
    assert late == {"attempt": 1, "worker_id": str(attempts[0].worker_id), "outcome": "abandoned"}
    assert "taskq.abandon-not-written" not in logs


async def test_a_stops_abandonment_without_phase_2_is_no_late_outcome() -> None:
    # The same write refused with the job still this worker's at this attempt, its phase
    # 2 never stored (that write refused): nothing was taken away, so no late outcome.
    class PhaseTwoRefused(InMemoryBackend):
        async def write_cancel_escalation(self, *args: Any, **kwargs: Any) -> bool:
            return False

    backend = PhaseTwoRefused()
    row, attempts, events, logs = await _stop_a_cancelled_stubborn_job(backend, "stop.no_phase_2")
    assert row is not None and row.status is JobStatus.RUNNING  # left for the reclaim
    assert attempts == []  # the attempt not ended
    assert [e for e in events if e.kind == "late_outcome"] == []
    assert "taskq.abandon-not-written" in logs


async def test_an_abandonment_written_by_both_the_controller_and_the_stop_is_one_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The cancel controller's abandonment was under way when the stop's ABANDONING wrote
    # the same job off: the stop's, refused, read the attempt's row, found it abandoned
    # (by the controller) and took that for an earlier try of its own, its reply lost,
    # so the batch hook ran twice for one end.
    from taskq.worker import cancel, shutdown

    hooks: list[str] = []

    async def hook(backend: Any, row: Any, outcome: str) -> None:
        hooks.append(outcome)

    monkeypatch.setattr(cancel, "apply_batch_terminal_outcome", hook)
    monkeypatch.setattr(shutdown, "apply_batch_terminal_outcome", hook)
    first_call, second_call, first_done = asyncio.Event(), asyncio.Event(), asyncio.Event()

    class Racing(InMemoryBackend):
        calls = 0

        async def mark_abandoned(self, *args: Any, **kwargs: Any) -> bool:
            self.calls += 1
            if self.calls == 1:  # the controller's, under way when the stop writes too
                first_call.set()
                await second_call.wait()
                written = await super().mark_abandoned(*args, **kwargs)
                first_done.set()
                return written
            second_call.set()  # the stop's: it lands just after the controller's
            await first_done.wait()
            return await super().mark_abandoned(*args, **kwargs)

    started, observed = asyncio.Event(), asyncio.Event()
    stubborn = _cancelled_then_stubborn("both.abandon", started, observed)
    backend = Racing()
    tq = TaskQ("memory://", actors=[stubborn], backend=backend)
    settings = {
        **TEST_SETTINGS,
        "cancellation_grace_period": "100ms",
        "cleanup_grace_period": "100ms",
        "termination_grace_period": "60s",
        "queues": ["default"],
    }
    async with tq:
        job = await tq.client.enqueue(stubborn, {})
        worker = Worker(tq, WorkerSettings.load(settings, env={}))
        running = asyncio.create_task(worker.run())
        await asyncio.wait_for(started.wait(), 5)
        assert await tq.client.cancel(job.id)
        await asyncio.wait_for(first_call.wait(), 5)  # the controller's write under way
        worker.stop()
        worker.escalate()
        await asyncio.wait_for(running, 10)
        await asyncio.gather(*worker.lingering_tasks())
        row = await tq.client.get(job.id)
        events = await tq.client.get_events(job.id)
    assert backend.calls == 2
    assert row is not None and row.status is JobStatus.ABANDONED
    assert [e for e in events if e.kind == "late_outcome"] == []
    assert hooks == ["abandoned"]


async def test_a_write_off_under_way_as_a_stop_ends_is_the_jobs_one_end() -> None:
    # The cancel controller's write-off of an attempt past its timeout was under way
    # when the stop let go of what still ran: the stop handed the job back as
    # interrupted, to run again, though its code may run on.
    write_off, abandoning = asyncio.Event(), asyncio.Event()
    hand_backs: list[object] = []

    class Racing(InMemoryBackend):
        async def mark_failed_or_retry(self, *args: Any, **kwargs: Any) -> Any:
            write_off.set()  # held until the stop lets go of what still runs
            await abandoning.wait()
            return await super().mark_failed_or_retry(*args, **kwargs)

        async def mark_snoozed(self, *args: Any, **kwargs: Any) -> Any:
            if kwargs.get("outcome") == "interrupted":
                hand_backs.append(args[0])
            return await super().mark_snoozed(*args, **kwargs)

    started = asyncio.Event()
    stubborn = _ignores_cancellation("both.past_its_timeout", started, timeout=0.1)
    backend = Racing()
    tq = TaskQ("memory://", actors=[stubborn], backend=backend)
    settings = {
        **TEST_SETTINGS,
        **_CANCEL_GRACES,
        "termination_grace_period": "60s",
        "queues": ["default"],
    }
    async with tq:
        job = await tq.client.enqueue(stubborn, {})
        worker = Worker(tq, WorkerSettings.load(settings, env={}))
        with structlog.testing.capture_logs() as logs:
            running = asyncio.create_task(worker.run())
            await asyncio.wait_for(write_off.wait(), 5)  # the write-off under way
            worker.stop()
            worker.escalate()

            await phase_logged(logs, "ABANDONING")
            abandoning.set()
            await asyncio.wait_for(running, 10)
            await asyncio.gather(*worker.lingering_tasks())
        row = await tq.client.get(job.id)
        events = await tq.client.get_events(job.id)
    assert hand_backs == []
    assert row is not None and row.status is JobStatus.FAILED
    assert [e for e in events if e.kind == "late_outcome"] == []
