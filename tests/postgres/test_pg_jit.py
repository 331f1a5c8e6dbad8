"""TaskQ's connections run without JIT: compiling its short statements cost more
than running them (about 110 ms per dispatch on a 20,000-job backlog)."""

from __future__ import annotations

import pytest

from taskq_postgres import PostgresBackend
from taskq_testing.postgres import PgSchema

pytestmark = pytest.mark.postgres


async def test_pool_and_listen_connections_have_jit_off(pg_pooled_schema: PgSchema) -> None:
    backend = PostgresBackend(pg_pooled_schema.dsn, schema=pg_pooled_schema.name)
    await backend.open()
    try:
        async with backend.connection() as conn:
            assert await conn.fetchval("SHOW jit") == "off"
        async with backend.subscribe_wake():
            listener = backend._listener
            assert listener is not None and listener._conn is not None
            assert await listener._conn.fetchval("SHOW jit") == "off"
    finally:
        await backend.close()
