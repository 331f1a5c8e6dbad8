"""The cancel controller over jobs dispatched on an in-memory backend, with the worker
state it reads made by hand, for tests that drive its ticks one by one."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta
from types import SimpleNamespace
from typing import Any
from uuid import UUID, uuid4

from taskq.backend import CancelPhase
from taskq.backend.memory import InMemoryBackend
from taskq.models import EnqueueArgs, ErrorInfo, JobRow
from taskq.worker._state import ActiveJob
from taskq.worker.cancel import make_cancel_controller


async def dispatched(backend: InMemoryBackend, n: int = 1) -> tuple[UUID, list[JobRow]]:
    """``n`` jobs enqueued and dispatched to a new worker id: (the worker, their rows)."""
    worker = uuid4()
    for _ in range(n):
        await backend.enqueue(EnqueueArgs(actor="a"))
    return worker, await backend.dispatch_batch(worker, ["default"], n, timedelta(minutes=5))


def past_its_limit(row: JobRow, release: Callable[[], None] = lambda: None) -> ActiveJob:
    """``row``'s entry, its task running on past its limit and cleanup grace: the next
    tick writes it off."""
    active = ActiveJob(row, release=release)
    active.limit_at = -1.0
    active.limit_error = ErrorInfo(error_class="TimeoutError", message="t")
    active.task = asyncio.create_task(asyncio.sleep(10))
    return active


async def forced_past_cleanup(backend: InMemoryBackend, worker: UUID, row: JobRow) -> ActiveJob:
    """``row``'s entry, cancelled by a user and forced (phase 2 stored) long ago, its
    task running on: the next tick queues its abandonment."""
    assert await backend.write_cancel_request(row.id, None)
    assert await backend.write_cancel_escalation(row.id, worker, 2, attempt=row.attempt)
    active = ActiveJob(row, release=lambda: None)
    active.cancel_requested = True
    active.cancel_phase = CancelPhase.FORCED
    active.cancel_observed_at = active.cancel_forced_at = -100.0
    active.task = asyncio.create_task(asyncio.sleep(10))
    return active


def worker_state(backend: InMemoryBackend, worker: UUID, *actives: ActiveJob) -> Any:
    """What the controller and ``heartbeat_once`` / ``heartbeat_loop`` read of a
    worker's state (no graces, a 5 min lease), its controller as ``state.cancel``."""

    async def register() -> None:
        return None

    state: Any = SimpleNamespace(
        active={active.row.id: active for active in actives},
        backend=backend,
        worker_id=worker,
        settings=SimpleNamespace(
            cleanup_grace_period=timedelta(0),
            cancellation_grace_period=timedelta(0),
            lock_lease=timedelta(minutes=5),
            heartbeat_interval=timedelta(seconds=1),
            dispatcher_command_timeout=timedelta(seconds=2),
        ),
        unheard_suspected=False,
        liveness=SimpleNamespace(tick=lambda *args: None),
        register=register,
    )
    state.cancel = make_cancel_controller(state)
    return state
