"""The batch terminal-outcome hook: a tracked batch's failure streak, abort and
completion follow its children's ends as the worker writes them, not the leader's
stale-batch sweep (kept out of these tests by a long interval); and so do the ends an
operator's cancel and the leader's sweeps write."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from types import SimpleNamespace
from typing import Any
from uuid import UUID, uuid4

import pytest

from taskq import Context, JobStatus, RetryAfter, Snooze, TaskQ, WorkerSettings, actor
from taskq.backend import Backend
from taskq.backend.memory import InMemoryBackend
from taskq.models import BatchRow, EnqueueArgs, JobFilter
from taskq.worker import Worker
from taskq.worker.maintenance import sweep_once
from taskq_testing import TEST_SETTINGS, run_until_idle

pytestmark = pytest.mark.postgres

_NO_SWEEP: dict[str, Any] = {"stale_batch_interval": "1h"}


@actor(name="batches.child", max_attempts=1)
async def child(payload: dict[str, Any]) -> str:
    if payload["fail"]:
        raise RuntimeError("child failed")
    return "ok"


@actor(name="batches.signalling_child", max_attempts=1)
async def signalling_child(payload: dict[str, Any]) -> str:
    if payload["signal"] == "retry_after":
        raise RetryAfter(0.01)  # its one attempt spent: failed
    if payload["signal"] == "snooze":
        raise Snooze(60)  # past its deadline: failed
    return "ok"


@actor(name="batches.raises", max_attempts=3)
async def raises(payload: dict[str, Any]) -> None:
    raise RuntimeError("a failure with attempts left: a retry")


@actor(name="batches.finalizer")
async def finalizer(payload: dict[str, Any]) -> str:
    return "finalized"


async def _batch(
    tq: TaskQ, backend: Backend, children: list[tuple[bool, str]], threshold: int | None
) -> UUID:
    """A tracked batch of children that fail or succeed, each on its queue (a queue no
    worker serves keeps it waiting), and a finalizer on ``default``."""
    batch_id, build = uuid4(), tq.client.build_args
    await backend.enqueue_batch_atomic(
        [build(child, {"fail": fail}, queue=queue) for fail, queue in children],
        batch_id=batch_id,
        queue="default",
        batch_row=BatchRow(
            id=batch_id, queue="default", expected_size=len(children), failure_threshold=threshold
        ),
        finalizer_args=build(finalizer, {}),
    )
    return batch_id


async def _one_by_one(tq: TaskQ, *queues: str) -> None:
    """Run the queues' jobs one queue after the other: a worker frees a slot before its
    outcome's batch hook, so jobs of one queue may apply theirs in either order."""
    for queue in queues:
        await run_until_idle(tq, queues=[queue], **_NO_SWEEP)


async def _statuses(tq: TaskQ, batch_id: UUID) -> dict[str, JobStatus]:
    rows = await tq.client.list_jobs(JobFilter(batch_id=batch_id))
    return {row.queue: row.status for row in rows if row.actor == "batches.child"}


async def test_failures_reaching_the_threshold_abort_the_batch_and_cancel_its_waiting_children(
    taskq_backend: Backend,
) -> None:
    # The threshold was stored and ignored: every child ran, the sweep marked the batch
    # complete and released its finalizer up to a sweep interval later.
    tq = TaskQ("memory://", actors=[child, finalizer], backend=taskq_backend)
    async with tq:
        children = [(True, "q1"), (True, "q2"), (False, "waiting"), (False, "waiting-too")]
        batch_id = await _batch(tq, taskq_backend, children, 2)
        await _one_by_one(tq, "q1")
        assert (await _statuses(tq, batch_id))["waiting"] is JobStatus.PENDING
        await _one_by_one(tq, "q2", "default")
        batch = await taskq_backend.get_batch(batch_id)
        statuses = await _statuses(tq, batch_id)
        [final] = await tq.client.list_jobs(actor="batches.finalizer")
    assert batch is not None and (batch.status, batch.consecutive_failures) == ("aborted", 2)
    assert statuses == {
        "q1": JobStatus.FAILED,
        "q2": JobStatus.FAILED,
        "waiting": JobStatus.CANCELLED,
        "waiting-too": JobStatus.CANCELLED,
    }
    assert final.status is JobStatus.SUCCEEDED  # released by the abort, and run


