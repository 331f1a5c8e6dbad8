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
from taskq.errors import UnknownActorError
from taskq.models import JobFilter, JobRow
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
    starting from :data:`TEST_SETTINGS`. The worker's settings ignore the process's
    ``TASKQ_*`` variables, so a test runs the same everywhere (an application built
    from a URL takes the backend's own from them, as any application does). Raises ``TimeoutError`` when jobs
    are still running, pending or scheduled (a delay, a retry's backoff) after
    ``timeout`` seconds, counting them by status and naming their actors; the async
    actors still running are cancelled first, so none goes on after the test. Neither
    a sync actor's thread nor an async actor that swallows its cancellation can be
    stopped: the error counts those (they hold the test until they return).
    ``UnknownActorError`` when the worker found nothing left to run but jobs of actors
    ``app`` does not define wait in its queues (a misspelt actor name).
    """
    if not timeout > 0:  # NaN too: it compares false either way, and never expired
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
        stubborn = await _cancel(worker.lingering_tasks())
        left = _jobs_left(await _active_rows(app, worker.settings.queues))
        threads = worker.lingering_threads()
        running_on = "".join(
            [
                f"; {threads} sync actor call(s) still running in their threads, which "
                f"cannot be stopped"
                if threads
                else "",
                f"; {stubborn} async actor(s) still running, having swallowed their "
                f"cancellation (the test's event loop waits for them at its end)"
                if stubborn
                else "",
            ]
        )
        raise TimeoutError(
            f"the worker still had jobs to run after {timeout} s ({ended} attempts "
            f"ended; left: {left}{running_on}): a job that never ends, one due later, or "
            f"one retried or re-enqueued without end? Pass a larger timeout= if the work "
            f"is just long"
        ) from None
    orphans = sorted(
        {
            row.actor
            for row in await _active_rows(app, worker.settings.queues)
            if row.actor not in app.actors
        }
    )
    if orphans:
        raise UnknownActorError(
            f"jobs of actors this application does not define wait in its queues: "
            f"{', '.join(map(repr, orphans))}; a misspelt actor name, or an actor missing "
            f"from TaskQ(actors=[...])? No worker of this application will run them"
        )
    return worker


async def _cancel(tasks: list[asyncio.Task[None]]) -> int:
    """Cancel ``tasks``; how many still run after a bounded wait."""
    for task in tasks:
        task.cancel()
    if not tasks:
        return 0
    # Bounded: an actor that swallows cancellation must not hang the test instead.
    _, pending = await asyncio.wait(tasks, timeout=5)
    return len(pending)


_MOST_ROWS = 10_000
"""The most active rows read to say what is left (a test's backlog, not a fleet's)."""


async def _active_rows(app: TaskQ, queues: list[str]) -> list[JobRow]:
    """The active jobs of ``queues`` (at most :data:`_MOST_ROWS`), queue by queue: read
    across every queue, a larger backlog elsewhere hid them."""
    rows: list[JobRow] = []
    for queue in queues:
        page = JobFilter(active=True, queue=queue, limit=1000)
        while len(rows) < _MOST_ROWS and (batch := await app.backend.list_jobs(page)):
            rows += batch
            page = page.after(batch[-1])
    return rows


def _jobs_left(rows: list[JobRow]) -> str:
    """What is left to run, by status, with when the first scheduled job is due and the
    actors concerned."""
    counts = Counter(row.status.value for row in rows)
    parts = [f"{count} {status}" for status, count in sorted(counts.items())]
    due = [row.scheduled_at for row in rows if row.status is JobStatus.SCHEDULED]
    if due:
        parts.append(f"the first scheduled due at {min(due).isoformat()}")
    actors = sorted({row.actor for row in rows})
    if actors:
        shown = ", ".join(actors[:5]) + (f" and {len(actors) - 5} more" if len(actors) > 5 else "")
        parts.append(f"of actors {shown}")
    return ", ".join(parts) or "none"
