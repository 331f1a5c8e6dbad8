"""Refusals that heal by themselves are transient: a database that does not accept
connections for a while (``ALLOW_CONNECTIONS false``, 55000) and a lock wait past the
session's ``lock_timeout`` (55P03). The first ended the worker after five refused
reconnects, its jobs left locked; the second failed an outcome write for good, and
the job whose code had run ran again, its first run recorded as never started.

A statement timeout (57014) is transient too, but one that cancels a success write at
every try while the job's row is free fails the job: retried forever, it stayed
``running`` for the worker's life."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from typing import Any
from uuid import UUID

import asyncpg
import psycopg
import pytest
import structlog.testing

from taskq import JobRow, JobStatus, TaskQ, actor
from taskq.errors import JobFailedError
from taskq.models import EnqueueArgs, QueueConfig
from taskq_postgres import PostgresBackend, ReadOnlyDatabaseError
from taskq_postgres._transient import TRANSIENT_PG_ERRORS
from taskq_testing.postgres import PgSchema, migrated_schema, throwaway_database
from tests.worker.running import running

pytestmark = pytest.mark.postgres

SETTINGS = {
    "poll_interval": "100ms",
    "heartbeat_interval": "100ms",
    "maintenance_interval": "100ms",
    "dispatcher_command_timeout": "500ms",
}


@pytest.fixture
def own_database() -> Iterator[PgSchema]:
    """A schema in a database of this test's own: the test changes the database's
    settings, which would reach every other test's schema in a shared one."""
    with throwaway_database() as dsn, migrated_schema(dsn) as schema:
        yield schema


def _alter(dsn: str, statement: str) -> None:
    name = dsn.rpartition("/")[2]
    with psycopg.connect(dsn.rpartition("/")[0] + "/postgres", autocommit=True) as admin:
        admin.execute(statement.format(db=name))


RUNS: Counter[UUID] = Counter()
ENDED: Counter[UUID] = Counter()
GATES: dict[UUID, asyncio.Event] = {}
"""A job's code ends once its gate opens (and its sleep is over), where one is given."""


@actor(name="refusals.sleeper")
async def sleeper(payload: dict[str, Any], ctx: Any) -> None:
    RUNS[ctx.job_id] += 1
    await asyncio.sleep(payload["seconds"])
    if (gate := GATES.get(ctx.job_id)) is not None:
        await gate.wait()
    ENDED[ctx.job_id] += 1


async def _started(job_id: UUID) -> None:
    async with asyncio.timeout(10):
        while not RUNS[job_id]:  # noqa: ASYNC110 - the actor's own count
            await asyncio.sleep(0.02)


async def test_a_database_refusing_connections_is_transient(own_database: PgSchema) -> None:
    _alter(own_database.dsn, "ALTER DATABASE {db} ALLOW_CONNECTIONS false")
    try:
        with pytest.raises(TRANSIENT_PG_ERRORS):
            await asyncpg.connect(own_database.dsn)
    finally:
        _alter(own_database.dsn, "ALTER DATABASE {db} ALLOW_CONNECTIONS true")


async def test_a_worker_rides_out_a_database_refusing_connections(
    own_database: PgSchema,
) -> None:
    tq = TaskQ(own_database.dsn, schema=own_database.name, actors=[sleeper])
    async with tq:
        job = await tq.client.enqueue(sleeper, {"seconds": 1})
        async with running(tq, SETTINGS):
            await _started(job.id)
            _alter(own_database.dsn, "ALTER DATABASE {db} ALLOW_CONNECTIONS false")
            try:
                _alter(
                    own_database.dsn,
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = '{db}' AND pid <> pg_backend_pid()",
                )
                await asyncio.sleep(4)  # forty heartbeats and polls, refused or timed out
            finally:
                _alter(own_database.dsn, "ALTER DATABASE {db} ALLOW_CONNECTIONS true")
            await tq.client.wait_for_result(job.id, timeout=20)
        attempts = await tq.client.get_attempts(job.id)
    # Ran once, never reclaimed: a dispatch past its 500 ms bound on a loaded machine
    # (its reply lost) hands its job back unstarted first, as it should.
    outcomes = [a.outcome for a in attempts]
    assert [o for o in outcomes if o != "unstarted"] == ["succeeded"], outcomes
    assert RUNS[job.id] == 1


