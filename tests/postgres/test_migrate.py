"""The migration runner against the local PostgreSQL server."""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any, TypedDict
from uuid import uuid4

import asyncpg
import pytest
from structlog.testing import capture_logs

from taskq.errors import ConfigurationError
from taskq_postgres import ReadOnlyDatabaseError
from taskq_postgres._migrate import (
    NO_TRANSACTION_DIRECTIVE,
    MigrationError,
    bundled_migrations,
    load_migrations,
    migrate,
    migration_status,
    schema_fit,
)
from taskq_testing.postgres import PgSchema, unique_schema_name

pytestmark = pytest.mark.postgres

BUNDLED = [m.name for m in load_migrations()]

TABLES = {
    "actor_config",
    "batches",
    "job_attempts",
    "job_attempts_archive",
    "job_events",
    "jobs",
    "jobs_archive",
    "maintenance_leader",
    "maintenance_runs",
    "queues",
    "rate_limit_buckets",
    "rate_limit_window_entries",
    "reservation_slots",
    "schedules",
    "schema_migrations",
    "workers",
}

# The lock key is part of the contract: operators may take it by hand.
LOCK_SQL = "SELECT pg_advisory_lock(hashtext('taskq:migrate:' || $1))"
UNLOCK_SQL = "SELECT pg_advisory_unlock(hashtext('taskq:migrate:' || $1))"


@pytest.fixture
async def conn(pg_schema: PgSchema) -> AsyncIterator[asyncpg.Connection[Any]]:
    connection = await asyncpg.connect(pg_schema.dsn)
    yield connection
    await connection.close()


def _source(directory: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (directory / name).write_text(text, encoding="utf-8")
    return directory


async def _columns(conn: asyncpg.Connection[Any], schema: str, table: str) -> list[tuple[str, str]]:
    rows = await conn.fetch(
        "SELECT column_name, udt_name FROM information_schema.columns"
        " WHERE table_schema = $1 AND table_name = $2 ORDER BY ordinal_position",
        schema,
        table,
    )
    return [(r["column_name"], r["udt_name"]) for r in rows]


async def _wait_for_advisory_waiters(conn: asyncpg.Connection[Any], count: int) -> None:
    deadline = time.monotonic() + 30
    query = (
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
        " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
    )
    while await conn.fetchval(query) < count:
        assert time.monotonic() < deadline, f"fewer than {count} migrators waited on the lock"
        await asyncio.sleep(0.01)


async def _wait_until_blocked_by(conn: asyncpg.Connection[Any], pid: int) -> None:
    """Until a session waits for a lock session ``pid`` holds (only this test's: another
    test's migrators, under xdist, wait for locks of their own)."""
    deadline = time.monotonic() + 30
    query = "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))"
    while not await conn.fetchval(query, pid):
        assert time.monotonic() < deadline, f"no session waited for a lock pid {pid} holds"
        await asyncio.sleep(0.01)


# ------------------------------------------------------------ fresh install


async def test_a_fresh_schema_has_every_table(
    conn: asyncpg.Connection[Any], pg_schema: PgSchema
) -> None:
    rows = await conn.fetch(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = $1", pg_schema.name
    )
    assert {r["table_name"] for r in rows} == TABLES


async def test_job_status_enum_is_exactly_the_eight_statuses(
    conn: asyncpg.Connection[Any], pg_schema: PgSchema
) -> None:
    labels = await conn.fetchval(f"SELECT enum_range(NULL::{pg_schema.name}.job_status)::text[]")
    assert labels == [
        "pending",
        "scheduled",
        "running",
        "succeeded",
        "failed",
        "cancelled",
        "crashed",
        "abandoned",
    ]


async def test_nothing_lands_outside_the_target_schema(conn: asyncpg.Connection[Any]) -> None:
    # An unqualified name in a migration would be created in public.
    leaked = await conn.fetchval(
        "SELECT (SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        "        WHERE n.nspname = 'public')"
        "     + (SELECT count(*) FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace"
        "        WHERE n.nspname = 'public')"
        "     + (SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
        "        WHERE n.nspname = 'public')"
    )
    assert leaked == 0


async def test_running_again_is_a_no_op(pg_schema: PgSchema) -> None:
    assert await migrate(pg_schema.dsn, pg_schema.name) == []
    statuses = await migration_status(pg_schema.dsn, pg_schema.name)
    assert [(s.name, s.state) for s in statuses] == [(name, "applied") for name in BUNDLED]
    assert all(s.applied_at is not None for s in statuses)


async def test_status_of_an_absent_schema_is_all_pending(pg_database_dsn: str) -> None:
    statuses = await migration_status(pg_database_dsn, unique_schema_name())
    assert [(s.name, s.state, s.applied_at) for s in statuses] == [
        (name, "pending", None) for name in BUNDLED
    ]


async def test_migrate_returns_what_it_applied_in_order(pg_database_dsn: str) -> None:
    assert await migrate(pg_database_dsn, unique_schema_name()) == BUNDLED


async def test_archives_mirror_the_live_tables(
    conn: asyncpg.Connection[Any], pg_schema: PgSchema
) -> None:
    jobs = await _columns(conn, pg_schema.name, "jobs")
    attempts = await _columns(conn, pg_schema.name, "job_attempts")
    # A column added since sits last in each table (ADD COLUMN appends): prune names
    # them all, so only the set matters there.
    assert sorted(await _columns(conn, pg_schema.name, "jobs_archive")) == sorted(
        [*jobs, ("archived_at", "timestamptz"), ("expire_at", "timestamptz")]
    )
    assert await _columns(conn, pg_schema.name, "job_attempts_archive") == [
        *attempts,
        ("archived_at", "timestamptz"),
    ]


