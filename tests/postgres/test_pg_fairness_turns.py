"""Round robin's turns on Postgres: written by the dispatch, forgotten after a day."""

from __future__ import annotations

from datetime import timedelta
from uuid import uuid4

import asyncpg
import pytest

from taskq.models import EnqueueArgs, QueueConfig
from taskq_postgres import PostgresBackend
from taskq_testing.postgres import PgSchema

pytestmark = pytest.mark.postgres

_LEASE = timedelta(minutes=5)


async def test_a_dispatch_records_each_cohorts_turn_and_old_turns_are_forgotten(
    pg_pooled_schema: PgSchema,
) -> None:
    backend = PostgresBackend(pg_pooled_schema.dsn, schema=pg_pooled_schema.name)
    await backend.open()
    conn = await asyncpg.connect(pg_pooled_schema.dsn)
    try:
        await backend.configure_queue(QueueConfig(queue="rr", mode="round_robin"))
        for key in ("t1", "t2", None):
            await backend.enqueue(EnqueueArgs(actor="a", queue="rr", fairness_key=key))
        await backend.enqueue(EnqueueArgs(actor="a", queue="fifo", fairness_key="t1"))
        assert len(await backend.dispatch_batch(uuid4(), ["rr", "fifo"], 10, _LEASE)) == 4
        turns = f"{pg_pooled_schema.name}.fairness_turns"
        rows = await conn.fetch(f"SELECT queue, keyed, fairness_key FROM {turns} ORDER BY 2, 3")
        # The round-robin queue's cohorts only; no key is a cohort of its own.
        assert [tuple(r) for r in rows] == [
            ("rr", False, ""),
            ("rr", True, "t1"),
            ("rr", True, "t2"),
        ]
        await conn.execute(
            f"UPDATE {turns} SET served_at = served_at - interval '2 days' WHERE fairness_key = 't1'"
        )
        await backend.expire_archive()
        left = await conn.fetch(f"SELECT fairness_key FROM {turns} ORDER BY 1")
        assert [r["fairness_key"] for r in left] == ["", "t2"]
    finally:
        await conn.close()
        await backend.close()
