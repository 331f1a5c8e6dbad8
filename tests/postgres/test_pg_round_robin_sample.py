"""Round robin samples each (queue, actor) by reading its cohorts to a depth, not by
ranking its backlog: the batch must still be exactly the first jobs of the
round-robin order.

The randomized test checks the statement against that order computed here, on
cohorts of every shape (empty, shallow, deep, unkeyed, with running jobs and
turns), with an oversample of 1, so that the sample is the batch and both the read
to depth and its fallback (shallow cohorts leave it short) decide what is dispatched;
on a pair of more cohorts than are read one by one, which ranks its backlog; and on
cohorts spread over several actors (keys of one actor and keys shared), where the
cohorts are read to the level the batch needs over all pairs, or, when one is
shallower, each pair to its own depth.
"""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID, uuid4

import asyncpg
import pytest
import pytest_asyncio

from taskq_postgres._sql.dispatch import _COHORT_BUDGET
from taskq_postgres._statements import statements_for
from taskq_testing.postgres import PgSchema
from tests.postgres.plans import index_rows

pytestmark = pytest.mark.postgres

START = datetime(2026, 1, 1, tzinfo=UTC)
KEYS: list[str | None] = [None, "k0", "k1", "k2", "k3", "k4", "k5"]


@pytest_asyncio.fixture
async def conn(pg_schema: PgSchema) -> AsyncIterator[asyncpg.Connection[Any]]:
    # As the backend's own connections: the statement's estimates would have it compiled.
    connection: asyncpg.Connection[Any] = await asyncpg.connect(
        pg_schema.dsn, server_settings={"jit": "off"}
    )
    yield connection
    await connection.close()


@dataclass(frozen=True)
class Job:
    id: UUID
    fairness_key: str | None
    priority: int
    scheduled_at: datetime
    actor: str = "a"


def _order(
    jobs: list[Job], running: dict[str | None, int], turns: dict[str | None, int]
) -> list[UUID]:
    """The round-robin order: level (rank in the cohort plus its running jobs), the
    cohort's turn, then priority DESC, scheduled_at, id."""

    def fifo(job: Job) -> tuple[int, datetime, UUID]:
        return (-job.priority, job.scheduled_at, job.id)

    level: dict[UUID, int] = {}
    for key in {job.fairness_key for job in jobs}:
        cohort = sorted((job for job in jobs if job.fairness_key == key), key=fifo)
        for rank, job in enumerate(cohort, start=1):
            level[job.id] = rank + running.get(key, 0)
    ordered = sorted(
        jobs, key=lambda job: (level[job.id], turns.get(job.fairness_key, 0), *fifo(job))
    )
    return [job.id for job in ordered]


async def _insert(conn: asyncpg.Connection[Any], schema: str, status: str, jobs: list[Job]) -> None:
    await conn.executemany(
        f"INSERT INTO {schema}.jobs (id, actor, queue, status, priority, scheduled_at,"
        f" fairness_key, locked_by_worker, lock_expires_at)"
        f" VALUES ($1, $6, 'rr', $2::text::{schema}.job_status, $3, $4, $5,"
        f" CASE WHEN $2::text = 'running' THEN gen_random_uuid() END,"
        f" CASE WHEN $2::text = 'running' THEN clock_timestamp() + interval '1 hour' END)",
        [(j.id, status, j.priority, j.scheduled_at, j.fairness_key, j.actor) for j in jobs],
    )


def _args(
    limit: int,
    oversample: int,
    turns: dict[str | None, int] | None = None,
    *,
    queues: tuple[str, ...] = ("rr",),
    capped: tuple[list[str], list[int]] = ([], []),
) -> list[Any]:
    """The round-robin statement's parameters: ``queues`` all round robin, ``capped``
    (queues, caps), the cohorts' ``turns``, no strict turn, every actor."""
    turns = turns or {}
    keyed = [key for key in turns if key is not None]
    return [
        list(queues),
        limit,
        uuid4(),
        timedelta(minutes=5),
        oversample,
        *capped,
        list(queues),
        keyed,
        [turns[key] for key in keyed],
        turns.get(None, 0),
        0,
        None,
    ]


async def _fairness_reads(
    conn: asyncpg.Connection[Any], schema: str, limit: int, oversample: int
) -> int:
    """The ``jobs_fairness_idx`` entries one round-robin dispatch goes through on the
    jobs inserted (analyzed first, as a live table would be)."""
    await conn.execute(f"VACUUM ANALYZE {schema}.jobs")
    statement = statements_for(schema).dispatch_round_robin
    explain = f"EXPLAIN (ANALYZE, FORMAT JSON) {statement}"
    [[plan]] = await conn.fetch(explain, *_args(limit, oversample))
    return index_rows(json.loads(plan)[0]["Plan"], "jobs_fairness_idx", filtered=True)