async def test_dispatch_and_sweep_indexes_are_partial(
    conn: asyncpg.Connection[Any], pg_schema: PgSchema
) -> None:
    rows = await conn.fetch(
        "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = $1", pg_schema.name
    )
    defs = {r["indexname"]: r["indexdef"] for r in rows}
    assert "(queue, actor, priority DESC, scheduled_at, id)" in defs["jobs_dispatch_idx"]
    assert "WHERE (status = 'pending'" in defs["jobs_dispatch_idx"]
    assert "WHERE (status = " in defs["jobs_running_lock_expiry_idx"]
    assert "WHERE (status = " in defs["jobs_scheduled_idx"]
    assert defs["jobs_idempotency_key_uq"].startswith("CREATE UNIQUE INDEX")
    assert defs["jobs_running_identity_key"].startswith("CREATE UNIQUE INDEX")
    assert "(actor, identity_key) WHERE (status = " in defs["jobs_running_identity_key"]
    assert "jobs_running_identity_idx" not in defs  # replaced by the unique one
    assert "(kind, id)" in defs["job_events_outbox_idx"]
    assert "(job_id, id)" in defs["job_events_job_idx"]


# ------------------------------------------------------------ constraints


async def _insert_job(conn: asyncpg.Connection[Any], schema: str, **columns: object) -> None:
    columns.setdefault("actor", "a")
    names = ", ".join(columns)
    params = ", ".join(f"${i}" for i in range(1, len(columns) + 1))
    await conn.execute(f"INSERT INTO {schema}.jobs ({names}) VALUES ({params})", *columns.values())


async def test_cancel_phase_three_never_reaches_the_table(
    conn: asyncpg.Connection[Any], pg_schema: PgSchema
) -> None:
    await _insert_job(conn, pg_schema.name, cancel_phase=2)
    with pytest.raises(asyncpg.CheckViolationError):
        await _insert_job(conn, pg_schema.name, cancel_phase=3)


async def test_idempotency_key_holds_for_terminal_jobs_too(
    conn: asyncpg.Connection[Any], pg_schema: PgSchema
) -> None:
    await _insert_job(conn, pg_schema.name, idempotency_key="k", status="succeeded")
    await _insert_job(conn, pg_schema.name, actor="other", idempotency_key="k")
    with pytest.raises(asyncpg.UniqueViolationError):
        await _insert_job(conn, pg_schema.name, idempotency_key="k")


async def test_a_running_job_must_hold_a_lock(
    conn: asyncpg.Connection[Any], pg_schema: PgSchema
) -> None:
    with pytest.raises(asyncpg.CheckViolationError):
        await _insert_job(conn, pg_schema.name, status="running")
    await conn.execute(
        f"INSERT INTO {pg_schema.name}.jobs (actor, status, locked_by_worker, lock_expires_at)"
        " VALUES ('a', 'running', $1, clock_timestamp())",
        uuid4(),
    )


async def test_maintenance_leader_holds_one_row(
    conn: asyncpg.Connection[Any], pg_schema: PgSchema
) -> None:
    table = f"{pg_schema.name}.maintenance_leader"
    await conn.execute(f"INSERT INTO {table} (worker_id) VALUES ($1)", uuid4())
    with pytest.raises(asyncpg.UniqueViolationError):
        await conn.execute(f"INSERT INTO {table} (worker_id) VALUES ($1)", uuid4())
    with pytest.raises(asyncpg.CheckViolationError):
        await conn.execute(f"INSERT INTO {table} (id, worker_id) VALUES (false, $1)", uuid4())


async def test_queue_mode_is_checked(conn: asyncpg.Connection[Any], pg_schema: PgSchema) -> None:
    await conn.execute(f"INSERT INTO {pg_schema.name}.queues (name) VALUES ('q')")
    assert await conn.fetchval(f"SELECT mode FROM {pg_schema.name}.queues") == "strict_fifo"
    with pytest.raises(asyncpg.CheckViolationError):
        await conn.execute(f"INSERT INTO {pg_schema.name}.queues VALUES ('r', 'lifo')")


async def test_updated_at_follows_every_update(
    conn: asyncpg.Connection[Any], pg_schema: PgSchema
) -> None:
    await _insert_job(conn, pg_schema.name)
    before = await conn.fetchval(f"SELECT updated_at FROM {pg_schema.name}.jobs")
    await conn.execute(f"UPDATE {pg_schema.name}.jobs SET priority = 5")
    assert await conn.fetchval(f"SELECT updated_at FROM {pg_schema.name}.jobs") > before


async def test_events_and_attempts_go_with_their_job(
    conn: asyncpg.Connection[Any], pg_schema: PgSchema
) -> None:
    s = pg_schema.name
    job_id = uuid4()
    await _insert_job(conn, s, id=job_id)
    await conn.execute(f"INSERT INTO {s}.job_events (job_id, kind) VALUES ($1, 'x')", job_id)
    await conn.execute(
        f"INSERT INTO {s}.job_attempts (job_id, attempt, outcome) VALUES ($1, 1, 'failed')", job_id
    )
    await conn.execute(f"DELETE FROM {s}.jobs WHERE id = $1", job_id)
    assert await conn.fetchval(f"SELECT count(*) FROM {s}.job_events") == 0
    assert await conn.fetchval(f"SELECT count(*) FROM {s}.job_attempts") == 0


# ------------------------------------------------------------ the runner


