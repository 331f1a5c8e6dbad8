"""An actor that returned has finished its work: what is left of its invocation, its
dependencies' teardown (a transaction's commit) and its outcome write, is not cut
short by a stop, a forced cancel or its limit, and a commit that fails fails the
attempt. The sync actor's side is in test_worker_memory.py."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from datetime import timedelta
from typing import Any, Literal
from uuid import UUID

import structlog.testing

from taskq import (
    Context,
    FixedBackoff,
    JobStatus,
    ProviderRegistry,
    Scope,
    TaskQ,
    actor,
)
from taskq.backend.memory import InMemoryBackend
from taskq_testing import TEST_SETTINGS, run_until_idle
from tests.worker.running import running


class _Tx:
    """A transaction, committed at the end of its scope."""


class _SyncTx(_Tx):
    pass


def _slow_commit(commits: list[str], seconds: float) -> ProviderRegistry:
    @asynccontextmanager
    async def transaction() -> AsyncIterator[_Tx]:
        yield _Tx()
        await asyncio.sleep(seconds)
        commits.append("commit")

    providers = ProviderRegistry()
    providers.register(_Tx, transaction, scope=Scope.TRANSIENT)
    return providers


async def _outcomes(tq: TaskQ, job_id: UUID) -> tuple[JobStatus, Any, list[str]]:
    row = await tq.client.get(job_id)
    assert row is not None
    return row.status, row.result, [a.outcome for a in await tq.client.get_attempts(job_id)]


async def test_a_stop_while_an_async_actors_transaction_commits_keeps_its_outcome() -> None:
    # FORCING cancelled the task in the commit: the job was handed back and its
    # committed work done again by the next worker.
    commits: list[str] = []
    returned = asyncio.Event()

    @actor(name="charges", max_attempts=3)
    async def charges(payload: dict[str, Any], tx: _Tx) -> str:
        returned.set()
        return "charged"

    tq = TaskQ("memory://", actors=[charges], providers=_slow_commit(commits, 0.6))
    graces = {
        "drain_grace_period": "50ms",
        "cancellation_grace_period": "50ms",
        "cleanup_grace_period": "5s",
    }
    async with tq:
        job = await tq.client.enqueue(charges, {})
        async with running(tq, {**TEST_SETTINGS, **graces}):
            await asyncio.wait_for(returned.wait(), 5)
        assert await _outcomes(tq, job.id) == (JobStatus.SUCCEEDED, "charged", ["succeeded"])
        await run_until_idle(tq)  # nothing was handed back to run again
    assert commits == ["commit"]


async def test_a_forced_cancel_while_an_async_actors_transaction_commits_keeps_its_outcome() -> (
    None
):
    # The force landed in the commit: the job ended cancelled, its result dropped,
    # with its work committed.
    commits: list[str] = []
    returned = asyncio.Event()

    @actor(name="writes", max_attempts=3)
    async def writes(payload: dict[str, Any], tx: _Tx) -> str:
        returned.set()
        return "written"

    tq = TaskQ("memory://", actors=[writes], providers=_slow_commit(commits, 0.6))
    async with tq:
        job = await tq.client.enqueue(writes, {})
        runner = asyncio.create_task(
            run_until_idle(tq, cancellation_grace_period="50ms", cleanup_grace_period="5s")
        )
        await asyncio.wait_for(returned.wait(), 5)
        assert await tq.client.cancel(job.id)  # forced 50 ms after its worker sees it
        await asyncio.wait_for(runner, 10)
        assert await _outcomes(tq, job.id) == (JobStatus.SUCCEEDED, "written", ["succeeded"])
    assert commits == ["commit"]


async def test_a_commit_that_never_ends_is_given_up_a_cleanup_grace_past_the_limit() -> None:
    # Not cut short, but not waited for for ever either: a commit stuck on a dead
    # connection held the job's slot and lease (renewed) for as long as the worker ran.
    release = asyncio.Event()

    @asynccontextmanager
    async def stuck() -> AsyncIterator[_Tx]:
        yield _Tx()
        await release.wait()  # the commit that does not come back

    providers = ProviderRegistry()
    providers.register(_Tx, stuck, scope=Scope.TRANSIENT)

    @actor(name="stuck_commit", max_attempts=3, timeout=0.2)
    async def stuck_commit(payload: dict[str, Any], tx: _Tx) -> str:
        return "done"

    tq = TaskQ("memory://", actors=[stuck_commit], providers=providers)
    async with tq:
        job = await tq.client.enqueue(stuck_commit, {})
        try:
            await run_until_idle(tq, cleanup_grace_period="200ms", timeout=10)
        finally:
            release.set()
        status, _, outcomes = await _outcomes(tq, job.id)
        [attempt] = await tq.client.get_attempts(job.id)
    # Not retried: its work may have committed.
    assert (status, outcomes) == (JobStatus.FAILED, ["failed"])
    assert attempt.error is not None and attempt.error.error_class == "TeardownTimeout"


class _SlowEscalation(InMemoryBackend):
    """Phase 2 is stored at once; its reply comes once the job's success write, slow
    here (as a transaction enqueueing sub-jobs is), is under way."""

    def __init__(self) -> None:
        super().__init__()
        self.started = asyncio.Event()
        self.may_return = asyncio.Event()
        self.writing = asyncio.Event()

    async def write_cancel_escalation(
        self, job_id: UUID, worker_id: UUID, phase: Literal[2], *, attempt: int | None = None
    ) -> bool:
        written = await super().write_cancel_escalation(job_id, worker_id, phase, attempt=attempt)
        self.may_return.set()
        await asyncio.wait_for(self.writing.wait(), 5)
        return written

    async def mark_succeeded(self, *args: Any, **kwargs: Any) -> bool:
        self.writing.set()
        await asyncio.sleep(0.3)
        return await super().mark_succeeded(*args, **kwargs)


@actor(name="returned.child")
async def child(payload: dict[str, Any]) -> None:
    return None


def _late_app(backend: _SlowEscalation) -> TaskQ:
    """An actor that returns (enqueueing a sub-job) once phase 2 of its cancel is stored,
    never looking at its cancel_event."""

    @actor(name="late", max_attempts=3)
    async def late(payload: dict[str, Any], ctx: Context) -> str:
        backend.started.set()
        await backend.may_return.wait()
        ctx.enqueue(child, {})
        return "done"

    return TaskQ("memory://", actors=[late, child], backend=backend)


async def test_a_cancel_forced_as_the_actor_returns_leaves_its_outcome_write_alone() -> None:
    # The controller checked the job before writing phase 2 and cancelled its task
    # after: the success write was cut, the job ended cancelled, its result and its
    # sub-job lost.
    backend = _SlowEscalation()

    tq = _late_app(backend)
    async with tq:
        job = await tq.client.enqueue("late", {})
        runner = asyncio.create_task(
            run_until_idle(tq, cancellation_grace_period="50ms", cleanup_grace_period="5s")
        )
        await asyncio.wait_for(backend.started.wait(), 5)
        assert await tq.client.cancel(job.id)
        await asyncio.wait_for(runner, 10)
        assert await _outcomes(tq, job.id) == (JobStatus.SUCCEEDED, "done", ["succeeded"])
        assert len(await tq.client.list_jobs(actor="returned.child")) == 1


async def test_a_stop_forcing_a_users_cancel_as_the_actor_returns_leaves_its_outcome_alone() -> (
    None
):
    # The same check-then-await in a stop's FORCING, which stores phase 2 of a user's
    # cancel before it cancels the task.
    backend = _SlowEscalation()

    tq = _late_app(backend)
    graces = {"cancellation_grace_period": "10s", "cleanup_grace_period": "5s"}
    async with tq:
        job = await tq.client.enqueue("late", {})
        with structlog.testing.capture_logs() as logs:
            async with running(tq, {**TEST_SETTINGS, **graces}) as worker:
                await asyncio.wait_for(backend.started.wait(), 5)
                assert await tq.client.cancel(job.id)
                async with asyncio.timeout(10):  # until its worker has seen the cancel
                    seen = "taskq.cancel-observed"
                    while not any(log["event"] == seen for log in logs):  # noqa: ASYNC110 - a log
                        await asyncio.sleep(0.02)
                worker.stop()
                worker.escalate()  # straight to FORCING
        assert await _outcomes(tq, job.id) == (JobStatus.SUCCEEDED, "done", ["succeeded"])
        assert len(await tq.client.list_jobs(actor="returned.child")) == 1


async def test_a_commit_that_fails_fails_the_attempt_which_is_retried() -> None:
    # Logged, and the job read succeeded: its work never committed.
    failures = {"async": 1, "sync": 1}

    @asynccontextmanager
    async def transaction() -> AsyncIterator[_Tx]:
        yield _Tx()
        if failures["async"]:
            failures["async"] -= 1
            raise ConnectionError("commit failed: connection reset")

    @contextmanager
    def sync_transaction() -> Iterator[_SyncTx]:
        yield _SyncTx()
        if failures["sync"]:
            failures["sync"] -= 1
            raise ConnectionError("sync commit failed")

    again = FixedBackoff(timedelta(0))

    @actor(name="commits", max_attempts=2, retry_backoff=again)
    async def commits(payload: dict[str, Any], tx: _Tx) -> str:
        return "done"

    @actor(name="commits_sync", max_attempts=2, retry_backoff=again)
    def commits_sync(payload: dict[str, Any], tx: _SyncTx) -> str:
        time.sleep(0)
        return f"done in {threading.current_thread().name != 'MainThread'}"

    providers = ProviderRegistry()
    providers.register(_Tx, transaction, scope=Scope.TRANSIENT)
    providers.register(_SyncTx, sync_transaction, scope=Scope.TRANSIENT)
    tq = TaskQ("memory://", actors=[commits, commits_sync], providers=providers)
    async with tq:
        job = await tq.client.enqueue(commits, {})
        sync_job = await tq.client.enqueue(commits_sync, {})
        # A long lease: logging the failed teardown's traceback can stall a loaded
        # loop past the test settings' second, and the attempt read crashed.
        await run_until_idle(tq, lock_lease="30s")
        for job_id, result in ((job.id, "done"), (sync_job.id, "done in True")):
            status, stored, outcomes = await _outcomes(tq, job_id)
            assert (status, stored, outcomes) == (
                JobStatus.SUCCEEDED,
                result,
                ["failed", "succeeded"],
            )
            [failed, _] = await tq.client.get_attempts(job_id)
            assert failed.error is not None and "commit failed" in failed.error.message
