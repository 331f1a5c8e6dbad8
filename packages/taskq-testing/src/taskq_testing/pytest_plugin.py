"""TaskQ's pytest plugin, loaded in every pytest run (entry point ``pytest11: taskq``).

Backend fixtures, each an open backend of this test alone (closed after it): build
the application on it with ``TaskQ(url, actors=[...], backend=...)`` and run its
jobs with :func:`taskq_testing.run_until_idle`.

* ``memory_backend``: an :class:`~taskq.backend.memory.InMemoryBackend`.
* ``pg_backend``: a ``PostgresBackend`` on a ``pg_pooled_schema`` (needs
  taskq-postgres: ``pip install 'taskq-testing[postgres]'``).
* ``taskq_backend``: each test that takes it runs twice, on ``memory_backend``
  and on ``pg_backend``.

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
test with the reason; they never skip silently. Every test that uses one (and the
``postgres`` run of a ``taskq_backend`` test) is marked ``taskq_postgres``: ``pytest
-m "not taskq_postgres"`` runs the rest where no server is at hand.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
import pytest_asyncio

# Before anything imports the conformance suite, so its asserts show values
# even when it runs from an installed wheel. Imports of this package follow it.
pytest.register_assert_rewrite("taskq_testing.conformance")

from taskq.backend import Backend
from taskq.backend.memory import InMemoryBackend
from taskq_testing.postgres import (
    PgSchema,
    PostgresUnavailable,
    SchemaPool,
    migrated_schema,
    throwaway_database,
)

_POSTGRES_MARK = "taskq_postgres"
_POSTGRES_FIXTURES = frozenset({"pg_database_dsn", "pg_schema", "pg_pooled_schema", "pg_backend"})


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{_POSTGRES_MARK}: uses taskq-testing's Postgres fixtures "
        f"(deselect with -m 'not {_POSTGRES_MARK}')",
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _POSTGRES_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(_POSTGRES_MARK)


@pytest.fixture(scope="session")
def pg_database_dsn() -> Iterator[str]:
    """DSN of an empty database that lives for this test session (per xdist worker)."""
    try:
        # Here, not at the top: loading the plugin imports no database driver.
        import psycopg  # noqa: F401

        import taskq_postgres  # noqa: F401
    except ImportError:
        raise pytest.fail.Exception(
            "the Postgres fixtures need taskq-postgres and psycopg: "
            "pip install 'taskq-testing[postgres]'",
            pytrace=False,
        ) from None
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


@pytest_asyncio.fixture
async def memory_backend() -> AsyncIterator[Backend]:
    """An open in-memory backend of this test alone."""
    backend = InMemoryBackend()
    await backend.open()
    yield backend
    await backend.close()


@pytest_asyncio.fixture
async def pg_backend(pg_pooled_schema: PgSchema) -> AsyncIterator[Backend]:
    """An open Postgres backend on an empty migrated schema of this test alone."""
    from taskq_postgres import PostgresBackend  # pg_database_dsn checked it is installed

    backend = PostgresBackend(pg_pooled_schema.dsn, schema=pg_pooled_schema.name)
    await backend.open()
    yield backend
    await backend.close()


@pytest.fixture(params=["memory", pytest.param("postgres", marks=pytest.mark.taskq_postgres)])
def taskq_backend(request: pytest.FixtureRequest) -> Backend:
    """``memory_backend``, then ``pg_backend``: the test runs once on each."""
    name = "memory_backend" if request.param == "memory" else "pg_backend"
    backend: Backend = request.getfixturevalue(name)
    return backend