async def test_checksum_drift_is_warned_and_not_rerun(pg_database_dsn: str, tmp_path: Path) -> None:
    for entry in bundled_migrations().iterdir():
        if entry.name.endswith(".sql"):
            (tmp_path / entry.name).write_text(entry.read_text(encoding="utf-8"), encoding="utf-8")
    schema = unique_schema_name()
    await migrate(pg_database_dsn, schema, source=tmp_path)
    edited = tmp_path / "01.00.00_01_pre_initial.sql"
    edited.write_text(edited.read_text(encoding="utf-8") + "\n-- edited\n", encoding="utf-8")

    with capture_logs() as logs:
        assert await migrate(pg_database_dsn, schema, source=tmp_path) == []

    drift = [e for e in logs if e["event"] == "taskq.migration-checksum-drift"]
    assert len(drift) == 1
    assert drift[0]["log_level"] == "warning"
    assert drift[0]["migration"] == edited.name
    assert drift[0]["schema"] == schema
    assert drift[0]["recorded_checksum"] != drift[0]["current_checksum"]
    states = {
        s.name: s.state for s in await migration_status(pg_database_dsn, schema, source=tmp_path)
    }
    assert states[edited.name] == "drifted"
    assert states["01.00.02_01_pre_job_events_outbox.sql"] == "applied"


async def test_a_recorded_file_missing_here_is_unknown(pg_schema: PgSchema, tmp_path: Path) -> None:
    shutil.copy(Path(str(bundled_migrations() / BUNDLED[0])), tmp_path / BUNDLED[0])
    statuses = await migration_status(pg_schema.dsn, pg_schema.name, source=tmp_path)
    assert [(s.name, s.state) for s in statuses] == [
        (BUNDLED[0], "applied"),
        *((name, "unknown") for name in sorted(BUNDLED[1:])),  # unknown: by name
    ]


async def test_another_tools_schema_migrations_table_is_refused_clearly(
    pg_database_dsn: str,
) -> None:
    # golang-migrate's ledger; Rails, Ecto and dbmate keep one by the same name. Read as
    # TaskQ's, it failed with the driver's "column checksum does not exist".
    schema = unique_schema_name()
    conn = await asyncpg.connect(pg_database_dsn)
    try:
        await conn.execute(f"CREATE SCHEMA {schema}")
        await conn.execute(f"CREATE TABLE {schema}.schema_migrations (version bigint, dirty bool)")
        expected = (
            rf"schema '{schema}' holds a schema_migrations that is not TaskQ's ledger "
            r"\(its columns: version, dirty\).*give TaskQ a schema of its own"
        )
        with pytest.raises(ConfigurationError, match=expected):
            await migrate(conn, schema)
        with pytest.raises(ConfigurationError, match=expected):
            await migration_status(conn, schema)
        with pytest.raises(ConfigurationError, match=expected):
            await schema_fit(conn, schema)  # a worker's start-up check
        assert await conn.fetchval("SELECT to_regclass($1)", f"{schema}.jobs") is None
    finally:
        await conn.close()


async def test_concurrent_migrators_both_succeed_and_apply_each_file_once(
    pg_database_dsn: str,
) -> None:
    schema = unique_schema_name()
    holder, first, second = [await asyncpg.connect(pg_database_dsn) for _ in range(3)]
    try:
        # Hold the lock so that both migrators are provably waiting at once.
        await holder.execute(LOCK_SQL, schema)
        tasks = [asyncio.create_task(migrate(c, schema)) for c in (first, second)]
        await _wait_for_advisory_waiters(holder, 2)
        await holder.execute(UNLOCK_SQL, schema)
        results = await asyncio.gather(*tasks)
        recorded = await holder.fetch(
            f"SELECT version FROM {schema}.schema_migrations ORDER BY version"
        )
    finally:
        for c in (holder, first, second):
            await c.close()
    assert sorted(results, key=len) == [[], BUNDLED]
    assert [r["version"] for r in recorded] == sorted(BUNDLED)


async def test_different_schemas_do_not_wait_for_each_other(pg_database_dsn: str) -> None:
    busy, other = unique_schema_name(), unique_schema_name()
    holder = await asyncpg.connect(pg_database_dsn)
    try:
        await holder.execute(LOCK_SQL, busy)
        assert await asyncio.wait_for(migrate(pg_database_dsn, other), timeout=60) == BUNDLED
    finally:
        await holder.close()


async def test_case_variants_of_a_name_are_one_schema(pg_database_dsn: str) -> None:
    lower = unique_schema_name()
    assert await migrate(pg_database_dsn, lower.upper()) == BUNDLED
    assert await migrate(pg_database_dsn, lower) == []
    statuses = await migration_status(pg_database_dsn, lower)
    assert {s.state for s in statuses} == {"applied"}


async def test_pre_files_run_before_post_files(pg_database_dsn: str, tmp_path: Path) -> None:
    def log(name: str) -> str:
        return f"INSERT INTO {{schema}}.log (name) VALUES ('{name}');"

    source = _source(
        tmp_path,
        {
            "01.00.00_01_pre_log.sql": "CREATE TABLE {schema}.log (n serial, name text);"
            + log("pre_log"),
            "01.00.00_50_post_cleanup.sql": log("post_cleanup"),
            "01.01.00_01_pre_later.sql": log("pre_later"),
        },
    )
    schema = unique_schema_name()
    applied = await migrate(pg_database_dsn, schema, source=source)
    assert applied == [
        "01.00.00_01_pre_log.sql",
        "01.01.00_01_pre_later.sql",
        "01.00.00_50_post_cleanup.sql",
    ]
    conn = await asyncpg.connect(pg_database_dsn)
    try:
        logged = await conn.fetch(f"SELECT name FROM {schema}.log ORDER BY n")
    finally:
        await conn.close()
    assert [r["name"] for r in logged] == ["pre_log", "pre_later", "post_cleanup"]


