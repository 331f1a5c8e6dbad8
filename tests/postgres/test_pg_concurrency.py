"""Concurrent dispatchers on one schema: each job handed out once, caps and identities held."""

from __future__ import annotations

import asyncio
import itertools
from collections import defaultdict
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID, uuid4

import asyncpg
import pytest
import pytest_asyncio

from taskq.models import ActorConfig, EnqueueArgs, JobFilter, QueueConfig
from taskq_postgres import PostgresBackend
from taskq_testing.postgres import PgSchema

pytestmark = pytest.mark.postgres

DISPATCHERS = 8
LEASE = timedelta(minutes=5)
QUEUES = ["q1", "q2"]
CAP = 3


@pytest_asyncio.fixture
async def backend(pg_schema: PgSchema) -> AsyncIterator[PostgresBackend]:
    backend = PostgresBackend(
        pg_schema.dsn, schema=pg_schema.name, min_pool_size=2, max_pool_size=DISPATCHERS + 4
    )
    await backend.open()
    yield backend
    await backend.close()


@pytest_asyncio.fixture
async def conn(pg_schema: PgSchema) -> AsyncIterator[asyncpg.Connection[Any]]:
    connection: asyncpg.Connection[Any] = await asyncpg.connect(pg_schema.dsn)
    yield connection
    await connection.close()


async def test_eight_dispatchers_hand_out_5000_jobs_once_each(
    backend: PostgresBackend, conn: asyncpg.Connection[Any], pg_schema: PgSchema
) -> None:
    jobs = [
        EnqueueArgs(actor=f"actor-{i % 20}", queue=QUEUES[i % 2], priority=i % 3)
        for i in range(5000)
    ]
    assert await backend.enqueue_batch_fast(jobs) == 5000
    handed_out: dict[UUID, list[UUID]] = {}

    async def dispatcher() -> None:
        worker = uuid4()
        mine = handed_out.setdefault(worker, [])
        while True:
            rows = await backend.dispatch_batch(worker, QUEUES, 50, LEASE)
            mine.extend(row.id for row in rows)
            if not rows and not await backend.list_jobs(JobFilter(status="pending", limit=1)):
                return

    await asyncio.gather(*(dispatcher() for _ in range(DISPATCHERS)))

    every = list(itertools.chain.from_iterable(handed_out.values()))
    assert len(every) == len(set(every)) == 5000, "a job was handed out twice, or one was missed"
    assert set(every) == {job.id for job in jobs}
    assert sum(1 for ids in handed_out.values() if ids) > 1, "only one dispatcher got work"
    s = pg_schema.name
    assert (
        await conn.fetchval(
            f"SELECT count(*) FROM {s}.jobs WHERE status = 'running' AND attempt = 1"
        )
        == 5000
    )
    assert await conn.fetchval(f"SELECT count(*) FROM {s}.job_events") == 5000


def _max_overlap(intervals: list[tuple[datetime, datetime]]) -> int:
    """The largest number of [start, end) intervals open at one instant."""
    edges = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    open_now = peak = 0
    for _, step in edges:  # at equal times the end (-1) sorts first: [start, end)
        open_now += step
        peak = max(peak, open_now)
    return peak


async def _drained_by_dispatchers(backend: PostgresBackend, queues: list[str]) -> list[UUID]:
    """Every job of ``queues`` dispatched (20 at a time) by DISPATCHERS workers at once,
    each running its batch's jobs for a moment and marking them succeeded, until none is
    active: the ids handed out, in order."""
    handed_out: list[UUID] = []

    async def run(worker: UUID, job_id: UUID) -> None:
        await asyncio.sleep(0.002)  # the "work"
        assert await backend.mark_succeeded(job_id, worker, None, attempt=1)

    async def dispatcher() -> None:
        worker = uuid4()
        while True:
            rows = await backend.dispatch_batch(worker, queues, 20, LEASE)
            handed_out.extend(row.id for row in rows)
            await asyncio.gather(*(run(worker, row.id) for row in rows))
            if not rows:
                if await backend.count_active_jobs(queues) == 0:
                    return
                await asyncio.sleep(0.001)

    await asyncio.wait_for(asyncio.gather(*(dispatcher() for _ in range(DISPATCHERS))), 60)
    return handed_out


