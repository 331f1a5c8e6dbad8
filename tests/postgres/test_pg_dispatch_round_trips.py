"""Which statements a dispatch runs: one for a busy strict-FIFO queue (the plain-head
statement, or the full one for a head that needs cap or identity checks), the
settings lookup only when a queue is round robin or the full statement found nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any
from uuid import UUID, uuid4

import asyncpg
import pytest

from taskq.models import ActorConfig, EnqueueArgs, QueueConfig
from taskq_postgres import PostgresBackend
from taskq_testing.postgres import PgSchema

pytestmark = pytest.mark.postgres

LEASE = timedelta(minutes=5)


@pytest.fixture
async def backend(pg_pooled_schema: PgSchema) -> AsyncIterator[PostgresBackend]:
    backend = PostgresBackend(
        pg_pooled_schema.dsn, schema=pg_pooled_schema.name, min_pool_size=2, max_pool_size=2
    )
    await backend.open()
    yield backend
    await backend.close()


@pytest.fixture
async def statements(backend: PostgresBackend) -> list[str]:
    """The names of the dispatch statements the backend's connections run, in order."""
    names = {
        backend._sql.dispatch_plain_head: "plain_head",
        backend._sql.dispatch_strict_fifo: "strict_fifo",
        backend._sql.dispatch_round_robin: "round_robin",
        backend._sql.queue_settings: "queue_settings",
    }
    ran: list[str] = []

    def log(query: asyncpg.connection.LoggedQuery) -> None:
        if query.query in names:
            ran.append(names[query.query])

    pool = backend._require_pool()
    held = [await pool.acquire() for _ in range(2)]  # every connection of the pool
    for conn in held:
        conn.add_query_logger(log)
    for conn in held:
        await pool.release(conn)
    return ran


async def test_a_busy_strict_fifo_dispatch_is_one_statement(
    backend: PostgresBackend, statements: list[str]
) -> None:
    await backend.enqueue_batch([EnqueueArgs(actor="a") for _ in range(3)])
    assert len(await backend.dispatch_batch(uuid4(), ["default"], 2, LEASE)) == 2
    assert statements == ["plain_head"]
    statements.clear()
    assert len(await backend.dispatch_batch(uuid4(), ["default"], 2, LEASE)) == 1
    assert statements == ["plain_head"]
    statements.clear()
    # Nothing due: a plain head rules a round-robin queue out, so nothing else runs.
    assert await backend.dispatch_batch(uuid4(), ["default"], 2, LEASE) == []
    assert statements == ["plain_head"]


async def test_a_head_that_needs_checks_goes_to_the_full_statement_until_plain_again(
    backend: PostgresBackend, statements: list[str]
) -> None:
    await backend.register_actors([ActorConfig(actor="capped", max_concurrent=1)])
    await backend.enqueue_batch([EnqueueArgs(actor="capped") for _ in range(2)])
    await backend.enqueue_batch([EnqueueArgs(actor="a") for _ in range(3)])
    worker = uuid4()
    first = await backend.dispatch_batch(worker, ["default"], 2, LEASE)
    assert [row.actor for row in first] == ["capped", "a"]  # the cap held one back
    assert statements == ["plain_head", "strict_fifo"]
    statements.clear()
    # Remembered: the full statement runs first; this head (capped, a, a) is not plain.
    assert [r.actor for r in await backend.dispatch_batch(worker, ["default"], 1, LEASE)] == ["a"]
    assert statements == ["strict_fifo"]
    statements.clear()
    # The second capped job is still at the head: gated until it is dispatched.
    assert await backend.mark_succeeded(first[0].id, worker, None)
    assert [r.actor for r in await backend.dispatch_batch(worker, ["default"], 1, LEASE)] == [
        "capped"
    ]
    assert statements == ["strict_fifo"]
    statements.clear()
    # The head is plain now (one job of "a"): the full statement says so, and the
    # plain-head statement runs first again.
    assert [r.actor for r in await backend.dispatch_batch(worker, ["default"], 1, LEASE)] == ["a"]
    assert statements == ["strict_fifo"]
    statements.clear()
    await backend.enqueue(EnqueueArgs(actor="a"))
    assert len(await backend.dispatch_batch(worker, ["default"], 1, LEASE)) == 1
    assert statements == ["plain_head"]