async def test_a_read_only_server_is_said_not_blamed_on_the_file(
    pg_database_dsn: str, tmp_path: Path
) -> None:
    # A standby or default_transaction_read_only: the failure said to see the comments
    # at the top of the file and fix the cause, as for a file that failed on its own.
    schema = unique_schema_name()
    (tmp_path / "none").mkdir()
    await migrate(pg_database_dsn, schema, source=tmp_path / "none")  # schema and ledger
    (tmp_path / "one").mkdir()
    source = _source(tmp_path / "one", {"01.00.00_01_pre_t.sql": "CREATE TABLE {schema}.t ();"})
    separator = "&" if "?" in pg_database_dsn else "?"
    read_only = f"{pg_database_dsn}{separator}default_transaction_read_only=on"
    with pytest.raises(ReadOnlyDatabaseError) as info:
        await migrate(read_only, schema, source=source)
    message = str(info.value)
    assert "cannot execute CREATE TABLE in a read-only transaction" in message
    assert message.endswith("at the primary, or have the setting reset")
    assert [s.state for s in await migration_status(pg_database_dsn, schema, source=source)] == [
        "pending"
    ]


async def test_a_read_only_server_is_said_for_a_schema_not_made_yet(
    pg_database_dsn: str, tmp_path: Path
) -> None:
    # The first migration of a schema (taskq migrate, a worker's --migrate) on a standby
    # said "cannot prepare schema ... for migrations" and the server's words alone, not
    # what a file's refusal says: the server is read-only, point the DSN at the primary.
    schema = unique_schema_name()
    source = _source(tmp_path, {"01.00.00_01_pre_t.sql": "CREATE TABLE {schema}.t ();"})
    separator = "&" if "?" in pg_database_dsn else "?"
    read_only = f"{pg_database_dsn}{separator}default_transaction_read_only=on"
    with pytest.raises(ReadOnlyDatabaseError) as info:
        await migrate(read_only, schema, source=source)
    message = str(info.value)
    assert "cannot execute CREATE SCHEMA in a read-only transaction" in message
    assert message.endswith("at the primary, or have the setting reset")
    statuses = await migration_status(pg_database_dsn, schema, source=source)
    assert [s.state for s in statuses] == ["pending"]


async def test_no_transaction_directive_allows_concurrent_index(
    pg_database_dsn: str, tmp_path: Path
) -> None:
    source = _source(
        tmp_path,
        {
            "01.00.00_01_pre_table.sql": "CREATE TABLE {schema}.t (c int);",
            "01.00.00_02_pre_index.sql": f"{NO_TRANSACTION_DIRECTIVE}\n"
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS t_c_idx ON {schema}.t (c);\n",
        },
    )
    schema = unique_schema_name()
    assert len(await migrate(pg_database_dsn, schema, source=source)) == 2
    conn = await asyncpg.connect(pg_database_dsn)
    try:
        valid = await conn.fetchval(
            "SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass($1)",
            f"{schema}.t_c_idx",
        )
    finally:
        await conn.close()
    assert valid is True


async def test_a_concurrent_index_left_invalid_is_not_recorded_as_applied(
    pg_database_dsn: str, tmp_path: Path
) -> None:
    # A failed CREATE INDEX CONCURRENTLY leaves its index, invalid; IF NOT EXISTS skipped
    # it on the next run, which recorded the file as applied with no uniqueness enforced.
    source = _source(
        tmp_path,
        {
            "01.00.00_01_pre_table.sql": "CREATE TABLE {schema}.t (c int);"
            "INSERT INTO {schema}.t VALUES (1), (1);",
            "01.00.00_02_pre_index.sql": f"{NO_TRANSACTION_DIRECTIVE}\n"
            "CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS t_c_key ON {schema}.t (c);\n",
        },
    )
    schema = unique_schema_name()
    with pytest.raises(MigrationError, match="is duplicated"):
        await migrate(pg_database_dsn, schema, source=source)
    with pytest.raises(MigrationError) as err:
        await migrate(pg_database_dsn, schema, source=source)
    assert (
        f"01.00.00_02_pre_index.sql left invalid indexes in schema '{schema}': {schema}.t_c_key"
        in str(err.value)
    )
    assert "DROP INDEX CONCURRENTLY" in str(err.value)
    states = [s.state for s in await migration_status(pg_database_dsn, schema, source=source)]
    assert states == ["applied", "pending"]

    conn = await asyncpg.connect(pg_database_dsn)
    try:
        await conn.execute(f"DROP INDEX CONCURRENTLY {schema}.t_c_key")
        await conn.execute(f"DELETE FROM {schema}.t WHERE ctid > '(0,1)'")
    finally:
        await conn.close()
    assert await migrate(pg_database_dsn, schema, source=source) == ["01.00.00_02_pre_index.sql"]


async def test_without_the_directive_a_concurrent_index_fails_cleanly(
    pg_database_dsn: str, tmp_path: Path
) -> None:
    source = _source(
        tmp_path,
        {
            "01.00.00_01_pre_table.sql": "CREATE TABLE {schema}.t (c int);",
            "01.00.00_02_pre_index.sql": "CREATE INDEX CONCURRENTLY t_c_idx ON {schema}.t (c);",
        },
    )
    schema = unique_schema_name()
    with pytest.raises(MigrationError, match=r"01\.00\.00_02_pre_index\.sql.*transaction block"):
        await migrate(pg_database_dsn, schema, source=source)
    states = [s.state for s in await migration_status(pg_database_dsn, schema, source=source)]
    assert states == ["applied", "pending"]


async def test_a_no_transaction_file_refuses_a_connection_inside_a_transaction(
    pg_database_dsn: str, tmp_path: Path
) -> None:
    source = _source(tmp_path, {"01.00.00_01_pre_x.sql": f"{NO_TRANSACTION_DIRECTIVE}\nSELECT 1;"})
    conn = await asyncpg.connect(pg_database_dsn)
    try:
        with pytest.raises(MigrationError, match="inside one"):
            async with conn.transaction():
                await migrate(conn, unique_schema_name(), source=source)
    finally:
        await conn.close()