@pytest.mark.parametrize("signal", ["retry_after", "snooze"])
async def test_children_failed_by_a_retry_after_or_a_snooze_count_toward_the_threshold(
    taskq_backend: Backend, signal: str
) -> None:
    # Failed by their attempts or their deadline at a RetryAfter or a Snooze, they never
    # reached the batch's hook: the waiting children ran, and the stale-batch sweep later
    # recorded the batch complete.
    tq = TaskQ("memory://", actors=[signalling_child, child, finalizer], backend=taskq_backend)
    async with tq:
        batch_id, build = uuid4(), tq.client.build_args
        deadline = timedelta(seconds=30)
        await taskq_backend.enqueue_batch_atomic(
            [
                build(signalling_child, {"signal": signal}, queue=q, schedule_to_close=deadline)
                for q in ("q1", "q2")
            ]
            + [build(child, {"fail": False}, queue="waiting")],
            batch_id=batch_id,
            queue="default",
            batch_row=BatchRow(id=batch_id, queue="default", expected_size=3, failure_threshold=2),
            finalizer_args=build(finalizer, {}),
        )
        await _one_by_one(tq, "q1", "q2")
        batch = await taskq_backend.get_batch(batch_id)
        statuses = await _statuses(tq, batch_id)
    assert batch is not None and (batch.status, batch.consecutive_failures) == ("aborted", 2)
    assert statuses == {"waiting": JobStatus.CANCELLED}


async def test_a_child_whose_retry_a_cancel_ended_completes_its_batch() -> None:
    # The failure write found a cancel requested (after the worker's last look) and ended
    # the job cancelled, and the hook ran only for a failed one: the batch waited for
    # the stale-batch sweep.
    class CancelledMeanwhile(InMemoryBackend):
        async def mark_failed_or_retry(self, job_id: Any, *args: Any, **kwargs: Any) -> Any:
            await self.write_cancel_request(job_id, "meanwhile")
            return await super().mark_failed_or_retry(job_id, *args, **kwargs)

    backend = CancelledMeanwhile()
    tq = TaskQ("memory://", actors=[raises], backend=backend)
    async with tq:
        batch_id, build = uuid4(), tq.client.build_args
        [job] = await backend.enqueue_batch_atomic(
            [build(raises, {})],
            batch_id=batch_id,
            queue="default",
            batch_row=BatchRow(id=batch_id, queue="default", expected_size=1),
            finalizer_args=None,
        )
        await run_until_idle(tq, **_NO_SWEEP)
        row = await tq.client.get(job.id)
        batch = await backend.get_batch(batch_id)
    assert row is not None and row.status is JobStatus.CANCELLED
    assert batch is not None and batch.status == "complete"


async def test_a_success_resets_the_streak_and_the_last_child_completes_the_batch(
    taskq_backend: Backend,
) -> None:
    tq = TaskQ("memory://", actors=[child, finalizer], backend=taskq_backend)
    async with tq:
        children = [(True, "q1"), (False, "q2"), (True, "q3"), (False, "q4")]
        batch_id = await _batch(tq, taskq_backend, children, 2)
        await _one_by_one(tq, "q1", "q2", "q3")
        streak = await taskq_backend.get_batch(batch_id)
        await _one_by_one(tq, "q4", "default")
        batch = await taskq_backend.get_batch(batch_id)
        [final] = await tq.client.list_jobs(actor="batches.finalizer")
    assert streak is not None and (streak.status, streak.consecutive_failures) == ("active", 1)
    assert batch is not None and (batch.status, batch.consecutive_failures) == ("complete", 0)
    assert final.status is JobStatus.SUCCEEDED
    assert final.started_at is not None and batch.completed_at is not None
    assert final.started_at >= batch.completed_at