async def _ends_while_held(
    schema: PgSchema, settings: dict[str, str], hold: str, *, seconds: float
) -> tuple[JobRow, list[str]]:
    """A sleeper's job, whose code ends while a rival transaction holds what ``hold``
    (a statement, ``{s}`` the schema, ``$1`` the job's id) locks, for ``seconds`` more:
    the job as it ended, and its attempts' outcomes."""
    tq = TaskQ(schema.dsn, schema=schema.name, actors=[sleeper])
    async with tq:
        job = await tq.client.enqueue(sleeper, {"seconds": 0})
        # Its code ends once the rival holds the lock: a fixed 0.3 s nap could end
        # before the rival's connection and statements on a loaded machine, and the
        # write, landing at once, tested nothing.
        GATES[job.id] = asyncio.Event()
        async with running(tq, settings):
            await _started(job.id)
            rival: asyncpg.Connection[Any] = await asyncpg.connect(schema.dsn)
            try:
                await rival.execute("SET statement_timeout = 0")
                await rival.execute("BEGIN")
                statement = hold.format(s=schema.name)
                await rival.execute(statement, *([job.id] if "$1" in statement else []))
                GATES[job.id].set()
                async with asyncio.timeout(10):
                    while not ENDED[job.id]:  # noqa: ASYNC110 - the actor's own count
                        await asyncio.sleep(0.02)
                await asyncio.sleep(seconds)  # its outcome write waits, and times out
            finally:
                await rival.close()
            await tq.client.wait_for_result(job.id, timeout=20)
        row = await tq.client.get(job.id)
        attempts: list[str] = [a.outcome for a in await tq.client.get_attempts(job.id)]
    assert row is not None
    return row, attempts


_HOLD_ROW = "SELECT 1 FROM {s}.jobs WHERE id = $1 FOR UPDATE"


async def test_an_outcome_write_past_the_lock_timeout_is_retried(
    own_database: PgSchema,
) -> None:
    # An operator's transaction holds the job's row as its code ends, past the
    # database's lock_timeout: the success is written once the row is free.
    _alter(own_database.dsn, "ALTER DATABASE {db} SET lock_timeout = '200ms'")
    row, attempts = await _ends_while_held(own_database, SETTINGS, _HOLD_ROW, seconds=1)
    # Unstarted hand-backs aside (a dispatch past its bound on a loaded machine): one run.
    assert row.status is JobStatus.SUCCEEDED
    assert [o for o in attempts if o != "unstarted"] == ["succeeded"], attempts
    assert RUNS[row.id] == 1


async def test_a_success_write_past_the_statement_timeout_on_a_held_row_is_retried(
    own_database: PgSchema,
) -> None:
    # The row is held for three leases: the heartbeat skips it (no renewal), so the
    # timeouts are the holder's doing, not the write's, and the success lands after.
    _alter(own_database.dsn, "ALTER DATABASE {db} SET statement_timeout = '200ms'")
    # No sweep: the lease lapses while the row is held, and a reclaim would end the job.
    settings = {**SETTINGS, "lock_lease": "1s", "maintenance_interval": "1h"}
    row, _ = await _ends_while_held(own_database, settings, _HOLD_ROW, seconds=3)
    assert row.status is JobStatus.SUCCEEDED


@actor(name="refusals.large")
async def large(payload: dict[str, Any]) -> str:
    return "x" * 1000


async def test_a_success_write_cancelled_at_every_try_fails_the_job(pg_schema: PgSchema) -> None:
    # As a result too large to write within the statement_timeout would, every time.
    s = pg_schema.name
    conn: asyncpg.Connection[Any] = await asyncpg.connect(pg_schema.dsn)
    try:
        await conn.execute(
            f"""
            CREATE FUNCTION {s}.cancel_success() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                RAISE EXCEPTION 'canceling statement due to statement timeout'
                    USING ERRCODE = 'query_canceled';
            END $$;
            CREATE TRIGGER cancel_success BEFORE UPDATE ON {s}.jobs
                FOR EACH ROW WHEN (NEW.status = 'succeeded') EXECUTE FUNCTION {s}.cancel_success();
            """
        )
    finally:
        await conn.close()
    tq = TaskQ(pg_schema.dsn, schema=s, actors=[large])
    async with tq:
        job = await tq.client.enqueue(large, {})
        async with running(tq, {**SETTINGS, "lock_lease": "1s"}):
            with pytest.raises(JobFailedError):
                await tq.client.wait_for_result(job.id, timeout=20)
        row = await tq.client.get(job.id)
        attempts = await tq.client.get_attempts(job.id)
    assert row is not None and row.status is JobStatus.FAILED and row.error is not None
    assert row.error.error_class == "taskq.errors.OutcomeNotRecorded"
    assert "QueryCanceledError" in row.error.message
    assert [a.outcome for a in attempts] == ["failed"]