async def test_a_failing_file_leaves_nothing_behind(pg_database_dsn: str, tmp_path: Path) -> None:
    source = _source(
        tmp_path,
        {
            "01.00.00_01_pre_ok.sql": "CREATE TABLE {schema}.ok (c int);",
            "01.00.00_02_pre_bad.sql": "CREATE TABLE {schema}.half (c int); SELECT 1 / 0;",
            "01.00.00_03_pre_after.sql": "CREATE TABLE {schema}.after (c int);",
        },
    )
    schema = unique_schema_name()
    with pytest.raises(
        MigrationError, match=r"01\.00\.00_02_pre_bad\.sql.*division by zero"
    ) as err:
        await migrate(pg_database_dsn, schema, source=source)
    # What to do next, not the server's words alone.
    assert str(err.value).endswith(
        "division by zero; it was not applied, nor any file after it (the files before it "
        "stay applied): see the comments at the top of 01.00.00_02_pre_bad.sql (in "
        "taskq_postgres/migrations), fix the cause, then run the "
        "migration again (taskq migrate)"
    )
    conn = await asyncpg.connect(pg_database_dsn)
    try:
        half = await conn.fetchval("SELECT to_regclass($1)", f"{schema}.half")
    finally:
        await conn.close()
    assert half is None
    states = [s.state for s in await migration_status(pg_database_dsn, schema, source=source)]
    assert states == ["applied", "pending", "pending"]

    (tmp_path / "01.00.00_02_pre_bad.sql").write_text("CREATE TABLE {schema}.half (c int);")
    assert await migrate(pg_database_dsn, schema, source=source) == [
        "01.00.00_02_pre_bad.sql",
        "01.00.00_03_pre_after.sql",
    ]


async def test_two_schemas_in_one_database_are_isolated(pg_database_dsn: str) -> None:
    first, second = unique_schema_name(), unique_schema_name()
    await asyncio.gather(migrate(pg_database_dsn, first), migrate(pg_database_dsn, second))
    conn = await asyncpg.connect(pg_database_dsn)
    try:
        await _insert_job(conn, first)
        assert await conn.fetchval(f"SELECT count(*) FROM {first}.jobs") == 1
        assert await conn.fetchval(f"SELECT count(*) FROM {second}.jobs") == 0
        await conn.execute(f"DROP SCHEMA {first} CASCADE")
        assert await conn.fetchval(f"SELECT count(*) FROM {second}.jobs") == 0
    finally:
        await conn.close()
    statuses = await migration_status(pg_database_dsn, second)
    assert {s.state for s in statuses} == {"applied"}
    assert {s.state for s in await migration_status(pg_database_dsn, first)} == {"pending"}


async def test_a_worker_start_up_holds_destructive_files_back(
    pg_database_dsn: str, tmp_path: Path
) -> None:
    release_1 = {"01.00.00_01_pre_log.sql": "CREATE TABLE {schema}.log (legacy text, name text);"}
    release_2 = {
        **release_1,
        "01.01.00_01_pre_add.sql": "ALTER TABLE {schema}.log ADD COLUMN new text;",
        "01.01.00_50_post_drop.sql": "ALTER TABLE {schema}.log DROP COLUMN legacy;",
    }

    def release(n: int, files: dict[str, str]) -> Path:
        (tmp_path / str(n)).mkdir()
        return _source(tmp_path / str(n), files)

    schema = unique_schema_name()
    assert await migrate(pg_database_dsn, schema, source=release(1, release_1))
    # The first worker of release 2 starts while release 1's still use "legacy".
    with capture_logs() as logs:
        applied = await migrate(pg_database_dsn, schema, source=release(2, release_2), post=False)
    assert applied == ["01.01.00_01_pre_add.sql"]
    assert [e["migrations"] for e in logs if e["event"] == "taskq.migration-post-held-back"] == [
        ["01.01.00_50_post_drop.sql"]
    ]
    # The operator's `taskq migrate`, once every worker is on release 2.
    assert await migrate(pg_database_dsn, schema, source=release(3, release_2)) == [
        "01.01.00_50_post_drop.sql"
    ]
    # A new schema has no old workers: it gets every file.
    fresh = unique_schema_name()
    applied = await migrate(pg_database_dsn, fresh, source=release(4, release_2), post=False)
    assert len(applied) == 3


@pytest.fixture
async def unprivileged_dsn(pg_database_dsn: str) -> AsyncIterator[str]:
    """A DSN of the test database for a role that may not create schemas in it."""
    from urllib.parse import urlsplit, urlunsplit

    role = f"taskq_test_noperm_{uuid4().hex[:8]}"
    admin: asyncpg.Connection[Any] = await asyncpg.connect(pg_database_dsn)
    try:
        await admin.execute(f"CREATE ROLE {role} LOGIN")
        parts = urlsplit(pg_database_dsn)
        yield urlunsplit(parts._replace(netloc=f"{role}@{parts.netloc.rpartition('@')[2]}"))
    finally:
        await admin.execute(f"DROP ROLE IF EXISTS {role}")
        await admin.close()


async def test_a_schema_the_role_cannot_create_is_a_migration_error_that_keeps_no_lock(
    unprivileged_dsn: str,
) -> None:
    schema = unique_schema_name()
    conn: asyncpg.Connection[Any] = await asyncpg.connect(unprivileged_dsn)
    try:
        async with conn.transaction():  # the caller's own transaction stays usable
            refused = "cannot prepare schema .* lacks CREATE on database .*permission denied"
            with pytest.raises(MigrationError, match=refused):
                await migrate(conn, schema)
            assert await conn.fetchval("SELECT 1") == 1
        held = await conn.fetchval(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()"
        )
        assert held == 0  # the next migrator would wait for ever on a kept lock
    finally:
        await conn.close()


