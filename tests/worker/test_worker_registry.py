"""The worker's registry row: written at start-up, restored after a stale sweep."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from taskq import TaskQ, WorkerSettings
from taskq.backend.memory import InMemoryBackend
from taskq.worker import Worker
from tests.apps import basic


async def _until(predicate: Callable[[], bool], seconds: float = 10.0) -> None:
    async with asyncio.timeout(seconds):
        while not predicate():  # noqa: ASYNC110 - a dict, not an event, is observed
            await asyncio.sleep(0.01)


async def test_a_worker_whose_row_was_swept_registers_again() -> None:
    tq = TaskQ("memory://", actors=basic.tq.actors.values())
    settings = WorkerSettings.load(
        # The watchdogs off: in the test's process, a trip ends the whole pytest worker.
        {
            "poll_interval": "50ms",
            "heartbeat_interval": "50ms",
            "lock_lease": "1s",
            "watchdog_enabled": False,
        },
        env={},
    )
    async with tq:
        backend = tq.backend
        assert isinstance(backend, InMemoryBackend)
        worker = Worker(tq, settings)
        run = asyncio.create_task(worker.run())
        try:
            await _until(lambda: worker.worker_id in backend.workers)
            first = backend.workers[worker.worker_id]
            # What the leader's stale-worker sweep does to a worker that stalled too long.
            await backend.deregister_worker(worker.worker_id)
            await _until(lambda: worker.worker_id in backend.workers, seconds=5)
            restored = backend.workers[worker.worker_id]
            assert (restored.hostname, restored.pid, restored.queues) == (
                first.hostname,
                first.pid,
                first.queues,
            )
        finally:
            worker.stop()
            await asyncio.wait_for(run, 10)
        assert worker.worker_id not in backend.workers  # a clean stop deregisters