async def test_a_success_write_past_the_statement_timeout_on_a_locked_history_table_is_retried(
    own_database: PgSchema,
) -> None:
    # An operator's lock on job_attempts (a CREATE INDEX, a LOCK TABLE) holds up every
    # success write past the statement_timeout, while the job's row is free and the
    # heartbeat renews it between tries. The failure write that would take its place is
    # held up too: the write fails on the lock, not on what it carries, and is retried
    # until it lands, as a held row's is.
    _alter(own_database.dsn, "ALTER DATABASE {db} SET statement_timeout = '200ms'")
    settings = {**SETTINGS, "lock_lease": "1s", "maintenance_interval": "1h"}
    hold = "LOCK TABLE {s}.job_attempts IN SHARE MODE"
    row, _ = await _ends_while_held(own_database, settings, hold, seconds=3)
    assert row.status is JobStatus.SUCCEEDED


def _retried_read_only(logs: Iterable[Mapping[str, Any]]) -> bool:
    return any(e["event"] == "taskq.outcome-write-retry" and "ReadOnly" in e["error"] for e in logs)


async def test_a_database_made_read_only_for_a_while_is_ridden_out(
    own_database: PgSchema,
) -> None:
    # As a managed database's provider does while its disk is full: every session that
    # begins meanwhile is read-only (25006), and stays so after the reset. The success
    # write failed for good (the job ran again); then, retried, it met the same
    # sessions for the worker's life.
    tq = TaskQ(own_database.dsn, schema=own_database.name, actors=[sleeper])
    async with tq:
        job = await tq.client.enqueue(sleeper, {"seconds": 0})
        GATES[job.id] = asyncio.Event()
        with structlog.testing.capture_logs() as logs:
            async with running(tq, SETTINGS):
                await _started(job.id)
                _alter(
                    own_database.dsn, "ALTER DATABASE {db} SET default_transaction_read_only = on"
                )
                try:
                    _alter(
                        own_database.dsn,
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE datname = '{db}' AND pid <> pg_backend_pid()",
                    )
                    GATES[job.id].set()
                    async with asyncio.timeout(10):
                        while not _retried_read_only(logs):  # noqa: ASYNC110 - the worker's log
                            await asyncio.sleep(0.02)
                finally:
                    _alter(
                        own_database.dsn, "ALTER DATABASE {db} RESET default_transaction_read_only"
                    )
                await tq.client.wait_for_result(job.id, timeout=20)
        attempts = await tq.client.get_attempts(job.id)
    outcomes = [a.outcome for a in attempts]
    assert [o for o in outcomes if o != "unstarted"] == ["succeeded"], outcomes
    assert RUNS[job.id] == 1


async def test_a_lent_connection_that_met_a_read_only_session_is_replaced(
    own_database: PgSchema,
) -> None:
    # The pool's own statements have the connection that meets 25006 replaced (a
    # session keeps the default_transaction_read_only it began with); one lent by
    # backend.connection() went back to the pool as it was, and every later write on it
    # failed after the setting's reset.
    from taskq.models import EnqueueArgs
    from taskq_postgres import PostgresBackend, ReadOnlyDatabaseError

    dsn, args = own_database.dsn, EnqueueArgs(actor="refusals.sleeper", payload={"seconds": 0})
    _alter(dsn, "ALTER DATABASE {db} SET default_transaction_read_only = on")
    try:
        backend = PostgresBackend(dsn, schema=own_database.name, max_pool_size=1)
        await backend.open()
    finally:
        _alter(dsn, "ALTER DATABASE {db} RESET default_transaction_read_only")
    try:
        with pytest.raises(ReadOnlyDatabaseError):
            async with backend.connection() as conn, conn.transaction():
                await backend.enqueue_with_conn(conn, args)
        async with backend.connection() as conn, conn.transaction():
            row = await backend.enqueue_with_conn(conn, args)
        assert await backend.get(row.id) == row
    finally:
        await backend.close()