async def test_a_worker_migrating_without_the_right_says_so_not_that_it_cannot_connect(
    unprivileged_dsn: str,
) -> None:
    from taskq_postgres import PostgresBackend

    backend = PostgresBackend(unprivileged_dsn, schema=unique_schema_name())
    with pytest.raises(MigrationError, match="cannot prepare schema"):
        await backend.migrate()


async def test_a_failure_other_than_a_refused_right_is_not_blamed_on_the_role(
    pg_database_dsn: str,
) -> None:
    # Every failure to prepare the schema said "the role needs CREATE on the database"
    # (a statement timeout too). Here the ledger's name is taken by a sequence.
    schema = unique_schema_name()
    conn: asyncpg.Connection[Any] = await asyncpg.connect(pg_database_dsn)
    try:
        await conn.execute(f"CREATE SCHEMA {schema}; CREATE SEQUENCE {schema}.schema_migrations")
        with pytest.raises(ConfigurationError, match="not TaskQ's ledger") as failed:
            await migrate(conn, schema)
        await conn.execute(f"DROP SCHEMA {schema} CASCADE")
    finally:
        await conn.close()
    assert "lacks" not in str(failed.value)


# ------------------------------------------------------------ lock waits

# Tiny bounds: the defaults (2 s a try, a minute in all) would make these tests slow.
QUICK_LOCK_TIMEOUT = timedelta(milliseconds=50)

_ALTER = {
    "01.00.00_01_pre_table.sql": "CREATE TABLE {schema}.t (c int);",
    "01.00.00_02_pre_alter.sql": "ALTER TABLE {schema}.t ADD COLUMN d int;",
}


async def _at_first_file(dsn: str, directory: Path, files: dict[str, str]) -> tuple[str, Path]:
    """A schema with the first of ``files`` applied; a source holding all of them."""
    first = dict(list(files.items())[:1])
    (directory / "first").mkdir()
    (directory / "all").mkdir()
    schema = unique_schema_name()
    await migrate(dsn, schema, source=_source(directory / "first", first))
    return schema, _source(directory / "all", files)


@asynccontextmanager
async def _long_reader(dsn: str, schema: str) -> AsyncIterator[asyncpg.Connection[Any]]:
    """A report's open transaction: it has read ``t`` and holds ACCESS SHARE on it."""
    reader: asyncpg.Connection[Any] = await asyncpg.connect(dsn)
    try:
        await reader.execute("BEGIN")
        await reader.fetchval(f"SELECT count(*) FROM {schema}.t")
        yield reader
    finally:
        await reader.close()


async def _wait_for_lock_waiter(conn: asyncpg.Connection[Any], schema: str) -> None:
    deadline = time.monotonic() + 30
    query = (
        "SELECT count(*) FROM pg_locks WHERE locktype = 'relation' AND NOT granted"
        " AND relation = to_regclass($1)"
    )
    while not await conn.fetchval(query, f"{schema}.t"):
        assert time.monotonic() < deadline, "the migration never waited for its lock"
        await asyncio.sleep(0.005)


async def test_a_concurrent_index_cut_by_the_lock_timeout_is_built_on_the_retry(
    pg_database_dsn: str, tmp_path: Path
) -> None:
    # The cut CREATE INDEX CONCURRENTLY left its index invalid, IF NOT EXISTS skipped it on
    # the retry, and the invalid-index check failed the file at the first lock timeout,
    # where it should wait (up to max_lock_wait) for the transaction that held it up.
    files = {
        "01.00.00_01_pre_table.sql": "CREATE TABLE {schema}.t (c int);",
        "01.00.00_02_pre_index.sql": f"{NO_TRANSACTION_DIRECTIVE}\n"
        "CREATE INDEX CONCURRENTLY IF NOT EXISTS t_c_idx ON {schema}.t (c);\n",
    }
    schema, source = await _at_first_file(pg_database_dsn, tmp_path, files)
    async with _long_reader(pg_database_dsn, schema) as reader:
        migrating = asyncio.create_task(
            migrate(
                pg_database_dsn,
                schema,
                source=source,
                lock_timeout=QUICK_LOCK_TIMEOUT,
                max_lock_wait=timedelta(seconds=30),
            )
        )
        with capture_logs() as logs:
            while not any(e["event"] == "taskq.migration-lock-retry" for e in logs):
                assert not migrating.done(), migrating.result()
                await asyncio.sleep(0.01)
        await reader.execute("ROLLBACK")
        assert await asyncio.wait_for(migrating, 30) == ["01.00.00_02_pre_index.sql"]
    conn = await asyncpg.connect(pg_database_dsn)
    try:
        valid = await conn.fetchval(
            "SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass($1)",
            f"{schema}.t_c_idx",
        )
    finally:
        await conn.close()
    assert valid is True


async def test_a_migration_waiting_for_a_lock_does_not_hold_up_other_queries(
    pg_database_dsn: str, tmp_path: Path
) -> None:
    # The ALTER queued behind the report's transaction, and every later query on the
    # table queued behind the ALTER, for as long as the report ran.
    schema, source = await _at_first_file(pg_database_dsn, tmp_path, _ALTER)
    live: asyncpg.Connection[Any] = await asyncpg.connect(pg_database_dsn)
    try:
        async with _long_reader(pg_database_dsn, schema) as reader:
            with capture_logs() as logs:
                migrating = asyncio.create_task(
                    migrate(
                        pg_database_dsn,
                        schema,
                        source=source,
                        lock_timeout=QUICK_LOCK_TIMEOUT,
                        max_lock_wait=timedelta(seconds=30),
                    )
                )
                await _wait_for_lock_waiter(live, schema)
                started = time.monotonic()
                await asyncio.wait_for(live.execute(f"INSERT INTO {schema}.t VALUES (1)"), 10)
                assert time.monotonic() - started < 1.0  # about the 50 ms lock timeout
                await asyncio.wait_for(live.fetchval(f"SELECT count(*) FROM {schema}.t"), 10)
                # Retried while the report runs, applied once it ends.
                await _wait_for_lock_waiter(live, schema)
                assert not migrating.done()
                await reader.execute("ROLLBACK")
                assert await asyncio.wait_for(migrating, 30) == ["01.00.00_02_pre_alter.sql"]
    finally:
        await live.close()
    retries = [e for e in logs if e["event"] == "taskq.migration-lock-retry"]
    assert retries and retries[0]["log_level"] == "warning"
    assert retries[0]["migration"] == "01.00.00_02_pre_alter.sql"
    assert retries[0]["schema"] == schema
    assert [e["attempt"] for e in retries] == list(range(1, len(retries) + 1))