async def test_caps_and_identities_hold_under_eight_dispatchers(
    backend: PostgresBackend, conn: asyncpg.Connection[Any], pg_schema: PgSchema
) -> None:
    await backend.register_actors([ActorConfig(actor="capped", max_concurrent=CAP)])
    jobs = (
        [EnqueueArgs(actor="capped", queue="q1") for _ in range(150)]
        + [
            EnqueueArgs(actor="keyed", queue="q2", identity_key=f"user-{i % 15}")
            for i in range(300)
        ]
        + [EnqueueArgs(actor=f"free-{i % 4}", queue=QUEUES[i % 2]) for i in range(600)]
    )
    assert await backend.enqueue_batch_fast(jobs) == len(jobs)
    s = pg_schema.name
    done = asyncio.Event()
    samples: list[tuple[int, int]] = []

    async def sampler() -> None:
        while not done.is_set():
            capped_running = await conn.fetchval(
                f"SELECT count(*) FROM {s}.jobs WHERE status = 'running' AND actor = 'capped'"
            )
            doubled = await conn.fetchval(
                f"SELECT count(*) FROM (SELECT 1 FROM {s}.jobs "
                f"WHERE status = 'running' AND identity_key IS NOT NULL "
                f"GROUP BY actor, identity_key HAVING count(*) > 1) d"
            )
            samples.append((capped_running, doubled))
            await asyncio.sleep(0.002)

    sampling = asyncio.create_task(sampler())
    try:
        await _drained_by_dispatchers(backend, QUEUES)
    finally:
        done.set()
        await sampling

    assert await conn.fetchval(f"SELECT count(*) FROM {s}.jobs WHERE status = 'succeeded'") == len(
        jobs
    )
    assert samples, "the sampler never ran"
    over_count = (DISPATCHERS - 1) * CAP
    assert max(capped for capped, _ in samples) <= CAP + over_count
    assert all(doubled == 0 for _, doubled in samples), "two jobs of one identity ran together"

    # Exact checks from the attempt history (both ends come from the server clock).
    records = await conn.fetch(
        f"SELECT j.actor, j.identity_key, a.started_at, a.finished_at "
        f"FROM {s}.job_attempts a JOIN {s}.jobs j ON j.id = a.job_id "
        f"WHERE j.actor IN ('capped', 'keyed')"
    )
    capped = [(r["started_at"], r["finished_at"]) for r in records if r["actor"] == "capped"]
    assert len(capped) == 150
    assert _max_overlap(capped) <= CAP + over_count
    by_identity: dict[str, list[tuple[datetime, datetime]]] = defaultdict(list)
    for r in records:
        if r["actor"] == "keyed":
            by_identity[r["identity_key"]].append((r["started_at"], r["finished_at"]))
    assert len(by_identity) == 15
    for identity, intervals in by_identity.items():
        assert _max_overlap(intervals) == 1, f"identity {identity} ran twice at once"


async def test_a_cap_with_room_for_the_sample_reads_past_jobs_other_dispatchers_hold(
    backend: PostgresBackend, conn: asyncpg.Connection[Any], pg_schema: PgSchema
) -> None:
    # A dispatch of 2 samples 4 jobs an actor (oversample 2). An actor whose cap leaves
    # room for all 4 is admitted as an uncapped one, so the dispatch reads past the jobs
    # another dispatcher holds: cut at its residual (2), a second worker got nothing
    # behind the first's batch while the cap had room.
    await backend.register_actors(
        [ActorConfig(actor="roomy", max_concurrent=4), ActorConfig(actor="tight", max_concurrent=3)]
    )
    for actor in ("roomy", "tight"):
        await backend.enqueue_batch([EnqueueArgs(actor=actor, queue=actor) for _ in range(6)])
    s = pg_schema.name
    async with conn.transaction():
        held = {
            r["id"]
            for actor in ("roomy", "tight")
            for r in await conn.fetch(
                f"SELECT id FROM {s}.jobs WHERE actor = $1 "
                f"ORDER BY priority DESC, scheduled_at, id LIMIT 2 FOR UPDATE",
                actor,
            )
        }
        roomy = await backend.dispatch_batch(uuid4(), ["roomy"], 2, LEASE)
        assert len(roomy) == 2 and not {job.id for job in roomy} & held
        # Room for 3, short of the sample: cut at the residual, the held jobs, so that the
        # dispatchers together stay within the cap.
        assert await backend.dispatch_batch(uuid4(), ["tight"], 2, LEASE) == []


