"""Run a worker in-process until its queues are idle: tests of an application's actors.

async with app:
    job = await app.client.enqueue(resize, {"image_id": 1})
    worker = await run_until_idle(app)
    assert await app.client.wait_for_result(job.id, timeout=1) == {"ok": True}
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final

from taskq import TaskQ
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
    }
)
"""The worker settings :func:`run_until_idle` starts from: intervals short enough that
retries, snoozes and the leader's sweeps happen within a test's second or two."""


def _all_queues(app: TaskQ) -> list[str]:
    return sorted(
        {"default"}
        | {a.options.queue for a in app.actors.values()}
        | {config.queue for config in app.queues}
    )


async def run_until_idle(
    app: TaskQ,
    *,
    timeout: float = 30.0,  # noqa: ASYNC109 - bounded by default: a test must not hang
    **settings: Any,
) -> Worker:
    """Run a worker over ``app`` until no job is left to run in its queues; returns the
    worker (``worker.processed``: the jobs it finished).

    ``app``'s backend must be open (``async with app:``, or a backend fixture of this
    plugin passed as ``TaskQ(..., backend=...)``). The worker takes every queue of
    ``app``'s actors and configured queues unless ``queues=`` names others;
    ``settings`` override any other :class:`~taskq.settings.WorkerSettings` field,
    starting from :data:`TEST_SETTINGS`. The process's ``TASKQ_*`` variables are
    ignored, so a test runs the same everywhere. Raises ``TimeoutError`` when jobs
    are still running or due after ``timeout`` seconds.
    """
    flags = {**TEST_SETTINGS, "queues": _all_queues(app), **settings, "until_idle": True}
    worker = Worker(app, WorkerSettings.load(flags, env={}))
    try:
        async with asyncio.timeout(timeout) as budget:
            await worker.run()
    except TimeoutError:
        if not budget.expired():
            raise
        raise TimeoutError(
            f"the worker still had jobs to run after {timeout} s ({worker.processed} "
            f"finished): a job that never ends, or one retried or re-enqueued without "
            f"end? Pass a larger timeout= if the work is just long"
        ) from None
    return worker