async def test_a_batch_without_a_policy_completes_when_its_last_child_ends(
    taskq_backend: Backend,
) -> None:
    tq = TaskQ("memory://", actors=[child, finalizer], backend=taskq_backend)
    async with tq:
        batch_id = await _batch(tq, taskq_backend, [(True, "q1"), (True, "q2")], None)
        await _one_by_one(tq, "q1")
        active = await taskq_backend.get_batch(batch_id)
        await _one_by_one(tq, "q2", "default")
        batch = await taskq_backend.get_batch(batch_id)
        [final] = await tq.client.list_jobs(actor="batches.finalizer")
    assert active is not None and active.status == "active"
    assert batch is not None and (batch.status, batch.consecutive_failures) == ("complete", 2)
    assert final.status is JobStatus.SUCCEEDED


async def test_jobs_tagged_with_no_batch_row_run_as_any_job(taskq_backend: Backend) -> None:
    tq = TaskQ("memory://", actors=[child], backend=taskq_backend)
    async with tq:
        for fail in (True, False):
            await tq.client.enqueue(child, {"fail": fail}, metadata={"batch_id": str(uuid4())})
        worker = await run_until_idle(tq, **_NO_SWEEP)
    assert worker.processed == 2


# -- children ended outside the worker: by an operator's cancel, by the leader's sweeps --


async def _swept(backend: Backend, key: str, *, reclaim: bool = False) -> None:
    """Run the leader's sweep iteration until it moved something under ``key`` (the
    deadline or lease it waits for lies a fraction of a second ahead)."""
    state: Any = SimpleNamespace(
        backend=backend, settings=WorkerSettings.load(dict(TEST_SETTINGS), env={})
    )
    async with asyncio.timeout(10):
        while True:
            if (await sweep_once(state, reclaim=reclaim)).get(key):
                return
            await asyncio.sleep(0.02)  # the time it waits for, not an assertion


@pytest.mark.parametrize("how", ["cancel", "cancel_where"])
async def test_an_operators_cancel_of_the_last_waiting_child_completes_the_batch(
    taskq_backend: Backend, how: str
) -> None:
    # The cancel ended the child without the batch's hook: the batch stayed active, its
    # finalizer parked, until the stale-batch sweep (30 s later by default).
    tq = TaskQ("memory://", actors=[child, finalizer], backend=taskq_backend)
    async with tq:
        batch_id = await _batch(tq, taskq_backend, [(False, "q1"), (False, "waiting")], 2)
        await _one_by_one(tq, "q1")
        if how == "cancel":
            [waiting] = await tq.client.list_jobs(queue="waiting")
            assert await tq.client.cancel(waiting.id, reason="not needed")
        else:
            result = await tq.client.cancel_where(queue="waiting", reason="not needed")
            assert len(result.cancelled) == 1
        batch = await taskq_backend.get_batch(batch_id)
        [final] = await tq.client.list_jobs(actor="batches.finalizer")
    assert batch is not None and (batch.status, batch.consecutive_failures) == ("complete", 0)
    assert final.status is JobStatus.PENDING  # released


async def test_children_the_deadline_sweep_fails_count_toward_the_threshold(
    taskq_backend: Backend,
) -> None:
    # The sweep failed them without the batch's hook: the streak stayed at 0, the other
    # children ran, and the batch ended complete where its policy aborts it.
    tq = TaskQ("memory://", actors=[child, finalizer], backend=taskq_backend)
    async with tq:
        batch_id, build = uuid4(), tq.client.build_args
        soon = timedelta(seconds=0.1)
        await taskq_backend.enqueue_batch_atomic(
            [build(child, {"fail": False}, queue=q, schedule_to_close=soon) for q in ("q1", "q2")]
            + [build(child, {"fail": False}, queue="waiting")],
            batch_id=batch_id,
            queue="default",
            batch_row=BatchRow(id=batch_id, queue="default", expected_size=3, failure_threshold=2),
            finalizer_args=build(finalizer, {}),
        )
        await _swept(taskq_backend, "deadline")
        batch = await taskq_backend.get_batch(batch_id)
        statuses = await _statuses(tq, batch_id)
    assert batch is not None and (batch.status, batch.consecutive_failures) == ("aborted", 2)
    assert statuses == {
        "q1": JobStatus.FAILED,
        "q2": JobStatus.FAILED,
        "waiting": JobStatus.CANCELLED,
    }


