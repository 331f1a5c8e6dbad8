"""The migrated schema, compared with the committed snapshot ``schema_snapshot.txt``.

A migration that changes the schema must update the snapshot in the same
change, so reviewers see the resulting schema, not only the diff of SQL
files. Regenerate it with ``TASKQ_UPDATE_SCHEMA_SNAPSHOT=1 pytest
tests/postgres/test_schema_snapshot.py`` and review the diff.
"""

from __future__ import annotations

import os
from pathlib import Path

import asyncpg
import pytest

from taskq_testing.postgres import PgSchema
from tests.postgres.schema_shape import describe_schema

pytestmark = pytest.mark.postgres

SNAPSHOT = Path(__file__).with_name("schema_snapshot.txt")


async def test_migrated_schema_matches_the_snapshot(pg_schema: PgSchema) -> None:
    conn = await asyncpg.connect(pg_schema.dsn)
    try:
        await conn.execute("SET search_path = pg_catalog")  # qualify every name the same way
        described = await describe_schema(conn, pg_schema.name)
    finally:
        await conn.close()
    if os.environ.get("TASKQ_UPDATE_SCHEMA_SNAPSHOT") == "1":
        SNAPSHOT.write_text(described, encoding="utf-8")
    assert described == SNAPSHOT.read_text(encoding="utf-8"), (
        "the migrated schema differs from tests/postgres/schema_snapshot.txt; if the change is "
        "intended, regenerate it with TASKQ_UPDATE_SCHEMA_SNAPSHOT=1 and review the diff"
    )
