"""The pooled-schema fixture: migrated once, handed out empty to each test."""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest

from taskq_testing.postgres import PgSchema, SchemaPool

pytestmark = pytest.mark.postgres


async def _fill(schema: PgSchema) -> None:
    conn: asyncpg.Connection[Any] = await asyncpg.connect(schema.dsn)
    try:
        s = schema.name
        job_id = await conn.fetchval(f"INSERT INTO {s}.jobs (actor) VALUES ('a') RETURNING id")
        await conn.execute(f"INSERT INTO {s}.job_events (job_id, kind) VALUES ($1, 'x')", job_id)
        await conn.execute(f"INSERT INTO {s}.queues (name) VALUES ('q')")
    finally:
        await conn.close()


async def _state(schema: PgSchema) -> tuple[int, int, int, int]:
    conn: asyncpg.Connection[Any] = await asyncpg.connect(schema.dsn)
    try:
        s = schema.name
        return (
            await conn.fetchval(f"SELECT count(*) FROM {s}.jobs"),
            await conn.fetchval(f"SELECT count(*) FROM {s}.queues"),
            await conn.fetchval(f"SELECT count(*) FROM {s}.schema_migrations"),
            await conn.fetchval(f"SELECT last_value FROM {s}.job_events_id_seq"),
        )
    finally:
        await conn.close()


async def test_a_reused_schema_comes_back_empty_and_migrated(pg_database_dsn: str) -> None:
    pool = SchemaPool(pg_database_dsn)
    try:
        with pool.schema() as first:
            await _fill(first)
        with pool.schema() as second:
            assert second == first
            jobs, queues, migrations, event_ids = await _state(second)
            assert (jobs, queues) == (0, 0)
            assert migrations >= 1, "the migration ledger must survive the reset"
            assert event_ids == 1, "sequences restart"
            with pool.schema() as third:  # in use elsewhere: a schema of its own
                assert third != second
    finally:
        pool.close()


def test_the_fixture_hands_out_a_schema(pg_pooled_schema: PgSchema) -> None:
    assert pg_pooled_schema.name.startswith("t_")


async def test_a_migration_that_fails_leaves_no_schema_behind(
    pg_database_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Never handed out, the half-made schema was neither emptied nor dropped.
    import taskq_postgres._migrate

    made: list[str] = []

    async def half_migrate(dsn: str, schema: str) -> None:
        made.append(schema)
        conn: asyncpg.Connection[Any] = await asyncpg.connect(dsn)
        try:
            await conn.execute(f"CREATE SCHEMA {schema}")
        finally:
            await conn.close()
        raise RuntimeError("a migration failed halfway")

    monkeypatch.setattr(taskq_postgres._migrate, "migrate", half_migrate)
    pool = SchemaPool(pg_database_dsn)
    try:
        with pytest.raises(RuntimeError, match="halfway"), pool.schema():
            pass  # pragma: no cover - the migration fails first
    finally:
        pool.close()
    conn: asyncpg.Connection[Any] = await asyncpg.connect(pg_database_dsn)
    try:
        assert await conn.fetchval("SELECT to_regnamespace($1)", made[0]) is None
    finally:
        await conn.close()