async def test_a_last_child_the_reclaim_crashes_completes_the_batch(
    taskq_backend: Backend,
) -> None:
    # Its worker gone and its attempts spent, the reclaim ended it crashed without the
    # batch's hook: the batch waited for the stale-batch sweep.
    tq = TaskQ("memory://", actors=[child, finalizer], backend=taskq_backend)
    async with tq:
        batch_id = await _batch(tq, taskq_backend, [(False, "q1"), (False, "lost")], None)
        await _one_by_one(tq, "q1")
        [lost] = await taskq_backend.dispatch_batch(
            uuid4(), ["lost"], 1, timedelta(seconds=0.1)
        )  # by a worker that dies
        await _swept(taskq_backend, "reclaimed", reclaim=True)
        batch = await taskq_backend.get_batch(batch_id)
        row = await tq.client.get(lost.id)
    assert row is not None and row.status is JobStatus.CRASHED
    assert batch is not None and batch.status == "complete"


async def test_children_a_failing_deadline_sweep_ended_still_count_for_their_batch() -> None:
    # The sweep commits turn by turn: one whose later turn failed (the database away)
    # raised out of the iteration with the ends of the turns it committed unapplied,
    # and the batch they should have aborted completed instead.
    from taskq.backend.memory import InMemoryBackend

    class LaterTurnFails(InMemoryBackend):
        async def deadline_sweep(self, **kwargs: Any) -> int:
            await super().deadline_sweep(**kwargs)  # the first turn, committed
            raise ConnectionResetError("the database went away in the next turn")

    backend = LaterTurnFails()
    tq = TaskQ("memory://", actors=[child, finalizer], backend=backend)
    async with tq:
        batch_id, build = uuid4(), tq.client.build_args
        soon = timedelta(seconds=0.05)
        await backend.enqueue_batch_atomic(
            [build(child, {"fail": False}, queue="q1", schedule_to_close=soon)]
            + [build(child, {"fail": False}, queue="waiting")],
            batch_id=batch_id,
            queue="default",
            batch_row=BatchRow(id=batch_id, queue="default", expected_size=2, failure_threshold=1),
            finalizer_args=build(finalizer, {}),
        )
        await asyncio.sleep(0.1)  # past the first child's deadline
        state: Any = SimpleNamespace(
            backend=backend, settings=WorkerSettings.load(dict(TEST_SETTINGS), env={})
        )
        with pytest.raises(ConnectionResetError):
            await sweep_once(state, reclaim=False)
        batch = await backend.get_batch(batch_id)
        statuses = await _statuses(tq, batch_id)
    assert statuses == {"q1": JobStatus.FAILED, "waiting": JobStatus.CANCELLED}
    assert batch is not None and (batch.status, batch.consecutive_failures) == ("aborted", 1)


def _sweep_state(backend: Backend, command_timeout: str = "5s") -> Any:
    """The leader state ``sweep_once`` reads, its cut-short apply given a quarter of
    ``command_timeout``."""
    settings = {**TEST_SETTINGS, "dispatcher_command_timeout": command_timeout}
    return SimpleNamespace(backend=backend, settings=WorkerSettings.load(settings, env={}))


async def _failing_batch(tq: TaskQ, backend: Backend) -> UUID:
    """A batch of threshold 1: one child past its deadline in 50 ms, one waiting."""
    batch_id, build = uuid4(), tq.client.build_args
    soon = timedelta(seconds=0.05)
    await backend.enqueue_batch_atomic(
        [build(child, {"fail": False}, queue="q1", schedule_to_close=soon)]
        + [build(child, {"fail": False}, queue="waiting")],
        batch_id=batch_id,
        queue="default",
        batch_row=BatchRow(id=batch_id, queue="default", expected_size=2, failure_threshold=1),
        finalizer_args=build(finalizer, {}),
    )
    await asyncio.sleep(0.2)  # past the first child's deadline
    return batch_id