@pytest.mark.parametrize(
    ("keys", "sizes", "cases", "actors"),
    [
        # Mostly shallow cohorts next to a deep one: the read to depth falls short.
        (KEYS, [0, 1, 1, 2, 3, 5, 8, 30], 60, ["a"]),
        # More cohorts than the one pair's share of those read one by one: its backlog
        # is ranked whole.
        ([None, *(f"c{i:04d}" for i in range(_COHORT_BUDGET + 20))], [1, 1, 2], 4, ["a"]),
        # Several pairs: read to the level the batch needs over all of them (its keys
        # each once, a key's jobs of several actors sharing its ranks), unless a cohort
        # is shallower than that.
        ([*KEYS, *(f"m{i:02d}" for i in range(20))], [1, 2, 3, 4, 6, 10], 60, ["a", "b", "c"]),
    ],
    ids=["cohorts", "crowded", "actors"],
)
async def test_the_batch_is_the_head_of_the_round_robin_order(
    conn: asyncpg.Connection[Any],
    pg_schema: PgSchema,
    keys: list[str | None],
    sizes: list[int],
    cases: int,
    actors: list[str],
) -> None:
    s = pg_schema.name
    statement = statements_for(s).dispatch_round_robin
    rng = random.Random(20261205)
    for case in range(cases):
        await conn.execute(f"DELETE FROM {s}.jobs")
        pending: list[Job] = []
        running: dict[str | None, int] = {}
        turns: dict[str | None, int] = {}
        tick = 0
        if len(keys) <= _COHORT_BUDGET:
            chosen = rng.sample(keys, rng.randint(1, len(keys)))
        else:
            # Every key, so that the pair is crowded; the last in key order first in
            # time, so that a scan of the first keys alone misses the head.
            chosen = sorted(keys, key=lambda k: k or "", reverse=True)
        for key in chosen:
            # A key of one actor, or of several.
            mine = rng.sample(actors, rng.choice([1, 1, len(actors)]))
            for _ in range(rng.choice(sizes)):
                tick += 1
                at = START + timedelta(seconds=tick)
                pending.append(Job(uuid4(), key, rng.choice([0, 0, 1]), at, rng.choice(mine)))
            running[key] = rng.choice([0, 0, 0, 1, 2, 6])
            turns[key] = rng.choice([0, 0, 1, 2, 3])
        await _insert(conn, s, "pending", pending)
        for key, count in running.items():
            busy = [Job(uuid4(), key, 0, START) for _ in range(count)]
            await _insert(conn, s, "running", busy)
        limit = rng.randint(1, 12)
        oversample = 1 if len(actors) == 1 else rng.choice([1, 2])
        rows = await conn.fetch(statement, *_args(limit, oversample, turns))
        expected = _order(pending, running, turns)[:limit]
        assert [row["id"] for row in rows] == expected, (case, limit)


async def test_cohorts_waiting_on_running_identities_are_read_through_once(
    conn: asyncpg.Connection[Any], pg_schema: PgSchema
) -> None:
    # Per-tenant serialization: every tenant's jobs share its identity, and every
    # tenant runs one. The read to depth goes through each cohort's backlog (its jobs
    # all wait) and comes up short; the read to the sample's size must not go through
    # them again.
    s = pg_schema.name
    await conn.execute(
        f"INSERT INTO {s}.jobs (actor, queue, fairness_key, identity_key)"
        f" SELECT 'a', 'rr', 't' || (g % 20), 't' || (g % 20) FROM generate_series(1, 1000) g"
    )
    await conn.execute(
        f"INSERT INTO {s}.jobs (actor, queue, status, fairness_key, identity_key,"
        f" locked_by_worker, lock_expires_at)"
        f" SELECT 'a', 'rr', 'running', 't' || g, 't' || g, gen_random_uuid(),"
        f" clock_timestamp() + interval '1 hour' FROM generate_series(0, 19) g"
    )
    read = await _fairness_reads(conn, s, 10, 2)
    # The 1,000 waiting jobs once, and a few probes per cohort naming the cohorts.
    assert 1000 <= read <= 1000 + 20 * 3, read


async def test_many_pairs_read_their_cohorts_to_the_level_the_batch_needs(
    conn: asyncpg.Connection[Any], pg_schema: PgSchema
) -> None:
    # 50 actors of 20 keys each, 10 jobs a cohort. Each pair's own depth sizes its sample
    # for the whole batch: all 10,000 jobs were read and ranked for a batch of 100.
    s = pg_schema.name
    await conn.execute(
        f"INSERT INTO {s}.jobs (actor, queue, fairness_key)"
        f" SELECT 'a' || (g % 50), 'rr', 't' || (g % 1000) FROM generate_series(1, 10000) g"
    )
    read = await _fairness_reads(conn, s, 100, 2)
    # A probe per cohort naming it, a few per pair (past its last key, its unkeyed jobs),
    # and each cohort's first job: the level is 1. Each pair to its own depth: 11,101.
    assert read <= 1000 + 150 + 1000, read


