"""``enqueue_batch_fast`` on Postgres: one COPY, its rows made as they are sent."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from pydantic import BaseModel, field_validator

from taskq import TaskQ, actor
from taskq.backend import Backend
from taskq.errors import PayloadValidationError, SingletonCollisionError
from taskq.models import EnqueueArgs, JobFilter
from taskq_testing.postgres import PgSchema

pytestmark = pytest.mark.postgres

MANY = 6_000
"""More jobs than asyncpg sends in one go (it flushes a COPY's rows every 512 KiB)."""


class Item(BaseModel):
    n: int

    @field_validator("n")
    @classmethod
    def _look(cls, n: int) -> int:
        for look in LOOKS:
            look(n)
        return n


LOOKS: list[Callable[[int], None]] = []
"""What ``Item``'s validation calls, a test at a time: it sees when each payload is validated."""


@actor(name="copied")
async def copied(payload: Item) -> None:
    return None


def _copies_running(watcher: psycopg.Connection[tuple[int]], schema: str) -> int:
    found = watcher.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE query LIKE %s",
        (f'COPY "{schema}"."jobs"%',),
    ).fetchone()
    return found[0] if found else 0


async def test_the_copy_runs_while_its_input_is_still_being_pulled(
    pg_backend: Backend, pg_pooled_schema: PgSchema
) -> None:
    # The jobs past the first 512 KiB are made while the server already holds the
    # COPY: an input pulled whole before the COPY would find no COPY running.
    copying: list[int] = []
    with psycopg.connect(pg_pooled_schema.dsn, autocommit=True) as watcher:

        def pulled() -> Iterator[EnqueueArgs]:
            for i in range(MANY):
                if i == MANY - 100:
                    copying.append(_copies_running(watcher, pg_pooled_schema.name))
                yield EnqueueArgs(actor="a")

        assert await pg_backend.enqueue_batch_fast(pulled()) == MANY
    assert copying == [1]


async def test_the_client_validates_payloads_while_the_copy_runs(
    pg_pooled_schema: PgSchema,
) -> None:
    copying: list[int] = []
    with psycopg.connect(pg_pooled_schema.dsn, autocommit=True) as watcher:

        def look(n: int) -> None:
            if n == MANY - 100 and not copying:  # validated again from its stored form
                copying.append(_copies_running(watcher, pg_pooled_schema.name))

        LOOKS.append(look)
        try:
            async with TaskQ(
                pg_pooled_schema.dsn, schema=pg_pooled_schema.name, actors=[copied]
            ) as tq:
                items = [(copied, {"n": i}) for i in range(MANY)]
                assert await tq.client.enqueue_batch_fast(items) == MANY
        finally:
            LOOKS.remove(look)
    assert copying == [1]


async def test_concurrent_copied_singletons_admit_exactly_one(pg_backend: Backend) -> None:
    batches = [
        [EnqueueArgs(actor="a"), EnqueueArgs(actor="a", identity_key="user-1", singleton=True)]
        for _ in range(6)
    ]
    results = await asyncio.gather(
        *(pg_backend.enqueue_batch_fast(batch) for batch in batches), return_exceptions=True
    )
    refused = [r for r in results if isinstance(r, SingletonCollisionError)]
    assert (results.count(2), len(refused)) == (1, 5), results
    assert len(await pg_backend.list_jobs(JobFilter(identity_key="user-1"))) == 1
    assert len(await pg_backend.list_jobs(JobFilter(limit=100))) == 2


async def test_an_invalid_payload_late_in_a_copy_enqueues_nothing(
    pg_pooled_schema: PgSchema,
) -> None:
    async with TaskQ(pg_pooled_schema.dsn, schema=pg_pooled_schema.name, actors=[copied]) as tq:
        items: list[tuple[Any, dict[str, Any]]]
        items = [(copied, {"n": i}) for i in range(MANY)]
        items[MANY - 100] = (copied, {"n": "not a number"})
        with pytest.raises(PayloadValidationError):
            await tq.client.enqueue_batch_fast(items)
        assert await tq.client.list_jobs() == []
        assert await tq.client.enqueue_batch_fast(items[:10]) == 10
