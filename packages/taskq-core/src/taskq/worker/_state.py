"""What the worker's loops share: the jobs this process holds and its signals."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from taskq._di import Containers, LoopScope, ProcessScope, ProviderRegistry, ThreadScope
from taskq._scope import Scope
from taskq.actor import Actor
from taskq.backend import Backend
from taskq.client import JobsClient
from taskq.context import Context
from taskq.models import JobRow
from taskq.settings import WorkerSettings


@dataclass
class ActiveJob:
    """A job this worker locked: queued locally, then executing."""

    row: JobRow
    ctx: Context | None = None
    task: asyncio.Task[None] | None = None
    cancel_requested: bool = False
    lost: bool = False
    """The lock was lost (reclaimed elsewhere): never write this job's outcome."""


@dataclass
class WorkerState:
    """Shared by the producer, consumers, heartbeat and maintenance loops."""

    worker_id: UUID
    settings: WorkerSettings
    backend: Backend
    actors: Mapping[str, Actor[..., Any]]
    providers: ProviderRegistry
    client: JobsClient
    executor: ThreadPoolExecutor
    active: dict[UUID, ActiveJob] = field(default_factory=dict)
    queue: asyncio.Queue[JobRow | None] = field(default_factory=asyncio.Queue)
    """Locally held jobs in dispatch order; None tells a consumer to finish."""
    slot_freed: asyncio.Event = field(default_factory=asyncio.Event)
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when dispatch must stop (shutdown requested, or idle in --until-idle)."""
    finished: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once every consumer is done; the background loops then exit."""
    process_scope: ProcessScope = field(default_factory=ProcessScope)
    thread_scope: ThreadScope = field(default_factory=ThreadScope)
    loop_scope: LoopScope = field(default_factory=LoopScope)
    processed: int = 0

    @property
    def capacity(self) -> int:
        return self.settings.concurrency + self.settings.prefetch

    def containers(self) -> Containers:
        return {
            Scope.PROCESS: self.process_scope,
            Scope.THREAD: self.thread_scope,
            Scope.LOOP: self.loop_scope.current(),
        }

    def hold(self, row: JobRow) -> None:
        """Track a freshly dispatched job and queue it for a consumer.

        A job reclaimed and dispatched again to this same worker may still
        have its old attempt running here: that attempt is lost, so it is
        cancelled and can never write over the new one.
        """
        previous = self.active.get(row.id)
        if previous is not None:
            previous.lost = True
            if previous.task is not None:
                previous.task.cancel()
        self.active[row.id] = ActiveJob(row)
        self.queue.put_nowait(row)

    def release(self, job_id: UUID, active: ActiveJob) -> None:
        """Forget a job (done or lost) and let the producer fill the slot."""
        if self.active.get(job_id) is active:
            del self.active[job_id]
        self.slot_freed.set()