async def test_round_robin_caps_hold_under_eight_dispatchers(
    backend: PostgresBackend, conn: asyncpg.Connection[Any], pg_schema: PgSchema
) -> None:
    # The capped actor shares every fairness key with the free ones, so each dispatch
    # samples each (queue, actor) apart and ranks the samples together: still each job
    # once, and the cap held to its documented over-count.
    await backend.configure_queue(QueueConfig(queue="rr", mode="round_robin"))
    await backend.register_actors([ActorConfig(actor="capped", max_concurrent=CAP)])
    jobs = [
        EnqueueArgs(
            actor="capped" if i % 4 == 0 else f"free-{i % 3}", queue="rr", fairness_key=f"t{i % 5}"
        )
        for i in range(600)
    ]
    assert await backend.enqueue_batch_fast(jobs) == len(jobs)
    handed_out = await _drained_by_dispatchers(backend, ["rr"])

    assert len(handed_out) == len(set(handed_out)) == len(jobs), "a job was handed out twice"
    s = pg_schema.name
    assert await conn.fetchval(f"SELECT count(*) FROM {s}.jobs WHERE status = 'succeeded'") == len(
        jobs
    )
    records = await conn.fetch(
        f"SELECT a.started_at, a.finished_at FROM {s}.job_attempts a"
        f" JOIN {s}.jobs j ON j.id = a.job_id WHERE j.actor = 'capped'"
    )
    capped = [(r["started_at"], r["finished_at"]) for r in records]
    assert len(capped) == 150
    assert _max_overlap(capped) <= CAP + (DISPATCHERS - 1) * CAP


async def test_dispatchers_racing_for_one_identity_start_one_job(
    backend: PostgresBackend, conn: asyncpg.Connection[Any], pg_schema: PgSchema
) -> None:
    # A dispatcher whose snapshot predates a higher-priority job of the same identity
    # starts the older one; another, snapshot taken after, sees it still pending and
    # would start the newer one: two running jobs of one identity.
    older = await backend.enqueue(EnqueueArgs(actor="a", queue="q1", identity_key="k"))
    first = conn.transaction()
    await first.start()
    await conn.execute(
        f"UPDATE {pg_schema.name}.jobs SET status = 'running', attempt = 1,"
        " locked_by_worker = $2, lock_expires_at = clock_timestamp() + interval '5 minutes',"
        " started_at = clock_timestamp() WHERE id = $1",
        older.id,
        uuid4(),
    )
    newer = await backend.enqueue(EnqueueArgs(actor="a", queue="q1", identity_key="k", priority=10))
    second = asyncio.create_task(backend.dispatch_batch(uuid4(), ["q1"], 10, LEASE))
    await asyncio.sleep(0.5)
    assert not second.done(), "the second start did not wait for the first"
    await first.commit()
    assert await second == []  # it lost the race, ran again and saw the running job
    running = await conn.fetch(f"SELECT id FROM {pg_schema.name}.jobs WHERE status = 'running'")
    assert [r["id"] for r in running] == [older.id]
    assert (await backend.get(newer.id)) is not None


async def test_batches_sharing_idempotency_keys_in_other_orders_never_deadlock(
    backend: PostgresBackend,
) -> None:
    # Inserted in each caller's order, two such batches waited on each other's
    # speculative inserts crosswise: a third of the rounds raised DeadlockDetectedError.
    for round_ in range(15):
        keys = [f"r{round_}-{i}" for i in range(300)]

        def batch(order: list[str]) -> list[EnqueueArgs]:
            return [EnqueueArgs(actor="idem", queue="q1", idempotency_key=k) for k in order]

        first, second = await asyncio.gather(
            backend.enqueue_batch(batch(keys)), backend.enqueue_batch(batch(keys[::-1]))
        )
        assert [r.idempotency_key for r in first] == keys  # in the caller's order
        by_key = {r.idempotency_key: r.id for r in first}
        assert [by_key[r.idempotency_key] for r in second] == [r.id for r in second]
    assert len(await backend.list_jobs(JobFilter(limit=10_000))) == 15 * 300