async def _pool_begun_read_only(database: PgSchema) -> PostgresBackend:
    """A backend opened while the database is read-only, its three pooled sessions begun
    so, the setting reset since."""
    _alter(database.dsn, "ALTER DATABASE {db} SET default_transaction_read_only = on")
    try:
        backend = PostgresBackend(
            database.dsn, schema=database.name, min_pool_size=3, max_pool_size=3
        )
        await backend.open()
    finally:
        _alter(database.dsn, "ALTER DATABASE {db} RESET default_transaction_read_only")
    return backend


def _args() -> EnqueueArgs:
    return EnqueueArgs(actor="refusals.sleeper", payload={"seconds": 0})


async def test_every_pooled_session_begun_read_only_is_replaced_after_one_refusal(
    own_database: PgSchema,
) -> None:
    # The setting is read when a session begins: after its reset, each pooled session
    # that began read-only failed a write once before it was replaced, one after another.
    backend = await _pool_begun_read_only(own_database)
    try:
        with pytest.raises(ReadOnlyDatabaseError):
            async with backend.connection() as conn, conn.transaction():
                await backend.enqueue_with_conn(conn, _args())
        # All three sessions at once: the one refused and the two that were not used.
        async with backend.connection() as a, backend.connection() as b, backend.connection() as c:
            for conn in (a, b, c):
                async with conn.transaction():
                    await backend.enqueue_with_conn(conn, _args())
        assert await backend.count_pending_jobs(["refusals.sleeper"]) == {"refusals.sleeper": 3}
    finally:
        await backend.close()


async def test_a_one_job_enqueue_on_a_pinned_session_begun_read_only_is_tried_on_a_new_one(
    own_database: PgSchema,
) -> None:
    # The backend's own one-statement writes: the one-job enqueue's pinned connection
    # began read-only, and kept checked out it was not replaced with the pool's
    # sessions. Its first write failed after the reset; the refusal ran nothing, so it
    # is tried again on a new session. Then the pool's, for enqueues made at once.
    backend = await _pool_begun_read_only(own_database)
    try:
        await backend.enqueue(_args())
        await asyncio.gather(*(backend.enqueue(_args()) for _ in range(3)))
        assert await backend.count_pending_jobs(["refusals.sleeper"]) == {"refusals.sleeper": 4}
    finally:
        await backend.close()


async def test_a_pooled_write_on_a_session_begun_read_only_is_tried_on_a_new_one(
    own_database: PgSchema,
) -> None:
    # As above, through the pool: the first pooled session met, begun read-only, fails
    # the write, which goes to a new session.
    backend = await _pool_begun_read_only(own_database)
    try:
        await backend.configure_queue(QueueConfig(queue="rr", mode="round_robin"))
        conn = await asyncpg.connect(own_database.dsn)
        try:
            mode = await conn.fetchval(
                f"SELECT mode FROM {own_database.name}.queues WHERE name = 'rr'"
            )
        finally:
            await conn.close()
        assert mode == "round_robin"
    finally:
        await backend.close()


async def test_a_write_to_a_database_still_read_only_is_refused_after_one_more_try(
    own_database: PgSchema,
) -> None:
    # The second try is on a new session, which a database still read-only refuses too:
    # the caller hears of it, on the pinned connection and through the pool alike.
    _alter(own_database.dsn, "ALTER DATABASE {db} SET default_transaction_read_only = on")
    backend = PostgresBackend(own_database.dsn, schema=own_database.name, max_pool_size=2)
    try:
        await backend.open()
        with pytest.raises(ReadOnlyDatabaseError):
            await backend.enqueue(_args())
        with pytest.raises(ReadOnlyDatabaseError):
            await backend.configure_queue(QueueConfig(queue="rr", mode="round_robin"))
    finally:
        _alter(own_database.dsn, "ALTER DATABASE {db} RESET default_transaction_read_only")
        await backend.close()