async def test_a_lone_pairs_shallow_cohorts_are_read_once(
    conn: asyncpg.Connection[Any], pg_schema: PgSchema
) -> None:
    # One actor, 5 cohorts of one job and 5 of 20, a sample of 20: the level (2) is the
    # pair's own depth. The shallow cohorts end before it, so the pair falls back to its
    # own depth, which the reads to the level already made, then to the sample's size.
    s = pg_schema.name
    await conn.execute(
        f"INSERT INTO {s}.jobs (actor, queue, fairness_key)"
        f" SELECT 'a', 'rr', CASE WHEN g <= 5 THEN 't' || g ELSE 'deep' || (g % 5) END"
        f" FROM generate_series(1, 105) g"
    )
    read = await _fairness_reads(conn, s, 10, 2)
    # The cohorts named, their jobs to the level, the deep ones to 20 (132 entries): the
    # reads to the level made again as the pair's own took 10 more.
    assert read <= 136, read


@pytest.mark.parametrize("oversample", [1, 2])
async def test_identity_duplicates_read_to_the_level_do_not_short_the_batch(
    conn: asyncpg.Connection[Any], pg_schema: PgSchema, oversample: int
) -> None:
    # Actor a's cohorts all hold jobs of one identity (none running: nothing ends a read
    # early), actor b's one cohort plain jobs. The level counts a's cohorts as if each
    # gave a job a level, but one identity gives one job: read to the level alone, the
    # batch came up short (oversample 1: 3 of 4, oversample 2: 3 of 4), where each pair
    # read to its own depth (before the level) gave the round-robin order's first 4.
    s = pg_schema.name
    a_keys = ["k"] if oversample == 1 else ["k", "l", "n"]
    a_jobs = [(key, i) for i in range(2) for key in a_keys]
    rows: list[tuple[UUID, str, str, str | None, datetime]] = [
        (uuid4(), "a", key, "x", START + timedelta(seconds=i)) for key, i in a_jobs
    ]
    rows += [(uuid4(), "b", "m", None, START + timedelta(seconds=10 + i)) for i in range(8)]
    await conn.executemany(
        f"INSERT INTO {s}.jobs (id, actor, queue, fairness_key, identity_key, scheduled_at)"
        f" VALUES ($1, $2, 'rr', $3, $4, $5)",
        rows,
    )
    statement = statements_for(s).dispatch_round_robin
    got = [row["id"] for row in await conn.fetch(statement, *_args(4, oversample))]
    # Level 1: a's first job (its identity's only one) and m's first; then m's next two.
    first_a = min((r for r in rows if r[1] == "a"), key=lambda r: (r[4], r[0]))
    expected = [first_a[0], *(r[0] for r in rows if r[1] == "b")][:4]
    assert got == expected


async def test_a_capped_queues_jobs_in_a_key_the_level_counts(
    conn: asyncpg.Connection[Any], pg_schema: PgSchema
) -> None:
    # Key k: K1 in r1 (a queue capped at 0: never taken) holds its level 1, K2 in r2 its
    # level 2. Key m: one running job, M1 pending at level 2, older than K2. The level
    # counts k as giving a job at level 1, so it is 1 and m (running 1) is read to 0: the
    # batch was K2. Each pair to its own depth (before the level), and the in-memory walk:
    # M1.
    s = pg_schema.name
    k1, k2, m1 = uuid4(), uuid4(), uuid4()
    await conn.executemany(
        f"INSERT INTO {s}.jobs (id, actor, queue, status, fairness_key, scheduled_at,"
        f" locked_by_worker, lock_expires_at)"
        f" VALUES ($1, $2, $3, $4::text::{s}.job_status, $5, $6,"
        f" CASE WHEN $4 = 'running' THEN gen_random_uuid() END,"
        f" CASE WHEN $4 = 'running' THEN clock_timestamp() + interval '1 hour' END)",
        [
            (k1, "b", "r1", "pending", "k", START),
            (k2, "b", "r2", "pending", "k", START + timedelta(seconds=2)),
            (m1, "a", "r2", "pending", "m", START + timedelta(seconds=1)),
            (uuid4(), "a", "r2", "running", "m", START),
        ],
    )
    statement = statements_for(s).dispatch_round_robin
    args = _args(1, 1, queues=("r1", "r2"), capped=(["r1"], [0]))
    assert [row["id"] for row in await conn.fetch(statement, *args)] == [m1]
