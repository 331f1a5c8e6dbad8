"""Schema names that could inject SQL are refused before any SQL runs."""

from __future__ import annotations

from typing import Any, NoReturn

import asyncpg
import pytest

from taskq.identifiers import MAX_SCHEMA_NAME_BYTES, validate_schema_name
from taskq_postgres._migrate import load_migrations, migrate, migration_status
from taskq_testing.postgres import unique_schema_name

# Not even identifiers: every interpolation site refuses these.
BAD_IDENTIFIERS = [
    "x; drop table jobs",
    "taskq; DROP SCHEMA public CASCADE; --",
    'taskq"; DROP SCHEMA public; --',
    "ta'skq",
    "taskq\n",
    "\ntaskq",
    "taskq ",
    "t\u0430skq",  # Cyrillic a
    "\uff54askq",  # fullwidth t
    "taskq\x00",
    "public.jobs",
    "task-q",
    "1taskq",
    "",
    "a" * 64,
    "order",  # a reserved key word: fails inside the first statement
    "time",  # cannot name a type: `c time.job_status` fails likewise
]
# Identifiers, but no schema's: too long (derived channel names must fit), or
# Postgres's own (pg_dump leaves information_schema out of backups).
BAD_NAMES = [
    *BAD_IDENTIFIERS,
    "a" * (MAX_SCHEMA_NAME_BYTES + 1),
    "pg_taskq",
    "information_schema",
]


class _NoSQL:
    """A connection stand-in that fails the test on any use."""

    def __getattr__(self, name: str) -> NoReturn:
        raise AssertionError(f"SQL was attempted (connection.{name}) before validation")


@pytest.mark.parametrize("name", BAD_NAMES)
async def test_migrate_rejects_before_touching_the_connection(name: str) -> None:
    with pytest.raises(ValueError):
        await migrate(_NoSQL(), name)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", BAD_NAMES)
async def test_status_rejects_before_touching_the_connection(name: str) -> None:
    with pytest.raises(ValueError):
        await migration_status(_NoSQL(), name)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", BAD_NAMES)
async def test_migrate_rejects_before_connecting(name: str) -> None:
    # Port 1 refuses connections: reaching it would raise OSError, not ValueError.
    with pytest.raises(ValueError):
        await migrate("postgresql://postgres@127.0.0.1:1/x", name)


@pytest.mark.parametrize("name", BAD_IDENTIFIERS)
def test_rendering_checks_the_name_again(name: str) -> None:
    migration = load_migrations()[0]
    with pytest.raises(ValueError):
        migration.render(name)


@pytest.mark.postgres
async def test_the_longest_allowed_name_migrates(pg_database_dsn: str) -> None:
    name = unique_schema_name().ljust(MAX_SCHEMA_NAME_BYTES, "x")
    assert len(name) == MAX_SCHEMA_NAME_BYTES
    assert await migrate(pg_database_dsn, name)
    conn: asyncpg.Connection[Any] = await asyncpg.connect(pg_database_dsn)
    try:
        assert await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", f"{name}.jobs")
    finally:
        await conn.close()


@pytest.mark.postgres
async def test_the_reserved_key_words_are_the_servers(pg_database_dsn: str) -> None:
    # Every key word this server will not take as a schema name unquoted (categories
    # R, T and C) is refused before any SQL, so a Postgres adding one fails here; the
    # unreserved ones pass (name, type, ...).
    conn: asyncpg.Connection[Any] = await asyncpg.connect(pg_database_dsn)
    try:
        rows = await conn.fetch(
            "SELECT word, catcode IN ('R', 'T', 'C') AS reserved FROM pg_get_keywords()"
        )
    finally:
        await conn.close()
    refused = set()
    for row in rows:
        try:
            validate_schema_name(row["word"])
        except ValueError:
            refused.add(row["word"])
    assert refused == {r["word"] for r in rows if r["reserved"]}
