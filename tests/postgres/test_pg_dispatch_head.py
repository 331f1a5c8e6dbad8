"""Strict-FIFO dispatch reads the head of the queue first, and falls back to sampling
every actor only when caps or identities filter most of the head out.

The randomized test checks the statement against a Python model of the
per-actor sample (architecture.md, "Dispatch CTE") on small backlogs, where a
small ``limit_n * oversample`` makes both the head path and the fallback run.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID, uuid4

import asyncpg
import pytest
import pytest_asyncio

from taskq.models import ActorConfig, EnqueueArgs, QueueConfig
from taskq_postgres import PostgresBackend
from taskq_postgres._statements import statements_for
from taskq_testing.postgres import PgSchema
from tests.postgres.plans import index_rows

pytestmark = pytest.mark.postgres

LEASE = timedelta(minutes=5)
PAST = datetime(2026, 1, 1, tzinfo=UTC)
"""Every job of the model is due; no sweep runs here, so leases may have expired too."""


@pytest_asyncio.fixture
async def backend(pg_schema: PgSchema) -> AsyncIterator[PostgresBackend]:
    backend = PostgresBackend(pg_schema.dsn, schema=pg_schema.name)
    await backend.open()
    yield backend
    await backend.close()


@pytest_asyncio.fixture
async def conn(pg_schema: PgSchema) -> AsyncIterator[asyncpg.Connection[Any]]:
    connection: asyncpg.Connection[Any] = await asyncpg.connect(pg_schema.dsn)
    yield connection
    await connection.close()


def _jobs(actor: str, count: int, **fields: Any) -> list[EnqueueArgs]:
    return [EnqueueArgs(actor=actor, queue="default", **fields) for _ in range(count)]


async def test_a_capped_actor_at_the_head_does_not_starve_the_actors_behind_it(
    backend: PostgresBackend,
) -> None:
    # 10 of a batch of 10, oversample 2: the head is 20 jobs, all the hog's, of
    # which its cap admits 2; the other 8 must come from the actors behind it.
    await backend.register_actors([ActorConfig(actor="hog", max_concurrent=2)])
    await backend.enqueue_batch(_jobs("hog", 100))
    for actor in ("a", "b", "c"):
        await backend.enqueue_batch(_jobs(actor, 10))
    rows = await backend.dispatch_batch(uuid4(), ["default"], 10, LEASE)
    assert Counter(r.actor for r in rows) == {"hog": 2, "a": 8}


async def test_one_identity_at_the_head_does_not_starve_the_actors_behind_it(
    backend: PostgresBackend,
) -> None:
    await backend.enqueue_batch(_jobs("dup", 100, identity_key="same"))
    await backend.enqueue_batch(_jobs("a", 5))
    await backend.enqueue_batch(_jobs("b", 10))
    rows = await backend.dispatch_batch(uuid4(), ["default"], 10, LEASE)
    assert Counter(r.actor for r in rows) == {"dup": 1, "a": 5, "b": 4}


async def test_a_deep_queue_dispatch_reads_the_head_not_every_actors_sample(
    conn: asyncpg.Connection[Any], pg_schema: PgSchema
) -> None:
    # 50 uncapped actors, 300 jobs each: sampling every actor would read
    # 50 * 100 * 2 = 10,000 index entries for a batch of 100.
    s = pg_schema.name
    await conn.execute(
        f"INSERT INTO {s}.jobs (actor, queue, priority, scheduled_at) "
        f"SELECT 'actor_' || (g % 50), 'default', g % 3, "
        f"clock_timestamp() - interval '1 hour' + g * interval '1 ms' "
        f"FROM generate_series(1, 15000) AS g"
    )
    await conn.execute(f"VACUUM ANALYZE {s}.jobs")
    args: list[Any] = [["default"], 100, uuid4(), LEASE, 2, None]
    statement = statements_for(s).dispatch_strict_fifo
    order = "ORDER BY priority DESC, scheduled_at, id"
    first = await conn.fetch(f"SELECT id FROM {s}.jobs {order} LIMIT 100")
    plan = json.loads(await conn.fetchval(f"EXPLAIN (ANALYZE, FORMAT JSON) {statement}", *args))
    dispatched = await conn.fetch(f"SELECT id FROM {s}.jobs WHERE status = 'running' {order}")
    assert [r["id"] for r in dispatched] == [r["id"] for r in first]
    root = plan[0]["Plan"]
    assert index_rows(root, "jobs_dispatch_head_idx") == 200
    # The loose index scan naming the pending actors reads one entry per actor.
    assert index_rows(root, "jobs_dispatch_idx") <= 60


async def test_a_deep_backlog_of_other_actors_at_the_head_is_not_read_through(
    conn: asyncpg.Connection[Any], pg_schema: PgSchema
) -> None:
    # 15,000 jobs of actors the worker does not run ahead of 300 of its own: its
    # dispatch reads the head, finds none of its actors there, and samples its
    # actor (one probe per pending actor), never the others' backlog.
    s = pg_schema.name
    await conn.execute(
        f"INSERT INTO {s}.jobs (actor, queue, priority) "
        f"SELECT CASE WHEN g <= 15000 THEN 'other_' || (g % 10) ELSE 'mine' END, 'default', "
        f"CASE WHEN g <= 15000 THEN 5 ELSE 0 END FROM generate_series(1, 15300) AS g"
    )
    await conn.execute(f"VACUUM ANALYZE {s}.jobs")
    statement = statements_for(s).dispatch_strict_fifo
    args: list[Any] = [["default"], 100, uuid4(), LEASE, 2, ["mine"]]
    plan = json.loads(await conn.fetchval(f"EXPLAIN (ANALYZE, FORMAT JSON) {statement}", *args))
    dispatched = await conn.fetch(f"SELECT actor FROM {s}.jobs WHERE status = 'running'")
    assert [r["actor"] for r in dispatched] == ["mine"] * 100
    root = plan[0]["Plan"]
    assert index_rows(root, "jobs_dispatch_head_idx", filtered=True) == 200
    # A probe per pending actor (11), then the sample of 'mine': 100 * 2.
    assert index_rows(root, "jobs_dispatch_idx", filtered=True) <= 11 + 200 + 11


@pytest.mark.parametrize("gate", ["none", "actor_cap", "identity", "queue_cap"])
async def test_a_head_without_caps_or_identities_skips_the_per_actor_machinery(
    backend: PostgresBackend, conn: asyncpg.Connection[Any], pg_schema: PgSchema, gate: str
) -> None:
    # Nothing at the head is capped or identity-gated: the batch is the head's first
    # limit_n jobs, so the statement must not name the pending actors (a loose scan
    # of jobs_dispatch_idx) nor count their running jobs. One gate brings them back.
    s = pg_schema.name
    if gate == "actor_cap":
        await backend.register_actors([ActorConfig(actor="a", max_concurrent=50)])
    if gate == "queue_cap":
        await backend.configure_queue(QueueConfig(queue="default", max_concurrent=50))
    await backend.enqueue_batch(_jobs("a", 20, identity_key="k" if gate == "identity" else None))
    await backend.enqueue_batch(_jobs("b", 20))
    await conn.execute(f"VACUUM ANALYZE {s}.jobs")
    statement = statements_for(s).dispatch_strict_fifo
    args: list[Any] = [["default"], 10, uuid4(), LEASE, 2, None]
    plan = json.loads(await conn.fetchval(f"EXPLAIN (ANALYZE, FORMAT JSON) {statement}", *args))
    assert index_rows(plan[0]["Plan"], "jobs_dispatch_head_idx") == 20
    ran = dict(_ctes_run(plan[0]["Plan"]))
    per_actor = ("pending_actors", "running_per_actor", "per_actor_capacity", "head_admitted")
    if gate == "none":
        assert not any(ran[cte] for cte in per_actor), ran
    else:
        assert all(ran[cte] for cte in per_actor), ran


def _ctes_run(node: dict[str, Any]) -> Iterable[tuple[str, bool]]:
    """(CTE name, whether it ran) for every CTE of ``node``."""
    if node.get("Subplan Name", "").startswith("CTE "):
        yield node["Subplan Name"].removeprefix("CTE "), node["Actual Loops"] > 0
    for child in node.get("Plans", ()):
        yield from _ctes_run(child)


# ---------------------------------------------------------------- the model


@dataclass(frozen=True)
class Job:
    id: UUID
    actor: str
    queue: str
    priority: int
    scheduled_at: datetime
    identity_key: str | None
    running: bool

    def key(self) -> tuple[int, datetime, UUID]:
        return (-self.priority, self.scheduled_at, self.id)


@dataclass(frozen=True)
class Case:
    jobs: list[Job]
    actor_caps: dict[str, int]
    queue_caps: dict[str, int]
    queues: list[str]
    limit: int
    oversample: int
    actors: list[str] | None
    """The actors asked for (``dispatch_actors_batch``), None for all."""


def _expected(case: Case) -> tuple[list[UUID], bool]:
    """The per-actor sample's batch, in dispatch order, and whether the head of the
    queues (their first limit * oversample jobs) alone gives the same batch."""
    every_pending = sorted(
        (j for j in case.jobs if not j.running and j.queue in case.queues), key=Job.key
    )

    def asked(jobs: list[Job]) -> list[Job]:
        return [j for j in jobs if case.actors is None or j.actor in case.actors]

    pending = asked(every_pending)
    running = [j for j in case.jobs if j.running]
    actors = {j.actor for j in pending}
    in_flight = Counter(j.actor for j in running)
    running_identities = {(j.actor, j.identity_key) for j in running if j.identity_key}
    residual = {
        a: case.limit
        if a not in case.actor_caps
        else min(case.limit, max(case.actor_caps[a] - in_flight[a], 0))
        for a in actors
    }

    def sample(jobs: list[Job]) -> list[Job]:
        # Past the jobs of running identities: they would fill the sample for as long
        # as the identity runs, hiding every job behind them.
        taken: Counter[tuple[str, str]] = Counter()
        kept = []
        for job in jobs:
            if (job.actor, job.identity_key) in running_identities:
                continue
            taken[job.queue, job.actor] += 1
            if taken[job.queue, job.actor] <= residual[job.actor] * case.oversample:
                kept.append(job)
        return kept

    queue_running = Counter(j.queue for j in running)
    queue_residual = {q: max(cap - queue_running[q], 0) for q, cap in case.queue_caps.items()}

    def admit(candidates: list[Job]) -> list[Job]:
        # As the in-memory walk takes them: each job whose queue and actor still have
        # room and whose identity no job taken before it holds, counting only the jobs
        # taken before it (a job refused for one cap takes no place under another).
        queue_taken: Counter[str] = Counter()
        actor_taken: Counter[str] = Counter()
        seen: set[tuple[str, str]] = set()
        admitted = []
        for job in candidates:
            identity = (job.actor, job.identity_key) if job.identity_key is not None else None
            if identity in running_identities or identity in seen:
                continue
            if job.queue in queue_residual and queue_taken[job.queue] >= queue_residual[job.queue]:
                continue
            if actor_taken[job.actor] >= residual[job.actor]:
                continue
            if identity is not None:
                seen.add(identity)
            queue_taken[job.queue] += 1
            actor_taken[job.actor] += 1
            admitted.append(job)
        return admitted

    # The head is the first jobs of every actor; the others' jobs take no place in it.
    head_size = case.limit * case.oversample
    head_suffices = (
        len(admit(sample(asked(every_pending[:head_size])))) >= case.limit
        or len(every_pending) < head_size
    )
    locked = admit(sample(pending))[: case.limit]
    gated = [
        j
        for j in locked
        if j.actor not in case.actor_caps or in_flight[j.actor] < case.actor_caps[j.actor]
    ]
    actor_ranks: Counter[str] = Counter()
    capped = []
    for job in gated:
        actor_ranks[job.actor] += 1
        cap = case.actor_caps.get(job.actor)
        if cap is None or actor_ranks[job.actor] <= cap - in_flight[job.actor]:
            capped.append(job)
    queue_ranks = Counter[str]()
    batch = []
    for job in capped:
        queue_ranks[job.queue] += 1
        cap = case.queue_caps.get(job.queue)
        if cap is None or queue_ranks[job.queue] <= max(cap - queue_running[job.queue], 0):
            batch.append(job)
    return [j.id for j in batch[: case.limit]], head_suffices


def _case(rng: random.Random) -> Case:
    actors = ["a0", "a1", "a2", "a3"]
    jobs = [
        Job(
            id=uuid4(),
            actor=rng.choice(actors[:2]) if rng.random() < 0.6 else rng.choice(actors),
            queue=rng.choice(["q0", "q0", "q1"]),
            priority=rng.choice([0, 0, 1, 2]),
            # Few distinct times, so ties fall through to the id.
            scheduled_at=PAST + timedelta(minutes=rng.randrange(15)),
            identity_key=rng.choice([None, None, "k0", "k1", "k2"]),
            running=rng.random() < 0.2,
        )
        for _ in range(rng.randrange(5, 60))
    ]
    # At most one running job per identity: the schema refuses a second one.
    seen: set[tuple[str, str]] = set()
    for i, job in enumerate(jobs):
        if job.running and job.identity_key is not None:
            if (job.actor, job.identity_key) in seen:
                jobs[i] = replace(job, running=False)
            seen.add((job.actor, job.identity_key))
    return Case(
        jobs=jobs,
        actor_caps={a: rng.randrange(1, 5) for a in actors if rng.random() < 0.5},
        queue_caps={q: rng.randrange(1, 8) for q in ("q0", "q1") if rng.random() < 0.25},
        queues=rng.choice([["q0"], ["q0", "q1"]]),
        limit=rng.randrange(1, 9),
        oversample=rng.randrange(1, 4),
        actors=None if rng.random() < 0.5 else sorted(rng.sample(actors, rng.randrange(1, 4))),
    )


async def _load(conn: asyncpg.Connection[Any], schema: str, case: Case) -> None:
    await conn.execute(f"TRUNCATE {schema}.jobs, {schema}.actor_config, {schema}.queues CASCADE")
    await conn.executemany(
        f"""
        INSERT INTO {schema}.jobs (id, actor, queue, priority, scheduled_at, identity_key, status,
                                   attempt, locked_by_worker, lock_expires_at, started_at)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
        """,
        [
            (
                j.id,
                j.actor,
                j.queue,
                j.priority,
                j.scheduled_at,
                j.identity_key,
                "running" if j.running else "pending",
                1 if j.running else 0,
                uuid4() if j.running else None,
                PAST + LEASE if j.running else None,
                j.scheduled_at if j.running else None,
            )
            for j in case.jobs
        ],
    )
    await conn.executemany(
        f"INSERT INTO {schema}.actor_config (actor, max_concurrent) VALUES ($1, $2)",
        list(case.actor_caps.items()),
    )
    # The strict-FIFO statement reads the queue caps from the queues table.
    await conn.executemany(
        f"INSERT INTO {schema}.queues (name, mode, max_concurrent) VALUES ($1, 'strict_fifo', $2)",
        list(case.queue_caps.items()),
    )


async def test_dispatch_matches_the_per_actor_sample_model(
    conn: asyncpg.Connection[Any], pg_schema: PgSchema
) -> None:
    statement = statements_for(pg_schema.name).dispatch_strict_fifo
    rng = random.Random(20261202)
    paths: Counter[bool] = Counter()
    for attempt in range(100):
        case = _case(rng)
        await _load(conn, pg_schema.name, case)
        expected, head_suffices = _expected(case)
        paths[head_suffices] += 1
        async with conn.transaction():
            rows = await conn.fetch(
                statement, case.queues, case.limit, uuid4(), LEASE, case.oversample, case.actors
            )
        assert [r["id"] for r in rows if r["id"] is not None] == expected, (attempt, case)
    # Both paths ran, or the comparison proves less than it claims.
    assert paths[True] >= 20 and paths[False] >= 20, paths
