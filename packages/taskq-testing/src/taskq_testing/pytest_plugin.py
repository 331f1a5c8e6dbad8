"""TaskQ's pytest plugin, loaded in every pytest run (entry point ``pytest11: taskq``).

Postgres fixtures:

* ``pg_database_dsn`` (session): the DSN of a throwaway database created for
  this session (one per xdist worker) and dropped at its end.
* ``pg_schema`` (function): a :class:`~taskq_testing.postgres.PgSchema`
  (``.dsn``, ``.name``) naming a freshly migrated schema of its own, dropped
  after the test.
* ``pg_pooled_schema`` (function): the same, but taken from a per-session
  :class:`~taskq_testing.postgres.SchemaPool`: an empty schema that earlier
  tests of this session may have used (and that was emptied since). Much
  faster for suites of many short tests; use ``pg_schema`` when a test changes
  the schema itself or needs statistics of its own.

If the server (``TASKQ_TEST_DSN``) is unreachable these fixtures fail the
test with the reason; they never skip silently.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

# Before anything imports the conformance suite, so its asserts show values
# even when it runs from an installed wheel. Imports of this package follow it.
pytest.register_assert_rewrite("taskq_testing.conformance")

from taskq_testing.postgres import (
    PgSchema,
    PostgresUnavailable,
    SchemaPool,
    migrated_schema,
    throwaway_database,
)


@pytest.fixture(scope="session")
def pg_database_dsn() -> Iterator[str]:
    """DSN of an empty database that lives for this test session (per xdist worker)."""
    try:
        with throwaway_database() as dsn:
            yield dsn
    except PostgresUnavailable as exc:
        # from None: report the reason alone, not a chain of driver tracebacks.
        raise pytest.fail.Exception(str(exc), pytrace=False) from None


@pytest.fixture
def pg_schema(pg_database_dsn: str) -> Iterator[PgSchema]:
    """A freshly migrated schema for this test alone, in the session database."""
    with migrated_schema(pg_database_dsn) as schema:
        yield schema


@pytest.fixture(scope="session")
def _pg_schema_pool(pg_database_dsn: str) -> Iterator[SchemaPool]:
    pool = SchemaPool(pg_database_dsn)
    yield pool
    pool.close()


@pytest.fixture
def pg_pooled_schema(_pg_schema_pool: SchemaPool) -> Iterator[PgSchema]:
    """An empty migrated schema for this test alone, reused from earlier tests."""
    with _pg_schema_pool.schema() as schema:
        yield schema