async def test_children_a_sweep_cut_short_by_its_bound_ended_still_count_for_their_batch(
    taskq_backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The leader bounds its sweep iteration as a whole: the bound's cancel came before
    # the ends the sweep had committed were applied, and the batch they should have
    # aborted was completed by the stale-batch sweep instead.
    tq = TaskQ("memory://", actors=[child, finalizer], backend=taskq_backend)
    async with tq:
        batch_id = await _failing_batch(tq, taskq_backend)
        sweep = taskq_backend.deadline_sweep

        async def first_turn_then_hangs(**kwargs: Any) -> int:
            await sweep(**kwargs)  # the first turn, committed
            await asyncio.Event().wait()  # the next turn never answers
            raise AssertionError("unreachable")

        monkeypatch.setattr(taskq_backend, "deadline_sweep", first_turn_then_hangs)
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.5):  # as the leader's loop bounds it
                await sweep_once(_sweep_state(taskq_backend), reclaim=False)
        batch = await taskq_backend.get_batch(batch_id)
        statuses = await _statuses(tq, batch_id)
    assert statuses == {"q1": JobStatus.FAILED, "waiting": JobStatus.CANCELLED}
    assert batch is not None and (batch.status, batch.consecutive_failures) == ("aborted", 1)


async def test_the_apply_the_bound_cuts_into_runs_to_its_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The sweep returned in time, and the bound's cancel came as its ends were applied:
    # between counting a failure and aborting the batch.
    backend = InMemoryBackend()
    tq = TaskQ("memory://", actors=[child, finalizer], backend=backend)
    async with tq:
        batch_id = await _failing_batch(tq, backend)
        add = backend.add_batch_failures

        async def slow_add(batch_id: UUID, count: int) -> tuple[int, int | None, int]:
            counted = await add(batch_id, count)
            await asyncio.sleep(0.3)  # its reply on a slow network, past the bound
            return counted

        monkeypatch.setattr(backend, "add_batch_failures", slow_add)
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.1):
                await sweep_once(_sweep_state(backend), reclaim=False)
        batch = await backend.get_batch(batch_id)
    assert batch is not None and (batch.status, batch.consecutive_failures) == ("aborted", 1)


async def test_an_apply_that_hangs_past_its_grace_is_given_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A hung database must not hold the leader, or a stopping worker, for ever.
    backend = InMemoryBackend()
    tq = TaskQ("memory://", actors=[child, finalizer], backend=backend)
    async with tq:
        batch_id = await _failing_batch(tq, backend)
        hung = asyncio.Event()

        async def hangs(batch_id: UUID, count: int) -> tuple[int, int | None, int]:
            hung.set()
            await asyncio.Event().wait()
            raise AssertionError("unreachable")

        monkeypatch.setattr(backend, "add_batch_failures", hangs)
        began = asyncio.get_running_loop().time()
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.1):
                await sweep_once(_sweep_state(backend, command_timeout="1s"), reclaim=False)
        took = asyncio.get_running_loop().time() - began
        batch = await backend.get_batch(batch_id)
    assert hung.is_set()
    assert took < 1  # the bound, then a quarter of the command timeout
    assert batch is not None and (batch.status, batch.consecutive_failures) == ("active", 0)


_BATCH_CALLS = (
    "increment_batch_failures",
    "add_batch_failures",
    "batch_has_active_children",
    "count_batch_non_terminal",
    "complete_batch",
    "abort_batch",
)


