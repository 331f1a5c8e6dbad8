"""The leader's fleet loops on a real worker: queue-depth sampling, the stranded-jobs
detector and the stale-worker sweep of the worker registry."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator
from typing import Any
from uuid import UUID

import pytest
import pytest_asyncio

from taskq import TaskQ
from taskq.models import ActorConfig, EnqueueArgs
from taskq_testing.postgres import PgSchema
from tests.apps import basic
from tests.leader.conftest import Spawn, WorkerProc, wait_until

pytestmark = pytest.mark.postgres

# No worker of these tests works it, so its jobs stay where the test put them (and are
# stranded: the stranded-jobs detector names it).
_PARKED = "parked"
_GONE = "tests.apps.removed_actor"


@pytest_asyncio.fixture
async def tq(pg_schema: PgSchema) -> AsyncIterator[TaskQ]:
    app = TaskQ(pg_schema.dsn, schema=pg_schema.name, actors=basic.tq.actors.values())
    async with app:
        yield app


async def _workers(tq: TaskQ) -> set[UUID]:
    async with tq.backend.connection() as conn:  # type: ignore[attr-defined]
        rows = await conn.fetch(f"SELECT id FROM {tq.schema}.workers")
        return {row["id"] for row in rows}


def _worker_id(worker: WorkerProc) -> UUID | None:
    started = worker.events("taskq.worker-started")
    return UUID(started[0]["worker_id"]) if started else None


async def test_the_leader_logs_queue_depths_and_warns_about_stranded_jobs(
    tq: TaskQ, spawn: Spawn
) -> None:
    await tq.client.enqueue(basic.nap, {}, queue=_PARKED)
    await tq.client.enqueue(basic.nap, {}, queue=_PARKED, delay=3600)
    # An actor no worker registers any more: its job can never run.
    await tq.backend.enqueue(EnqueueArgs(actor=_GONE, queue=_PARKED, payload={}))
    worker = spawn(
        env={"TASKQ_QUEUE_DEPTH_INTERVAL": "100ms", "TASKQ_STRANDED_CHECK_INTERVAL": "100ms"}
    )

    async def sampled() -> list[dict[str, Any]]:
        return [r for r in worker.events("taskq.queue-depth") if _PARKED in r.get("queues", {})]

    [depth, *_] = await wait_until(sampled)
    assert depth["queues"][_PARKED] == {"pending": 2, "scheduled": 1, "running": 0}

    async def warned() -> list[dict[str, Any]]:
        return worker.events("taskq.stranded-jobs")

    [stranded, *_] = await wait_until(warned)
    assert stranded["level"] == "warning"
    # The actor no worker runs, and the jobs of an actor the worker runs enqueued on a
    # queue it does not work (as `taskq enqueue ... --queue nosuchq` would): no worker
    # will ever dispatch either.
    assert stranded["actors"] == {basic.nap.name: {_PARKED: 2}, _GONE: {_PARKED: 1}}
    assert stranded["queues"] == [_PARKED]
    assert stranded["jobs"] == 3
    assert "queue" in stranded["hint"]


async def test_the_leader_warns_about_jobs_of_an_actor_removed_since_a_worker_ran_it(
    tq: TaskQ, spawn: Spawn
) -> None:
    # A worker of an earlier release ran it: its actor_config row stays for good, and
    # this release's workers skip its jobs (ADR 0006), so they would wait in silence.
    await tq.backend.register_actors([ActorConfig(actor=_GONE)])
    await tq.backend.enqueue(EnqueueArgs(actor=_GONE, queue=_PARKED, payload={}))
    worker = spawn(env={"TASKQ_STRANDED_CHECK_INTERVAL": "100ms"})

    async def warned() -> list[dict[str, Any]]:
        return worker.events("taskq.stranded-jobs")

    [stranded, *_] = await wait_until(warned)
    assert stranded["actors"] == {_GONE: {_PARKED: 1}}
    assert stranded["jobs"] == 1
    assert "cancel" in stranded["hint"]


async def test_a_killed_workers_row_is_swept_and_a_stopped_worker_deregisters(
    tq: TaskQ, spawn: Spawn
) -> None:
    # Thirty heartbeats: a loaded test machine must not make the live leader look stale.
    fast = {"TASKQ_STALE_WORKER_AFTER": "3s"}
    leader = spawn(env=fast)
    await wait_until(lambda: asyncio.sleep(0, leader.events("taskq.leader-elected")))
    leader_id = _worker_id(leader)
    follower = spawn(env=fast)
    follower_id = await wait_until(lambda: asyncio.sleep(0, _worker_id(follower)))

    async def both_registered() -> bool:
        return await _workers(tq) == {leader_id, follower_id}

    await wait_until(both_registered)
    follower.proc.kill()  # SIGKILL: no deregistration, only the sweep can remove it

    async def follower_swept() -> bool:
        return await _workers(tq) == {leader_id}

    await wait_until(follower_swept, seconds=30)

    async def sweep_logged() -> bool:  # the log line follows the sweep's commit
        return any(r.get("stale_workers") == 1 for r in leader.events("taskq.leader-swept"))

    await wait_until(sweep_logged, seconds=5)
    assert not follower.events("taskq.leader-elected")

    leader.signal(signal.SIGTERM)
    await asyncio.to_thread(leader.proc.wait, 15)
    assert await _workers(tq) == set()
