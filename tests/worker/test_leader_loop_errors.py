"""A leader loop that fails at every turn fails alone and loudly: the worker, its jobs
and the leader's other loops go on (docs/adr/0008)."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from uuid import uuid4

import pytest
import structlog

from taskq import TaskQ, WorkerSettings, actor
from taskq.backend.memory import InMemoryBackend
from taskq.models import JobStatus
from taskq.worker import Worker
from taskq.worker._transient import LeaderLoopErrors
from taskq_testing import TEST_SETTINGS


class _PoisonedExpiry(InMemoryBackend):
    """Result expiry meets a fault of its own at every turn until it is mended."""

    poisoned = True

    async def sweep_expired_results(self) -> int:
        if self.poisoned:
            raise RuntimeError("a row the sweep cannot handle")
        return await super().sweep_expired_results()


@actor(name="leader_errors.echo")
async def echo(payload: dict[str, int]) -> int:
    return payload["n"]


async def test_a_leader_loop_failing_every_turn_leaves_the_worker_its_jobs_and_other_loops() -> (
    None
):
    backend = _PoisonedExpiry()
    tq = TaskQ("memory://", backend=backend, actors=[echo])
    async with tq:
        flags = {**TEST_SETTINGS, "result_expiry_interval": "20ms"}
        worker = Worker(tq, WorkerSettings.load(flags, env={}))
        with structlog.testing.capture_logs() as logs:
            running = asyncio.create_task(worker.run())
            async with asyncio.timeout(10):
                while not any(e["event"] == "taskq.leader-loop-failing" for e in logs):  # noqa: ASYNC110
                    await asyncio.sleep(0.02)
            await asyncio.sleep(0.3)  # a dozen more failing turns
            assert not running.done()  # the fifth error in a row ended the worker
            # Jobs still run, and the sweep loop still promotes a delayed one.
            now = await tq.client.enqueue(echo, {"n": 1})
            later = await tq.client.enqueue(echo, {"n": 2}, delay=timedelta(milliseconds=50))
            async with asyncio.timeout(10):
                for job in (now, later):
                    while (row := await tq.client.get(job.id)) and (  # noqa: ASYNC110
                        row.status is not JobStatus.SUCCEEDED
                    ):
                        await asyncio.sleep(0.02)
            backend.poisoned = False
            async with asyncio.timeout(10):
                while not any(e["event"] == "taskq.leader-loop-recovered" for e in logs):  # noqa: ASYNC110
                    await asyncio.sleep(0.02)
        worker.stop()
        await asyncio.wait_for(running, 10)
    expiry = [e for e in logs if e.get("loop") == "leader-result-expiry"]
    events = [e["event"] for e in expiry]
    # Four with their streak, then "failing" once (the next within 30 s left out), then
    # the recovery.
    assert events[:4] == ["taskq.loop-unexpected-error"] * 4
    assert events[4:] == ["taskq.leader-loop-failing", "taskq.leader-loop-recovered"]
    failing = expiry[4]
    assert failing["log_level"] == "error" and failing["streak"] == 5
    assert isinstance(failing["exc_info"], RuntimeError)
    assert expiry[5]["after"] > 5


def test_the_failing_report_comes_at_the_streak_then_once_per_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [1000.0]
    monkeypatch.setattr("taskq.worker._transient.time.monotonic", lambda: now[0])
    errors = LeaderLoopErrors("leader-cron", max_consecutive=3, every=30.0)
    with structlog.testing.capture_logs() as logs:
        for _ in range(62):  # a minute of turns, one a second
            errors.failed(ValueError("bad schedule"))
            now[0] += 1.0
        errors.succeeded()
        errors.failed(ValueError("once"))
        errors.succeeded()  # an isolated error: no recovery to report
    assert [(e["event"], e.get("streak"), e.get("repeated")) for e in logs] == [
        ("taskq.loop-unexpected-error", 1, None),
        ("taskq.loop-unexpected-error", 2, None),
        ("taskq.leader-loop-failing", 3, 0),
        ("taskq.leader-loop-failing", 33, 29),
        ("taskq.leader-loop-recovered", None, None),
        ("taskq.loop-unexpected-error", 1, None),
    ]


async def test_losing_the_leadership_is_no_recovery() -> None:
    # A turn that found another worker leading did no work: it reported the failing
    # loop recovered, and an alert on taskq.leader-loop-failing went quiet.
    backend = _PoisonedExpiry()
    tq = TaskQ("memory://", backend=backend, actors=[echo])
    async with tq:
        # The election ticks slowly: the failing loop's own turn is the one that finds
        # the leadership gone.
        flags = {
            **TEST_SETTINGS,
            "result_expiry_interval": "20ms",
            "heartbeat_interval": "1s",
            "lock_lease": "4s",
            "maintenance_interval": "1s",
        }
        worker = Worker(tq, WorkerSettings.load(flags, env={}))
        with structlog.testing.capture_logs() as logs:
            running = asyncio.create_task(worker.run())
            async with asyncio.timeout(10):
                while not any(e["event"] == "taskq.leader-loop-failing" for e in logs):  # noqa: ASYNC110
                    await asyncio.sleep(0.02)
            backend.leader = uuid4()  # another worker leads; the fault is unchanged
            await asyncio.sleep(0.3)
        worker.stop()
        await asyncio.wait_for(running, 10)
    assert any(e["event"] == "taskq.leader-lost" for e in logs)
    assert not any(e["event"] == "taskq.leader-loop-recovered" for e in logs)


class _SlowCleanup(InMemoryBackend):
    """The sweep's last statement outlasts the loop's bound at every turn: a database
    that answers, slowly (a row held, a lock timeout)."""

    async def cleanup_stale_workers(self, *args: object, **kwargs: object) -> int:
        await asyncio.sleep(1)
        return 0


async def test_a_leader_whose_sweep_is_slow_on_a_database_that_answers_keeps_the_lead() -> None:
    # It resigned after a lease of failed turns and sat out another: on a database every
    # worker reaches alike, nothing led for half the time (docs/adr/0009).
    tq = TaskQ("memory://", backend=_SlowCleanup(), actors=[echo])
    async with tq:
        flags = {**TEST_SETTINGS, "leader_lease": "500ms", "dispatcher_command_timeout": "100ms"}
        worker = Worker(tq, WorkerSettings.load(flags, env={}))
        with structlog.testing.capture_logs() as logs:
            running = asyncio.create_task(worker.run())
            await asyncio.sleep(2)  # four leases of failed sweeps
            worker.stop()
            await asyncio.wait_for(running, 10)
    events = [e["event"] for e in logs]
    assert events.count("taskq.leader-loop-transient-error") >= 1  # the sweep did fail
    assert "taskq.leader-resigned" not in events
