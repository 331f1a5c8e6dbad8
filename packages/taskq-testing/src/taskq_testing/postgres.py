"""Throwaway PostgreSQL databases and schemas for tests.

Each test session gets its own database on the local server, dropped at the
end; each test gets its own freshly migrated schema in it. Nothing is shared
between pytest-xdist workers, so Postgres tests run in parallel.

Migrating a schema per test costs a tenth of a second or more; suites of
hundreds of short tests (the conformance suite) take a :class:`SchemaPool`
schema instead: migrated once, emptied after each test and handed to the next
(River's ``riverdbtest`` pattern).

The server comes from ``TASKQ_TEST_DSN`` (a ``postgresql://`` URL naming a
database the test role can connect to, and a role allowed to create
databases), by default ``postgresql://postgres@127.0.0.1:5432/postgres``.
Drivers are imported inside the functions: this module is loaded by the
pytest plugin in every test run, Postgres or not.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlsplit, urlunsplit

from taskq.identifiers import check_identifier, validate_schema_name

__all__ = [
    "DEFAULT_TEST_DSN",
    "PgSchema",
    "PostgresUnavailable",
    "SchemaPool",
    "migrated_schema",
    "server_dsn",
    "throwaway_database",
    "unique_schema_name",
]

DEFAULT_TEST_DSN: Final = "postgresql://postgres@127.0.0.1:5432/postgres"

_CONNECT_TIMEOUT_SECONDS: Final = 10


class PostgresUnavailable(RuntimeError):
    """The test PostgreSQL server cannot be reached or refuses to create a database."""


@dataclass(frozen=True)
class PgSchema:
    """A migrated schema that belongs to one test: connect to ``dsn``, use ``name``."""

    dsn: str
    name: str


def server_dsn() -> str:
    """The server to create test databases on: ``$TASKQ_TEST_DSN`` or the local default."""
    return os.environ.get("TASKQ_TEST_DSN") or DEFAULT_TEST_DSN


def unique_schema_name() -> str:
    """A random schema name (``t_`` + 16 hex digits), well within the schema-name limit."""
    return validate_schema_name(f"t_{secrets.token_hex(8)}")


def _database_dsn(server: str, database: str) -> str:
    parts = urlsplit(server)
    if parts.scheme not in ("postgresql", "postgres"):
        raise PostgresUnavailable(
            f"TASKQ_TEST_DSN must be a postgresql:// URL, got {parts.scheme or 'no'} scheme"
        )
    return urlunsplit(parts._replace(path=f"/{check_identifier(database)}"))


def _where(dsn: str) -> str:
    # Host, port and database only: a DSN may carry a password.
    parts = urlsplit(dsn)
    return parts.netloc.rpartition("@")[2] + parts.path


@contextmanager
def throwaway_database(server: str | None = None) -> Iterator[str]:
    """Create an empty database named ``taskq_test_<hex>``; yield its DSN; drop it after.

    Raises :class:`PostgresUnavailable` when the server cannot be reached.
    The drop uses ``WITH (FORCE)``, so connections a test leaked do not keep
    the database alive.
    """
    import psycopg
    from psycopg import sql

    server = server or server_dsn()
    name = f"taskq_test_{secrets.token_hex(6)}"
    dsn = _database_dsn(server, name)
    try:
        with psycopg.connect(
            server, autocommit=True, connect_timeout=_CONNECT_TIMEOUT_SECONDS
        ) as admin:
            admin.execute(
                sql.SQL("CREATE DATABASE {}").format(sql.Identifier(check_identifier(name)))
            )
    except psycopg.Error as exc:
        raise PostgresUnavailable(
            f"cannot create a test database on the PostgreSQL server at {_where(server)} "
            f"(set TASKQ_TEST_DSN to a server where this role may CREATE DATABASE): {exc}"
        ) from exc
    try:
        yield dsn
    finally:
        with psycopg.connect(server, autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                    sql.Identifier(check_identifier(name))
                )
            )


@contextmanager
def migrated_schema(database_dsn: str, name: str | None = None) -> Iterator[PgSchema]:
    """Apply TaskQ's migrations to a new schema (default: a random name); drop it after.

    Usable from sync and async code alike: the async migrator runs on a
    private event loop in a helper thread, so it neither needs nor disturbs
    the caller's loop. A ``name`` that an existing schema has is refused
    (``ValueError``): the drop afterwards would take that schema and its data
    with it. A migration that fails drops what it had made.
    """
    from taskq_postgres._migrate import migrate

    # Folded as Postgres folds unquoted names, so the quoted DROP below matches.
    schema = validate_schema_name(name or unique_schema_name()).lower()
    if name is not None and _schema_exists(database_dsn, schema):
        raise ValueError(
            f"schema {schema!r} already exists in {_where(database_dsn)}: migrated_schema "
            f"makes a new schema and drops it afterwards; give a name no schema has, or "
            f"none for a random one"
        )
    try:
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="taskq-migrate") as pool:
            pool.submit(asyncio.run, migrate(database_dsn, schema)).result()
    except BaseException:
        # What the migration made goes; the migration's error is the one to see.
        with contextlib.suppress(Exception):
            _drop_schema(database_dsn, schema)
        raise
    try:
        yield PgSchema(database_dsn, schema)
    finally:
        _drop_schema(database_dsn, schema)


def _schema_exists(database_dsn: str, schema: str) -> bool:
    import psycopg

    with psycopg.connect(database_dsn, autocommit=True) as conn:
        found = conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,))
        return found.fetchone() is not None


def _drop_schema(database_dsn: str, schema: str) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(database_dsn, autocommit=True) as conn:
        # A test that left a transaction open would block the drop forever;
        # the whole database is dropped at session end anyway.
        conn.execute("SET lock_timeout = '5s'")
        try:
            conn.execute(
                sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(
                    sql.Identifier(check_identifier(schema))
                )
            )
        except psycopg.errors.LockNotAvailable:
            warnings.warn(
                f"schema {schema!r} was left in place: a connection still holds a lock in "
                f"it (a transaction left open?); it goes with a throwaway database, "
                f"else drop it by hand",
                ResourceWarning,
                stacklevel=2,
            )


class SchemaPool:
    """Migrated schemas reused from test to test within one session (one pool per
    xdist worker, so no two tests ever share a schema at the same time).

    :meth:`schema` hands out an empty schema: a free one, else a newly migrated
    one. Afterwards every table except the migration ledger is emptied and its
    sequences restarted; a schema that cannot be emptied within a few seconds
    (a test left a transaction holding locks) is dropped instead of reused.
    Emptying takes about a millisecond, where migrating takes a hundred.
    """

    def __init__(self, database_dsn: str) -> None:
        self._dsn = database_dsn
        self._free: list[str] = []
        self._resets: dict[str, Any] = {}
        self._conn: Any = None  # a psycopg connection, opened on the first reset

    @contextmanager
    def schema(self) -> Iterator[PgSchema]:
        """An empty, migrated schema for the duration of the ``with`` block."""
        name = self._free.pop() if self._free else self._migrate()
        try:
            yield PgSchema(self._dsn, name)
        finally:
            if self._empty(name):
                self._free.append(name)
            else:
                _drop_schema(self._dsn, name)

    def close(self) -> None:
        """Drop every free schema and close the pool's connection."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        while self._free:
            _drop_schema(self._dsn, self._free.pop())

    def _migrate(self) -> str:
        from taskq_postgres._migrate import migrate

        name = unique_schema_name()
        try:
            with ThreadPoolExecutor(max_workers=1, thread_name_prefix="taskq-migrate") as pool:
                pool.submit(asyncio.run, migrate(self._dsn, name)).result()
        except BaseException:
            # Never handed out, so never emptied or dropped: it stayed for the session.
            with contextlib.suppress(Exception):
                _drop_schema(self._dsn, name)
            raise
        return name

    def _reset_statement(self, conn: Any, schema: str) -> Any:
        from psycopg import sql

        if schema not in self._resets:
            tables = [
                row[0]
                for row in conn.execute(
                    "SELECT tablename FROM pg_tables "
                    "WHERE schemaname = %s AND tablename <> 'schema_migrations' "
                    "ORDER BY tablename",
                    (schema,),
                )
            ]
            sequences = [
                row[0]
                for row in conn.execute(
                    "SELECT sequencename FROM pg_sequences WHERE schemaname = %s "
                    "ORDER BY sequencename",
                    (schema,),
                )
            ]
            checked = check_identifier(schema)
            # DELETE, not TRUNCATE: on near-empty tables it is some 40 times faster.
            statements = [
                sql.SQL("DELETE FROM {}").format(sql.Identifier(checked, table)) for table in tables
            ] + [
                sql.SQL("ALTER SEQUENCE {} RESTART").format(sql.Identifier(checked, sequence))
                for sequence in sequences
            ]
            self._resets[schema] = sql.SQL("; ").join(statements)
        return self._resets[schema]

    def _empty(self, schema: str) -> bool:
        import psycopg

        try:
            if self._conn is None:
                self._conn = psycopg.connect(self._dsn, autocommit=True)
                self._conn.execute("SET lock_timeout = '3s'")
            self._conn.execute(self._reset_statement(self._conn, schema))
        except psycopg.Error:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
            return False
        return True
