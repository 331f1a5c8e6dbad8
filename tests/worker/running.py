"""A worker running in the test's own event loop, for as long as a ``with`` lasts."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

from taskq import TaskQ, WorkerSettings
from taskq.worker import Worker


@asynccontextmanager
async def running(
    tq: TaskQ, settings: Mapping[str, Any], *, stop_within: float = 10
) -> AsyncIterator[Worker]:
    """A worker on ``tq`` running while inside; stopped and awaited on the way out.

    Its watchdogs are off unless ``settings`` turn them on: in the test's own process, a
    trip ends the whole pytest worker (exit 2), as a loop-lag budget of half a short lease
    did on a loaded machine (so does ``taskq_testing.TEST_SETTINGS``)."""
    worker = Worker(tq, WorkerSettings.load({"watchdog_enabled": False, **settings}, env={}))
    run = asyncio.create_task(worker.run())
    try:
        yield worker
    finally:
        worker.stop()
        await asyncio.wait_for(run, stop_within)


async def phase_logged(logs: Sequence[Mapping[str, Any]], phase: str, within: float = 5) -> None:
    """Until ``logs`` (structlog's ``capture_logs``) hold the stop's ``phase`` line."""

    async def logged() -> None:
        while not any(entry.get("phase") == phase for entry in logs):  # noqa: ASYNC110 - the stop's own log
            await asyncio.sleep(0.01)

    await asyncio.wait_for(logged(), within)