async def test_a_head_of_distinct_idle_identities_is_plain(
    backend: PostgresBackend, statements: list[str]
) -> None:
    # Per-customer keys everywhere: such a head sent every dispatch to the full
    # statement (p99 21-30 ms at 1,000,000 pending, against ~10 for the plain head).
    await backend.enqueue_batch([EnqueueArgs(actor="a", identity_key=f"c{i}") for i in range(4)])
    worker = uuid4()
    running = await backend.dispatch_batch(worker, ["default"], 2, LEASE)
    assert len(running) == 2
    assert statements == ["plain_head"]
    statements.clear()
    # One of the head's identities runs now: checked by the full statement.
    await backend.enqueue(EnqueueArgs(actor="a", identity_key=running[0].identity_key))
    rows = await backend.dispatch_batch(worker, ["default"], 3, LEASE)
    idle = {f"c{i}" for i in range(4)} - {row.identity_key for row in running}
    assert {row.identity_key for row in rows} == idle and len(rows) == 2
    assert statements == ["plain_head", "strict_fifo"]
    statements.clear()
    # Two jobs of one identity in the head: the full statement too.
    await backend.enqueue_batch([EnqueueArgs(actor="b", identity_key="d") for _ in range(2)])
    assert len(await backend.dispatch_batch(worker, ["default"], 5, LEASE)) == 1
    assert statements == ["strict_fifo"]


async def test_a_round_robin_queue_is_dispatched_by_the_round_robin_statement(
    backend: PostgresBackend, statements: list[str]
) -> None:
    await backend.configure_queue(QueueConfig(queue="fair", mode="round_robin"))
    await backend.enqueue_batch(
        [EnqueueArgs(actor="a", queue="fair", fairness_key=k) for k in "xxxy"]
    )
    worker = uuid4()
    # The strict-FIFO statements lock nothing for a call naming a round-robin queue.
    first = await backend.dispatch_batch(worker, ["default", "fair"], 2, LEASE)
    assert sorted(row.fairness_key or "" for row in first) == ["x", "y"]
    assert statements == ["plain_head", "strict_fifo", "queue_settings", "round_robin"]
    statements.clear()
    # Remembered: the next call looks the settings up first.
    assert len(await backend.dispatch_batch(worker, ["default", "fair"], 2, LEASE)) == 2
    assert statements == ["queue_settings", "round_robin"]
    statements.clear()
    # Switched back to strict FIFO: seen in the settings, and strict FIFO runs again.
    await backend.configure_queue(QueueConfig(queue="fair", mode="strict_fifo"))
    await backend.enqueue(EnqueueArgs(actor="a", queue="fair"))
    assert len(await backend.dispatch_batch(worker, ["default", "fair"], 2, LEASE)) == 1
    assert statements == ["queue_settings", "strict_fifo"]
    statements.clear()
    await backend.enqueue(EnqueueArgs(actor="a", queue="fair"))
    assert len(await backend.dispatch_batch(worker, ["default", "fair"], 2, LEASE)) == 1
    assert statements == ["plain_head"]


async def test_queue_caps_are_read_by_the_strict_fifo_statement(
    backend: PostgresBackend, statements: list[str]
) -> None:
    await backend.configure_queue(QueueConfig(queue="small", max_concurrent=2))
    await backend.enqueue_batch([EnqueueArgs(actor="a", queue="small") for _ in range(5)])
    assert len(await backend.dispatch_batch(uuid4(), ["small"], 5, LEASE)) == 2
    assert statements == ["plain_head", "strict_fifo"]


async def test_a_full_head_held_by_other_dispatchers_is_read_past(
    backend: PostgresBackend, statements: list[str], pg_pooled_schema: PgSchema
) -> None:
    # A batch of 2 reads a head of 4 (oversample 2). Another transaction holding
    # all 4, as other workers' dispatches in flight do, would leave this one with
    # nothing while 8 more are due: the worker would then wait for a wake.
    await backend.enqueue_batch([EnqueueArgs(actor="a") for _ in range(12)])
    s = pg_pooled_schema.name
    rival = await asyncpg.connect(pg_pooled_schema.dsn)
    try:
        order = await _in_dispatch_order(rival, s, "a")
        async with rival.transaction():
            await rival.execute(f"SELECT 1 FROM {s}.jobs WHERE id = ANY($1) FOR UPDATE", order[:4])
            jobs = await backend.dispatch_batch(uuid4(), ["default"], 2, LEASE)
            assert [job.id for job in jobs] == order[4:6]
            assert statements == ["plain_head", "plain_head"]
            statements.clear()
            # A head that was not full held every due job: short, it is not read again.
            await backend.enqueue_batch([EnqueueArgs(actor="a", queue="few") for _ in range(3)])
            few = await rival.fetch(
                f"SELECT id FROM {s}.jobs WHERE queue = 'few' "
                f"ORDER BY priority DESC, scheduled_at, id FOR UPDATE LIMIT 2"
            )
            (job,) = await backend.dispatch_batch(uuid4(), ["few"], 2, LEASE)
            assert job.id not in {r["id"] for r in few}
            assert statements == ["plain_head"]
    finally:
        await rival.close()