async def test_a_lock_held_past_the_bound_fails_the_migration_clearly(
    pg_database_dsn: str, tmp_path: Path
) -> None:
    files = {**_ALTER, "01.00.00_03_pre_after.sql": "CREATE TABLE {schema}.after (c int);"}
    schema, source = await _at_first_file(pg_database_dsn, tmp_path, files)
    async with _long_reader(pg_database_dsn, schema) as reader:
        holder = await reader.fetchval("SELECT pg_backend_pid()")
        with pytest.raises(MigrationError) as failed:
            await migrate(
                pg_database_dsn,
                schema,
                source=source,
                lock_timeout=QUICK_LOCK_TIMEOUT,
                max_lock_wait=timedelta(milliseconds=300),
            )
    message = str(failed.value)
    assert "migration 01.00.00_02_pre_alter.sql could not lock" in message
    assert f"pid {holder} on {schema}.t (idle in transaction" in message
    assert "pg_terminate_backend" in message and "pg_stat_activity" in message
    assert "run the migration again" in message
    assert isinstance(failed.value.__cause__, asyncpg.LockNotAvailableError)
    states = [s.state for s in await migration_status(pg_database_dsn, schema, source=source)]
    assert states == ["applied", "pending", "pending"]
    conn: asyncpg.Connection[Any] = await asyncpg.connect(pg_database_dsn)
    try:
        assert [c for c, _ in await _columns(conn, schema, "t")] == ["c"]
    finally:
        await conn.close()


async def test_without_a_total_wait_a_file_is_tried_once(
    pg_database_dsn: str, tmp_path: Path
) -> None:
    schema, source = await _at_first_file(pg_database_dsn, tmp_path, _ALTER)
    async with _long_reader(pg_database_dsn, schema):
        with capture_logs() as logs, pytest.raises(MigrationError, match=r"\(1 attempt over"):
            await migrate(
                pg_database_dsn,
                schema,
                source=source,
                lock_timeout=QUICK_LOCK_TIMEOUT,
                max_lock_wait=timedelta(0),
            )
    assert [e for e in logs if e["event"] == "taskq.migration-lock-retry"] == []


async def test_a_no_transaction_file_is_bounded_and_the_session_setting_put_back(
    pg_database_dsn: str, tmp_path: Path
) -> None:
    files = {
        "01.00.00_01_pre_table.sql": "CREATE TABLE {schema}.t (c int);",
        "01.00.00_02_pre_alter.sql": f"{NO_TRANSACTION_DIRECTIVE}\n"
        "ALTER TABLE {schema}.t ADD COLUMN IF NOT EXISTS d int;\n",
    }
    schema, source = await _at_first_file(pg_database_dsn, tmp_path, files)
    conn: asyncpg.Connection[Any] = await asyncpg.connect(pg_database_dsn)
    try:
        await conn.execute("SET lock_timeout = '7s'")
        async with _long_reader(pg_database_dsn, schema):
            with pytest.raises(MigrationError, match="01.00.00_02_pre_alter.sql could not lock"):
                await migrate(
                    conn,
                    schema,
                    source=source,
                    lock_timeout=QUICK_LOCK_TIMEOUT,
                    max_lock_wait=timedelta(milliseconds=200),
                )
            assert await conn.fetchval("SHOW lock_timeout") == "7s"
        assert await migrate(conn, schema, source=source, lock_timeout=QUICK_LOCK_TIMEOUT) == [
            "01.00.00_02_pre_alter.sql"
        ]
        assert await conn.fetchval("SHOW lock_timeout") == "7s"
    finally:
        await conn.close()


async def test_the_lock_timeout_does_not_outlive_a_callers_transaction_file(
    pg_database_dsn: str, tmp_path: Path
) -> None:
    # A SET LOCAL in a savepoint stays once the savepoint is released.
    schema, source = await _at_first_file(pg_database_dsn, tmp_path, _ALTER)
    conn: asyncpg.Connection[Any] = await asyncpg.connect(pg_database_dsn)
    try:
        before = await conn.fetchval("SHOW lock_timeout")
        async with conn.transaction():
            await conn.execute("SET LOCAL lock_timeout = '7s'")
            assert await migrate(conn, schema, source=source, lock_timeout=QUICK_LOCK_TIMEOUT) == [
                "01.00.00_02_pre_alter.sql"
            ]
            assert await conn.fetchval("SHOW lock_timeout") == "7s"
        assert await conn.fetchval("SHOW lock_timeout") == before
    finally:
        await conn.close()


async def test_waiting_for_another_migrator_is_not_bounded(pg_database_dsn: str) -> None:
    # The advisory lock's wait is the point: the second migrator then finds nothing to do.
    schema = unique_schema_name()
    holder: asyncpg.Connection[Any] = await asyncpg.connect(pg_database_dsn)
    try:
        await holder.execute(LOCK_SQL, schema)
        bound = timedelta(milliseconds=100)
        migrating = asyncio.create_task(
            migrate(pg_database_dsn, schema, lock_timeout=QUICK_LOCK_TIMEOUT, max_lock_wait=bound)
        )
        await _wait_for_advisory_waiters(holder, 1)
        await asyncio.sleep(3 * bound.total_seconds())  # past both bounds
        assert not migrating.done()
        await holder.execute(UNLOCK_SQL, schema)
        assert await asyncio.wait_for(migrating, 60) == BUNDLED
    finally:
        await holder.close()


