"""The Postgres fixtures of the taskq_testing pytest plugin."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import asyncpg
import pytest

from taskq.identifiers import MAX_SCHEMA_NAME_BYTES, validate_schema_name
from taskq_testing.postgres import PgSchema, migrated_schema, unique_schema_name

pytestmark = pytest.mark.postgres

_seen: list[str] = []


async def _schema_exists(dsn: str, name: str) -> bool:
    conn: asyncpg.Connection[Any] = await asyncpg.connect(dsn)
    try:
        return bool(await conn.fetchval("SELECT to_regnamespace($1) IS NOT NULL", name))
    finally:
        await conn.close()


@pytest.mark.parametrize("run", [1, 2])
async def test_each_test_gets_its_own_migrated_schema(pg_schema: PgSchema, run: int) -> None:
    assert pg_schema.name not in _seen
    _seen.append(pg_schema.name)
    assert pg_schema.dsn.rsplit("/", 1)[1].startswith("taskq_test_")
    conn: asyncpg.Connection[Any] = await asyncpg.connect(pg_schema.dsn)
    try:
        assert await conn.fetchval(f"SELECT count(*) FROM {pg_schema.name}.jobs") == 0
    finally:
        await conn.close()


def test_pg_schema_works_in_sync_tests(pg_schema: PgSchema) -> None:
    import psycopg

    with psycopg.connect(pg_schema.dsn) as conn:
        row = conn.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = %s",
            (pg_schema.name,),
        ).fetchone()
    assert row is not None and row[0] > 0


async def test_the_schema_is_dropped_afterwards(pg_database_dsn: str) -> None:
    # Called from inside a running event loop on purpose: the migrator gets its own.
    with migrated_schema(pg_database_dsn) as schema:
        assert await _schema_exists(pg_database_dsn, schema.name)
    assert not await _schema_exists(pg_database_dsn, schema.name)


async def test_a_name_an_existing_schema_has_is_refused_and_the_schema_kept(
    pg_database_dsn: str,
) -> None:
    # It was migrated into, then dropped with CASCADE afterwards: the schema and its data.
    with migrated_schema(pg_database_dsn) as existing:
        with (
            pytest.raises(ValueError, match="already exists"),
            migrated_schema(pg_database_dsn, existing.name.upper()),
        ):
            pass  # pragma: no cover - refused before
        assert await _schema_exists(pg_database_dsn, existing.name)
    fresh = unique_schema_name()
    with migrated_schema(pg_database_dsn, fresh) as schema:
        assert schema.name == fresh
        assert await _schema_exists(pg_database_dsn, fresh)
    assert not await _schema_exists(pg_database_dsn, fresh)


async def test_a_migration_that_fails_leaves_no_schema_behind(
    pg_database_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import taskq_postgres._migrate

    name = unique_schema_name()

    async def half_migrate(dsn: str, schema: str) -> None:
        conn: asyncpg.Connection[Any] = await asyncpg.connect(dsn)
        try:
            await conn.execute(f"CREATE SCHEMA {schema}; CREATE TABLE {schema}.jobs (id int)")
        finally:
            await conn.close()
        raise RuntimeError("a migration failed halfway")

    monkeypatch.setattr(taskq_postgres._migrate, "migrate", half_migrate)
    with pytest.raises(RuntimeError, match="halfway"), migrated_schema(pg_database_dsn, name):
        pass  # pragma: no cover - the migration fails first
    assert not await _schema_exists(pg_database_dsn, name)


def test_a_schema_a_lock_keeps_from_being_dropped_is_named_in_a_warning(
    pg_database_dsn: str,
) -> None:
    import psycopg

    with psycopg.connect(pg_database_dsn) as holder:  # a transaction a test left open
        with (
            pytest.warns(ResourceWarning, match="was left in place") as caught,
            migrated_schema(pg_database_dsn) as schema,
        ):
            holder.execute(f"LOCK TABLE {schema.name}.jobs IN ACCESS SHARE MODE")
        holder.rollback()
        holder.execute(f"DROP SCHEMA {schema.name} CASCADE")
        holder.commit()
    assert schema.name in str(caught[0].message)


def test_unique_schema_names_are_valid_and_short() -> None:
    name = unique_schema_name()
    assert validate_schema_name(name) == name
    assert len(name) < MAX_SCHEMA_NAME_BYTES
    assert name != unique_schema_name()


def test_loading_the_plugin_imports_no_driver() -> None:
    code = (
        "import sys, taskq_testing.pytest_plugin\n"
        "print(sorted(m for m in ('asyncpg', 'psycopg', 'taskq_postgres') if m in sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == "[]"