async def _deadline_failures(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> tuple[list[str], list[tuple[str, int]]]:
    """One sweep fails 4 children of a batch of threshold 10 and 3 of one of threshold 2
    (each batch has a child left): the batch calls it made, and the batches after it."""
    calls: list[str] = []

    def counted(name: str) -> Any:
        method = getattr(backend, name)

        async def call(*args: Any, **kwargs: Any) -> Any:
            calls.append(name)
            return await method(*args, **kwargs)

        return call

    tq = TaskQ("memory://", actors=[child, finalizer], backend=backend)
    async with tq:
        build, soon = tq.client.build_args, timedelta(seconds=0.1)
        batches = []
        for failing, threshold in ((4, 10), (3, 2)):  # short of its threshold, past it
            batch_id = uuid4()
            await backend.enqueue_batch_atomic(
                [
                    build(child, {"fail": False}, queue="q1", schedule_to_close=soon)
                    for _ in range(failing)
                ]
                + [build(child, {"fail": False}, queue="waiting")],
                batch_id=batch_id,
                queue="default",
                batch_row=BatchRow(
                    id=batch_id,
                    queue="default",
                    expected_size=failing + 1,
                    failure_threshold=threshold,
                ),
                finalizer_args=build(finalizer, {}),
            )
            batches.append(batch_id)
        await asyncio.sleep(0.3)  # past every child's deadline: one sweep fails them all
        for name in _BATCH_CALLS:
            if getattr(backend, name) is not None:
                monkeypatch.setattr(backend, name, counted(name))
        state: Any = SimpleNamespace(
            backend=backend, settings=WorkerSettings.load(dict(TEST_SETTINGS), env={})
        )
        assert (await sweep_once(state, reclaim=False))["deadline"] == 7
        rows = [await backend.get_batch(batch_id) for batch_id in batches]
    return calls, [(row.status, row.consecutive_failures) for row in rows if row is not None]


async def test_the_failures_a_sweep_ends_in_one_batch_count_in_one_call(
    taskq_backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One round trip per failed child: a deadline sweep that failed a large batch's
    # children made as many before the next sweep step could run.
    calls, batches = await _deadline_failures(taskq_backend, monkeypatch)
    assert sorted(calls) == ["abort_batch", "add_batch_failures", "add_batch_failures"]
    # Each failure counted once, those past the threshold not at all (the batch aborted).
    assert batches == [("active", 4), ("aborted", 2)]


class _NoFailureCount(InMemoryBackend):
    """Without ``SupportsBatchFailureCount`` (a third party's backend)."""

    add_batch_failures = None  # type: ignore[assignment]


async def test_a_backend_that_cannot_count_failures_at_once_counts_them_one_by_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls, batches = await _deadline_failures(_NoFailureCount(), monkeypatch)
    # Up to the failure that reaches the threshold, as the one call stops.
    assert sorted(calls) == ["abort_batch"] + ["increment_batch_failures"] * 6
    assert batches == [("active", 4), ("aborted", 2)]


# -- children a snooze write ended: the unknown actor's and the shutdown's hand-backs ---


class _NoActorDispatch(InMemoryBackend):
    """Dispatches every actor's jobs: the worker hands back those it does not know."""

    dispatch_actors_batch = None  # type: ignore[assignment]


async def test_a_child_of_an_unknown_actor_failed_by_its_hand_back_counts_toward_the_threshold() -> (
    None
):
    # Its deadline nearer than the unknown actor's hand-back delay, the hand-back failed
    # it without the batch's hook: the streak stayed at 0 and the batch active, its
    # waiting child left to run.
    backend = _NoActorDispatch()
    tq = TaskQ("memory://", actors=[child], backend=backend)
    async with tq:
        batch_id = uuid4()
        ghost = EnqueueArgs(actor="batches.ghost", schedule_to_close=timedelta(seconds=1))
        await backend.enqueue_batch_atomic(
            [ghost, tq.client.build_args(child, {"fail": False}, queue="waiting")],
            batch_id=batch_id,
            queue="default",
            batch_row=BatchRow(id=batch_id, queue="default", expected_size=2, failure_threshold=1),
            finalizer_args=None,
        )
        await run_until_idle(tq, **_NO_SWEEP)
        batch = await backend.get_batch(batch_id)
        rows = await tq.client.list_jobs(JobFilter(batch_id=batch_id))
        outcomes = [a.outcome for row in rows for a in await tq.client.get_attempts(row.id)]
    assert {row.queue: row.status for row in rows} == {
        "default": JobStatus.FAILED,
        "waiting": JobStatus.CANCELLED,
    }
    assert outcomes == ["unknown_actor"]
    assert batch is not None and (batch.status, batch.consecutive_failures) == ("aborted", 1)


class _CancelledAtHandBack(InMemoryBackend):
    """A cancel is requested just before the worker's hand-back: the job ends cancelled."""

    async def mark_snoozed(self, job_id: Any, *args: Any, **kwargs: Any) -> Any:
        await self.write_cancel_request(job_id, "meanwhile")
        return await super().mark_snoozed(job_id, *args, **kwargs)


class _CancelledAtOneByOneHandBack(_CancelledAtHandBack):
    """Without ``SupportsUnstartedHandBack``: unstarted jobs go back one by one."""

    hand_back_unstarted = None  # type: ignore[assignment]


@pytest.mark.parametrize(
    "backend_type", [_CancelledAtHandBack, _CancelledAtOneByOneHandBack], ids=["ran", "queued"]
)
async def test_a_child_a_shutdown_hand_back_ended_cancelled_completes_its_batch(
    backend_type: type[InMemoryBackend],
) -> None:
    # A cancel came as the stopping worker handed its jobs back (the running one, and the
    # one waiting for its slot): ended cancelled without the batch's hook, the batch
    # waited for the stale-batch sweep.
    started = asyncio.Event()

    @actor(name="batches.holds")
    async def holds(payload: dict[str, Any], ctx: Context) -> None:
        started.set()
        await ctx.cancel_event.wait()

    backend = backend_type()
    tq = TaskQ("memory://", actors=[holds], backend=backend)
    async with tq:
        batch_id, build = uuid4(), tq.client.build_args
        jobs = await backend.enqueue_batch_atomic(
            [build(holds, {}), build(holds, {})],
            batch_id=batch_id,
            queue="default",
            batch_row=BatchRow(id=batch_id, queue="default", expected_size=2),
            finalizer_args=None,
        )
        settings = {**TEST_SETTINGS, **_NO_SWEEP, "concurrency": 1, "prefetch": 1}
        settings["drain_grace_period"] = "50ms"
        worker = Worker(tq, WorkerSettings.load(settings, env={}))
        runner = asyncio.create_task(worker.run())
        await asyncio.wait_for(started.wait(), 5)
        while len(await tq.client.list_jobs(status="running")) < 2:  # noqa: ASYNC110
            await asyncio.sleep(0.01)  # the prefetch it waits for, not an assertion
        worker.stop()
        await asyncio.wait_for(runner, 10)
        rows = [await tq.client.get(job.id) for job in jobs]
        batch = await backend.get_batch(batch_id)
    assert [row.status for row in rows if row is not None] == [JobStatus.CANCELLED] * 2
    assert batch is not None and batch.status == "complete"


class _CancelledAtUnstartedHandBack(InMemoryBackend):
    """A cancel is requested of each job just before the drain hands it back unstarted."""

    async def hand_back_unstarted(self, worker_id: Any, jobs: Any, **kwargs: Any) -> int:
        for job_id, _ in jobs:
            await self.write_cancel_request(job_id, "meanwhile")
        return await super().hand_back_unstarted(worker_id, jobs, **kwargs)


async def test_a_last_child_the_drain_hand_back_ended_cancelled_completes_its_batch() -> None:
    # Waiting for the slot (prefetched) as the worker stopped, the child was handed back
    # in one statement that ended it cancelled and said only how many moved: its batch
    # waited for the stale-batch sweep.
    started = asyncio.Event()

    @actor(name="batches.holds_the_slot")
    async def holds(payload: dict[str, Any], ctx: Context) -> None:
        started.set()
        await ctx.cancel_event.wait()

    backend = _CancelledAtUnstartedHandBack()
    tq = TaskQ("memory://", actors=[holds, child], backend=backend)
    async with tq:
        settings = {**TEST_SETTINGS, **_NO_SWEEP, "concurrency": 1, "prefetch": 1}
        settings["drain_grace_period"] = "50ms"
        worker = Worker(tq, WorkerSettings.load(settings, env={}))
        runner = asyncio.create_task(worker.run())
        holder = await tq.client.enqueue(holds, {})  # no batch's
        await asyncio.wait_for(started.wait(), 5)
        batch_id = uuid4()
        [job] = await backend.enqueue_batch_atomic(
            [tq.client.build_args(child, {"fail": False})],
            batch_id=batch_id,
            queue="default",
            batch_row=BatchRow(id=batch_id, queue="default", expected_size=1),
            finalizer_args=None,
        )
        while len(await tq.client.list_jobs(status="running")) < 2:  # noqa: ASYNC110
            await asyncio.sleep(0.01)  # the prefetch it waits for, not an assertion
        worker.stop()
        await asyncio.wait_for(runner, 10)
        row, held = await tq.client.get(job.id), await tq.client.get(holder.id)
        outcomes = [a.outcome for a in await tq.client.get_attempts(job.id)]
        batch = await backend.get_batch(batch_id)
    assert held is not None and held.status is JobStatus.PENDING  # interrupted, handed back
    assert row is not None and (row.status, outcomes) == (JobStatus.CANCELLED, ["unstarted"])
    assert batch is not None and batch.status == "complete"


class _ReplyLostThenCancelled(_CancelledAtUnstartedHandBack):
    """The first dispatch locks its jobs and loses its reply: the producer hands back the
    jobs it never heard of (and a cancel is requested of each just before)."""

    lost = False

    async def dispatch_actors_batch(self, *args: Any, **kwargs: Any) -> list[Any]:
        rows = await super().dispatch_actors_batch(*args, **kwargs)
        if rows and not self.lost:
            self.lost = True
            raise ConnectionError("the reply was lost")
        return rows


async def test_a_last_child_the_producers_hand_back_ended_cancelled_completes_its_batch() -> None:
    backend = _ReplyLostThenCancelled()
    tq = TaskQ("memory://", actors=[child], backend=backend)
    async with tq:
        batch_id = uuid4()
        [job] = await backend.enqueue_batch_atomic(
            [tq.client.build_args(child, {"fail": False})],
            batch_id=batch_id,
            queue="default",
            batch_row=BatchRow(id=batch_id, queue="default", expected_size=1),
            finalizer_args=None,
        )
        await run_until_idle(tq, **_NO_SWEEP)
        row = await tq.client.get(job.id)
        outcomes = [a.outcome for a in await tq.client.get_attempts(job.id)]
        batch = await backend.get_batch(batch_id)
    assert backend.lost
    assert row is not None and (row.status, outcomes) == (JobStatus.CANCELLED, ["unstarted"])
    assert batch is not None and batch.status == "complete"


class _ReplyLostThenSlowCompletion(_ReplyLostThenCancelled):
    """As its parent, and the batch's completion answers past the producer's bound."""

    async def complete_batch(self, batch_id: UUID, **kwargs: Any) -> None:
        await asyncio.sleep(1.1)  # a slow network: the write goes out after the bound
        await super().complete_batch(batch_id, **kwargs)


async def test_a_hand_back_whose_apply_the_producers_bound_cuts_into_still_completes_the_batch() -> (
    None
):
    # The producer bounds its hand-back and what follows as one call: the bound's
    # cancel stopped the apply, and the batch waited for the stale-batch sweep.
    backend = _ReplyLostThenSlowCompletion()
    tq = TaskQ("memory://", actors=[child], backend=backend)
    async with tq:
        batch_id = uuid4()
        await backend.enqueue_batch_atomic(
            [tq.client.build_args(child, {"fail": False})],
            batch_id=batch_id,
            queue="default",
            batch_row=BatchRow(id=batch_id, queue="default", expected_size=1),
            finalizer_args=None,
        )
        await run_until_idle(tq, **_NO_SWEEP, dispatcher_command_timeout="1s")
        batch = await backend.get_batch(batch_id)
    assert backend.lost
    assert batch is not None and batch.status == "complete"