async def test_a_roles_lock_timeout_does_not_cut_the_wait_for_another_migrator(
    pg_database_dsn: str,
) -> None:
    # A role's lock_timeout (ALTER ROLE ... SET lock_timeout) bounded pg_advisory_lock
    # too: the second of two deploys failed with "canceling statement due to lock
    # timeout" where it should wait for the first and find nothing to do.
    schema = unique_schema_name()
    holder = await asyncpg.connect(pg_database_dsn)
    migrator = await asyncpg.connect(pg_database_dsn, server_settings={"lock_timeout": "1ms"})
    try:
        await holder.execute(LOCK_SQL, schema)
        migrating = asyncio.create_task(migrate(migrator, schema))
        blocking = "SELECT $2::int = ANY (pg_blocking_pids($1))"
        pids = (migrator.get_server_pid(), holder.get_server_pid())
        while not await holder.fetchval(blocking, *pids):
            if migrating.done():
                await migrating  # its error: the wait ended early
            await asyncio.sleep(0.01)
        await holder.execute(UNLOCK_SQL, schema)
        assert await asyncio.wait_for(migrating, 60) == BUNDLED
        assert await migrator.fetchval("SHOW lock_timeout") == "1ms"  # put back
    finally:
        await holder.close()
        await migrator.close()


async def test_a_wait_for_another_migrator_cut_in_a_callers_transaction_raises_its_cause(
    pg_database_dsn: str,
) -> None:
    # The wait's timeouts were put back by a statement in the caller's transaction, which
    # the cut wait had aborted: "current transaction is aborted" replaced a cancellation.
    schema = unique_schema_name()
    holder = await asyncpg.connect(pg_database_dsn)
    migrator = await asyncpg.connect(pg_database_dsn)
    try:
        await holder.execute(LOCK_SQL, schema)
        async with migrator.transaction():
            await migrator.execute("SET LOCAL lock_timeout = '7s'")
            migrating = asyncio.create_task(migrate(migrator, schema))
            blocking = "SELECT $2::int = ANY (pg_blocking_pids($1))"
            pids = (migrator.get_server_pid(), holder.get_server_pid())
            while not await holder.fetchval(blocking, *pids):
                assert not migrating.done()
                await asyncio.sleep(0.01)
            migrating.cancel()
            with pytest.raises(asyncio.CancelledError):
                await migrating
            with pytest.raises(asyncpg.InFailedSQLTransactionError):
                await migrator.execute("SELECT 1")  # the transaction is the caller's to end
        assert await migrator.fetchval("SHOW lock_timeout") == "0"  # its rollback put it back
    finally:
        await holder.close()
        await migrator.close()


class _LockBounds(TypedDict, total=False):
    """``migrate``'s lock bounds, typed per key: mypy checks a ``dict[str, timedelta]``
    passed as ``**`` against every keyword of ``migrate``."""

    lock_timeout: timedelta
    max_lock_wait: timedelta


@pytest.mark.parametrize(
    ("bounds", "error"),
    [
        ({"lock_timeout": timedelta(0)}, "lock_timeout must be positive"),
        ({"lock_timeout": timedelta(seconds=-1)}, "lock_timeout must be positive"),
        ({"max_lock_wait": timedelta(seconds=-1)}, "max_lock_wait must not be negative"),
        # Past Postgres's int of milliseconds: the first pending file failed, blamed.
        ({"lock_timeout": timedelta(days=30)}, "lock_timeout must be at most 2147483647ms"),
    ],
)
async def test_lock_bounds_are_checked_before_any_sql(bounds: _LockBounds, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        await migrate("postgresql://postgres@127.0.0.1:1/x", unique_schema_name(), **bounds)


async def test_a_migrator_waiting_for_the_lock_says_which_session_holds_it(
    pg_database_dsn: str,
) -> None:
    # The wait is unbounded, and it was silent: a session left holding the lock (a
    # killed migrator's, whose statement still runs) looked like a hung `taskq migrate`.
    schema = unique_schema_name()
    holder = await asyncpg.connect(
        pg_database_dsn, server_settings={"application_name": "maintenance"}
    )
    try:
        await holder.execute(LOCK_SQL, schema)
        with capture_logs() as logs:
            migrating = asyncio.create_task(migrate(pg_database_dsn, schema))
            # Watched from another session: polled on the holder, the holder read as
            # "active" running the poll whenever the migrator looked at it.
            watcher = await asyncpg.connect(pg_database_dsn)
            try:
                await _wait_until_blocked_by(watcher, holder.get_server_pid())
            finally:
                await watcher.close()
            waits = [e for e in logs if e["event"] == "taskq.migration-waiting-for-lock"]
            assert len(waits) == 1, logs
            await holder.execute(UNLOCK_SQL, schema)
            assert await asyncio.wait_for(migrating, 60) == BUNDLED
        pid = holder.get_server_pid()
        (held_by,) = waits[0]["held_by"]
        assert held_by.startswith(f"pid {pid} (idle, application 'maintenance', connected ")
        assert waits[0]["schema"] == schema
        assert "pg_terminate_backend(pid)" in waits[0]["hint"]
        # Not waiting, nothing said.
        with capture_logs() as again:
            assert await migrate(pg_database_dsn, schema) == []
        assert [e for e in again if e["event"] == "taskq.migration-waiting-for-lock"] == []
    finally:
        await holder.close()