async def test_only_other_actors_jobs_pending_costs_one_statement_a_poll(
    backend: PostgresBackend, statements: list[str]
) -> None:
    # A removed actor's backlog that no worker runs: every idle poll of a worker ran
    # the plain-head statement, the full one, then the settings lookup.
    await backend.enqueue_batch([EnqueueArgs(actor="gone") for _ in range(5)])
    worker = uuid4()
    assert await backend.dispatch_actors_batch(worker, ["default"], 2, LEASE, ["a"]) == []
    assert statements == ["plain_head", "strict_fifo"]
    statements.clear()
    assert await backend.dispatch_actors_batch(worker, ["default"], 2, LEASE, ["a"]) == []
    assert statements == ["strict_fifo"]
    statements.clear()
    await backend.enqueue(EnqueueArgs(actor="a"))
    [job] = await backend.dispatch_actors_batch(worker, ["default"], 2, LEASE, ["a"])
    assert job.actor == "a" and statements == ["strict_fifo"]


async def test_a_held_head_is_read_past_when_the_rows_past_it_need_checks(
    backend: PostgresBackend, statements: list[str], pg_pooled_schema: PgSchema
) -> None:
    # As above, but the deeper rows hold another actor's job: the second plain-head
    # statement locked nothing for them, and the worker waited for a wake.
    await backend.enqueue_batch([EnqueueArgs(actor="a") for _ in range(4)])
    await backend.enqueue(EnqueueArgs(actor="other"))
    await backend.enqueue_batch([EnqueueArgs(actor="a") for _ in range(8)])
    s = pg_pooled_schema.name
    rival = await asyncpg.connect(pg_pooled_schema.dsn)
    try:
        order = await _in_dispatch_order(rival, s, "a")
        async with rival.transaction():
            await rival.execute(f"SELECT 1 FROM {s}.jobs WHERE id = ANY($1) FOR UPDATE", order[:4])
            jobs = await backend.dispatch_actors_batch(uuid4(), ["default"], 2, LEASE, ["a"])
            assert [job.id for job in jobs] == order[4:6]
            assert statements == ["plain_head", "plain_head", "strict_fifo"]
    finally:
        await rival.close()


async def _in_dispatch_order(conn: asyncpg.Connection[Any], schema: str, actor: str) -> list[UUID]:
    """The ids of ``actor``'s jobs in strict-FIFO dispatch order."""
    order = "ORDER BY priority DESC, scheduled_at, id"
    rows = await conn.fetch(f"SELECT id FROM {schema}.jobs WHERE actor = $1 {order}", actor)
    return [r["id"] for r in rows]


async def test_heads_are_read_deeper_until_past_a_larger_batch_in_flight(
    backend: PostgresBackend, statements: list[str], pg_pooled_schema: PgSchema
) -> None:
    # Another worker's dispatch of 100 holds the first 100 due jobs while this one asks
    # for 2 (a head of 4): heads of 16 and 64 rows are all held; 256 reads past them.
    for queue, n in (("default", 102), ("few", 40), ("deep", 300)):
        await backend.enqueue_batch([EnqueueArgs(actor="a", queue=queue) for _ in range(n)])
    s = pg_pooled_schema.name
    rival = await asyncpg.connect(pg_pooled_schema.dsn)

    async def hold(queue: str, n: int) -> list[UUID]:
        rows = await rival.fetch(
            f"SELECT id FROM {s}.jobs WHERE queue = $1 "
            f"ORDER BY priority DESC, scheduled_at, id LIMIT $2 FOR UPDATE",
            queue,
            n,
        )
        return [r["id"] for r in rows]

    try:
        async with rival.transaction():
            held = await hold("default", 100)
            jobs = await backend.dispatch_batch(uuid4(), ["default"], 2, LEASE)
            assert len(held) == 100 and not {job.id for job in jobs} & set(held)
            assert len(jobs) == 2
            assert statements == ["plain_head"] * 4
            statements.clear()
            # Every due job held, 40 of them: the round that read them all (64 rows) ends it.
            await hold("few", 40)
            assert await backend.dispatch_batch(uuid4(), ["few"], 2, LEASE) == []
            assert statements == ["plain_head"] * 3
            statements.clear()
            # 290 held of 300: the rounds end at 256 rows, the due ones past them left to
            # the next dispatch, not read now.
            await hold("deep", 290)
            assert await backend.dispatch_batch(uuid4(), ["deep"], 2, LEASE) == []
            assert statements == ["plain_head"] * 4
    finally:
        await rival.close()
