"""Run a worker in-process until its queues are idle: tests of an application's actors.

async with app:
    job = await app.client.enqueue(resize, {"image_id": 1})
    worker = await run_until_idle(app)
    assert await app.client.wait_for_result(job.id, timeout=1) == {"ok": True}
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final

from taskq import TaskQ
from taskq.backend import JobStatus
from taskq.models import JobFilter
from taskq.settings import WorkerSettings
from taskq.worker import Worker

__all__ = ["TEST_SETTINGS", "run_until_idle"]

TEST_SETTINGS: Final[Mapping[str, str]] = MappingProxyType(
    {
        "poll_interval": "50ms",
        "heartbeat_interval": "50ms",
        "lock_lease": "1s",
        "maintenance_interval": "20ms",
        "termination_grace_period": "5s",
        # The watchdogs end a stuck process; here the process is the test run.
        "watchdog_enabled": "false",
    }
)
"""The worker settings :func:`run_until_idle` starts from: intervals short enough that
snoozes, the leader's sweeps and reclaims happen within a test's second or two (retry
delays are the actor's ``retry_backoff``: ``FixedBackoff(timedelta(0))`` in a test
that retries). The watchdogs are off: a blocked event loop or a hung shutdown must
fail the test, not end the pytest process."""


async def run_until_idle(
    app: TaskQ,
    *,
    timeout: float = 30.0,  # noqa: ASYNC109 - bounded by default: a test must not hang
    **settings: Any,
) -> Worker:
    """Run a worker over ``app`` until no job is left to run in its queues; returns the
    worker (``worker.processed``: the attempts it ended).

    ``app``'s backend must be open (``async with app:``, or a backend fixture of this
    plugin passed as ``TaskQ(..., backend=...)``). The worker works the queues a
    :class:`~taskq.worker.Worker` does by default unless ``queues=`` names others;
    ``settings`` override any other :class:`~taskq.settings.WorkerSettings` field,
    starting from :data:`TEST_SETTINGS`. The process's ``TASKQ_*`` variables are
    ignored, so a test runs the same everywhere. Raises ``TimeoutError`` when jobs
    are still running, pending or scheduled (a delay, a retry's backoff) after
    ``timeout`` seconds, naming them; the async actors still running are cancelled
    first, so none goes on after the test. A sync actor's thread cannot be stopped:
    the error names those still running (they hold the test process until they
    return).
    """
    if timeout <= 0:
        raise ValueError(f"timeout must be positive (seconds), not {timeout}")
    flags = {**TEST_SETTINGS, **settings, "until_idle": True}
    worker = Worker(app, WorkerSettings.load(flags, env={}))
    try:
        async with asyncio.timeout(timeout) as budget:
            await worker.run()
    except TimeoutError:
        if not budget.expired():
            raise
        ended = worker.processed  # before the cancellations below end more
        await _cancel(worker.lingering_tasks())
        left = await _jobs_left(app, worker.settings.queues)
        threads = worker.lingering_threads()
        running_on = (
            f"; {threads} sync actor call(s) still running in their threads, which "
            f"cannot be stopped"
            if threads
            else ""
        )
        raise TimeoutError(
            f"the worker still had jobs to run after {timeout} s ({ended} attempts "
            f"ended; left: {left}{running_on}): a job that never ends, one due later, or "
            f"one retried or re-enqueued without end? Pass a larger timeout= if the work "
            f"is just long"
        ) from None
    return worker


async def _cancel(tasks: list[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
    if tasks:
        # Bounded: an actor that swallows cancellation must not hang the test instead.
        await asyncio.wait(tasks, timeout=5)


async def _jobs_left(app: TaskQ, queues: list[str]) -> str:
    """What is left to run, by status, with when the first scheduled job is due."""
    rows = [
        row
        for row in await app.backend.list_jobs(JobFilter(active=True, limit=1000))
        if row.queue in queues
    ]
    counts = Counter(row.status.value for row in rows)
    parts = [f"{count} {status}" for status, count in sorted(counts.items())]
    due = [row.scheduled_at for row in rows if row.status is JobStatus.SCHEDULED]
    if due:
        parts.append(f"the first scheduled due at {min(due).isoformat()}")
    return ", ".join(parts) or "none"
