"""The connections of the enqueue path: a pinned one for one-job enqueues, and session
resets only for connections lent to caller code."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from typing import Any
from uuid import uuid4

import asyncpg
import psycopg
import pytest

from taskq import EnqueueArgs, TaskQ, actor
from taskq.errors import MaxPendingExceededError
from taskq.models import JobFilter, SuccessWrite
from taskq_postgres import (
    BackendUnavailableError,
    PostgresBackend,
    TransactionAbortedError,
    _bounded,
)
from taskq_testing.postgres import PgSchema

pytestmark = pytest.mark.postgres

LEASE = timedelta(minutes=1)


@pytest.fixture
async def backend(pg_pooled_schema: PgSchema) -> AsyncIterator[PostgresBackend]:
    backend = PostgresBackend(
        pg_pooled_schema.dsn, schema=pg_pooled_schema.name, min_pool_size=1, max_pool_size=3
    )
    await backend.open()
    yield backend
    await backend.close()


async def test_a_lent_connection_is_reset_when_it_comes_back(backend: PostgresBackend) -> None:
    async with backend.connection() as conn:
        pid = conn.get_server_pid()
        await conn.execute("SET statement_timeout = '1234ms'")
        await conn.execute("SELECT pg_advisory_lock(4242)")
    async with backend.connection() as conn:
        assert conn.get_server_pid() == pid  # the pool is LIFO: the same session
        assert await conn.fetchval("SHOW statement_timeout") == "0"
        held = await conn.fetchval(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = $1", pid
        )
        assert held == 0


async def test_concurrent_enqueues_share_the_pinned_connection_and_the_pool(
    backend: PostgresBackend,
) -> None:
    rows = await asyncio.gather(*(backend.enqueue(EnqueueArgs(actor="a")) for _ in range(12)))
    assert len({row.id for row in rows}) == 12
    for row in rows:
        assert await backend.get(row.id) == row


async def test_a_one_job_enqueue_runs_prepared_and_survives_its_table_changing(
    backend: PostgresBackend, pg_pooled_schema: PgSchema
) -> None:
    # The pinned connection keeps the one-job statement prepared. A migration that
    # changes a column it returns makes the server refuse that plan ("cached plan must
    # not change result type"): the enqueue then runs by its text, and the statement is
    # prepared anew for the next one.
    first = await backend.enqueue(EnqueueArgs(actor="a"))
    pinned = backend._pinned
    assert pinned is not None and len(pinned._statements) == 1
    conn = await asyncpg.connect(pg_pooled_schema.dsn)
    try:
        await conn.execute(f"ALTER TABLE {pg_pooled_schema.name}.jobs ALTER attempt TYPE bigint")
    finally:
        await conn.close()
    second = await backend.enqueue(EnqueueArgs(actor="a"))
    third = await backend.enqueue(EnqueueArgs(actor="a"))
    for row in (first, second, third):
        assert await backend.get(row.id) == row
    assert len(pinned._statements) == 1


async def test_a_prepared_enqueue_whose_rows_asyncpg_cannot_decode_is_not_run_again(
    backend: PostgresBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    # asyncpg raises OutdatedSchemaCacheError while decoding the rows of a statement
    # that ran (a composite type changed): the INSERT is committed, and running it again
    # by its text failed on its own job's id, saying the id was taken.
    from asyncpg.prepared_stmt import PreparedStatement

    await backend.enqueue(EnqueueArgs(actor="a"))  # prepares the statement
    original = PreparedStatement.fetchrow

    async def ran_then_undecodable(self: PreparedStatement, *args: Any, **kw: Any) -> Any:
        monkeypatch.setattr(PreparedStatement, "fetchrow", original)
        await original(self, *args, **kw)
        raise asyncpg.OutdatedSchemaCacheError("type changed")

    monkeypatch.setattr(PreparedStatement, "fetchrow", ran_then_undecodable)
    args = EnqueueArgs(actor="a")
    with pytest.raises(asyncpg.OutdatedSchemaCacheError):
        await backend.enqueue(args)
    assert (await backend.get(args.id)) is not None  # it ran, once
    assert len(await backend.list_jobs(JobFilter())) == 2
    await backend.enqueue(EnqueueArgs(actor="a"))  # prepared anew


async def test_the_row_a_one_job_enqueue_returns_sets_every_field(
    backend: PostgresBackend,
) -> None:
    # fresh_row copies a template of every field and sets the ones without a plain
    # default: a field added to JobRow and not set there would read UNSET.
    from taskq_postgres._enqueue import UNSET

    plain = await backend.enqueue(EnqueueArgs(actor="a"))
    full = await backend.enqueue(
        EnqueueArgs(actor="a", identity_key="k", metadata={"m": 1}, tags=["t"], timeout=5)
    )
    for row in (plain, full):
        assert UNSET not in vars(row).values()
        assert await backend.get(row.id) == row


async def test_a_cancelled_enqueue_leaves_the_pinned_connection_usable(
    backend: PostgresBackend,
) -> None:
    await backend.enqueue(EnqueueArgs(actor="a"))  # pins a connection
    task = asyncio.create_task(backend.enqueue(EnqueueArgs(actor="a")))
    await asyncio.sleep(0)  # let it send its statement
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    row = await backend.enqueue(EnqueueArgs(actor="a"))
    assert await backend.get(row.id) == row


async def test_a_failed_enqueue_leaves_the_pinned_connection_usable(
    backend: PostgresBackend,
) -> None:
    first = await backend.enqueue(EnqueueArgs(actor="a"))
    with pytest.raises(ValueError, match="already exists"):
        await backend.enqueue(EnqueueArgs(id=first.id, actor="a"))
    row = await backend.enqueue(EnqueueArgs(actor="a"))
    assert await backend.get(row.id) == row


async def test_close_returns_the_pinned_connection_and_reopen_pins_anew(
    backend: PostgresBackend,
) -> None:
    await backend.enqueue(EnqueueArgs(actor="a"))
    await asyncio.wait_for(backend.close(), 10)  # would wait forever on a held connection
    await backend.open()
    row = await backend.enqueue(EnqueueArgs(actor="a"))
    assert await backend.get(row.id) == row


async def test_a_credential_reload_replaces_the_pinned_connection(
    backend: PostgresBackend,
) -> None:
    async def pinned_pid() -> int:
        async with backend.connection() as conn:
            # The pinned session is the one that inserted the job's row last.
            return int(
                await conn.fetchval(
                    "SELECT pid FROM pg_stat_activity WHERE application_name = $1 "
                    "AND pid <> pg_backend_pid() AND query LIKE '%INSERT INTO%'",
                    f"taskq-pool/{backend.instance_id}",
                )
            )

    await backend.enqueue(EnqueueArgs(actor="a"))
    before = await pinned_pid()
    await backend.reload_credentials()
    await backend.enqueue(EnqueueArgs(actor="a"))
    assert await pinned_pid() != before


async def test_the_first_enqueue_after_the_pinned_connection_closed_succeeds(
    backend: PostgresBackend,
) -> None:
    # A server restart or an idle-session timeout ends the pinned session between two
    # enqueues; the pool takes the closed connection back, and the next enqueue failed.
    await backend.enqueue(EnqueueArgs(actor="a"))
    async with backend.connection() as conn:
        ended = await conn.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE application_name = $1 AND pid <> pg_backend_pid() "
            "AND query LIKE '%INSERT INTO%'",
            f"taskq-pool/{backend.instance_id}",
        )
    assert ended == 1
    await asyncio.sleep(0.2)  # its end reaches the client
    await backend.enqueue(EnqueueArgs(actor="a"))


def _end_sessions_unread(backend: PostgresBackend) -> int:
    """End every session of ``backend`` as a restart does, blocking the event loop until
    the server has: the server's goodbye and the end of each stream wait unread in the
    client's sockets, as they do for a call made in the loop turns before asyncpg reads
    them."""
    with psycopg.connect(backend.dsn, autocommit=True) as admin:
        pids = [
            pid
            for (pid,) in admin.execute(
                "SELECT pid FROM pg_stat_activity WHERE application_name LIKE %s",
                (f"%/{backend.instance_id}",),
            )
        ]
        admin.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) pid", (pids,))
        while admin.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", (pids,)
        ).fetchone() != (0,):
            time.sleep(0.01)  # blocking: the event loop must not run meanwhile
    return len(pids)


async def _enqueue(backend: PostgresBackend) -> None:
    row = await backend.enqueue(EnqueueArgs(actor="a"))  # on the pinned connection
    assert await backend.get(row.id) == row


async def _read(backend: PostgresBackend) -> None:
    assert await backend.list_jobs(JobFilter()) != []  # on a pooled one


async def _transaction(backend: PostgresBackend) -> None:
    # A singleton's checks and insert: a transaction on a pooled connection.
    await backend.enqueue(EnqueueArgs(actor="a", singleton=True, identity_key=str(uuid4())))


async def _dispatch(backend: PostgresBackend) -> None:
    assert await backend.dispatch_batch(uuid4(), ["default"], 1, LEASE) != []


async def _success(backend: PostgresBackend) -> None:
    worker = uuid4()
    (job,) = await backend.dispatch_batch(worker, ["default"], 1, LEASE)
    write = SuccessWrite(job_id=job.id, attempt=job.attempt)
    assert await backend.mark_succeeded_many(worker, [write]) == [True]


@pytest.mark.parametrize("command_timeout", [None, timedelta(seconds=30)])
@pytest.mark.parametrize("call", [_enqueue, _read, _transaction, _dispatch, _success])
async def test_the_first_call_after_a_restart_asyncpg_has_not_seen_yet_succeeds(
    pg_pooled_schema: PgSchema,
    command_timeout: timedelta | None,
    call: Callable[[PostgresBackend], Awaitable[None]],
) -> None:
    # Told before its statement is sent, a call goes on a new connection; once sent, it
    # fails (nothing tells whether it ran: see the next test).
    backend = PostgresBackend(
        pg_pooled_schema.dsn,
        schema=pg_pooled_schema.name,
        max_pool_size=5,  # pins a worker's dispatch and success connections too
        command_timeout=command_timeout,
    )
    await backend.open()
    try:
        await backend.enqueue_batch([EnqueueArgs(actor="a") for _ in range(3)])
        for warm_up in (_success, _enqueue, _read, _transaction):
            await warm_up(backend)
        assert _end_sessions_unread(backend) >= 4  # the pinned ones and a pooled one
        await call(backend)
    finally:
        await backend.close()


def _goodbye_read(conn: Any) -> None:
    """What asyncpg does when it reads the goodbye of a session the server ends (a
    restart, pg_terminate_backend) before the end of the stream arrives: it takes no
    statement on ``conn`` (a raw asyncpg connection) from then on, refusing each unsent
    ('cannot switch to state ...'). Fed to its protocol here, as the end of a real session
    may come a moment later or at once."""
    fields = b"SFATAL\0VFATAL\0C57P01\0Mterminating connection due to administrator command\0\0"
    conn._protocol.data_received(b"E" + (len(fields) + 4).to_bytes(4, "big") + fields)


async def _idle_pooled(backend: PostgresBackend, n: int) -> list[Any]:
    """``n`` raw connections of ``backend``'s pool, each made and handed back (idle)."""
    async with contextlib.AsyncExitStack() as stack:
        # Any: a proxy's connection (asyncpg's own attribute) is not in its stubs.
        lent: list[Any] = [await stack.enter_async_context(backend.connection()) for _ in range(n)]
        raw = [conn._con for conn in lent]
    return raw


async def _count(backend: PostgresBackend) -> int:
    async with backend.connection() as conn:
        return int(await conn.fetchval(f"SELECT count(*) FROM {backend.schema}.jobs"))


@pytest.mark.parametrize("command_timeout", [None, timedelta(seconds=30)])
async def test_an_enqueue_refused_unsent_as_its_pinned_session_ends_runs_once_on_another(
    pg_pooled_schema: PgSchema, command_timeout: timedelta | None
) -> None:
    # Between two enqueues the server ended the pinned session, and asyncpg read its
    # goodbye before the end of the stream, which the check before each enqueue looks
    # for: the next enqueue failed with InternalClientError though nothing was sent.
    backend = PostgresBackend(
        pg_pooled_schema.dsn, schema=pg_pooled_schema.name, command_timeout=command_timeout
    )
    await backend.open()
    try:
        await backend.enqueue(EnqueueArgs(actor="a"))  # pins
        assert backend._pinned is not None and backend._pinned._conn is not None
        pooled = await _idle_pooled(backend, 2)
        proxy: Any = backend._pinned._conn  # its connection is not in asyncpg's stubs
        # A restart ends them all: the pooled ones the enqueue goes on next as well.
        for raw in [proxy._con, *pooled]:
            _goodbye_read(raw)
        row = await backend.enqueue(EnqueueArgs(actor="a"))
        assert await backend.get(row.id) == row
        assert await _count(backend) == 2
    finally:
        await backend.close()


async def test_a_read_refused_unsent_as_its_pooled_session_ends_runs_on_another(
    backend: PostgresBackend,
) -> None:
    row = await backend.enqueue(EnqueueArgs(actor="a"))  # pins one of the three
    for raw in await _idle_pooled(backend, 2):
        _goodbye_read(raw)
    assert await backend.get(row.id) == row


async def test_a_release_while_a_refused_enqueue_gets_another_connection_hands_it_back(
    backend: PostgresBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    # release() (the backend's close, a credential reload) came while the enqueue got a
    # connection for the one refusing it unsent: the replacement was pinned all the
    # same, never handed back, and the pool's close waited for it.
    await backend.enqueue(EnqueueArgs(actor="a"))  # pins
    pinned = backend._pinned
    assert pinned is not None and pinned._conn is not None
    proxy: Any = pinned._conn  # its connection is not in asyncpg's stubs
    _goodbye_read(proxy._con)
    acquire = _bounded._acquire

    async def released_meanwhile(pool: Any, deadline: float | None) -> Any:
        await pinned.release()
        return await acquire(pool, deadline)

    monkeypatch.setattr(_bounded, "_acquire", released_meanwhile)
    row = await backend.enqueue(EnqueueArgs(actor="a"))
    assert pinned._conn is None
    pool = backend._bounded.pool
    assert pool.get_idle_size() == pool.get_size()
    monkeypatch.undo()
    assert await backend.get(row.id) == row


async def test_a_release_while_an_enqueue_gets_its_first_connection_hands_it_back(
    backend: PostgresBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As above, for the connection the first enqueue pins.
    pinned = backend._pinned
    assert pinned is not None and pinned._conn is None
    acquire = _bounded._acquire

    async def released_meanwhile(pool: Any, deadline: float | None) -> Any:
        await pinned.release()
        return await acquire(pool, deadline)

    monkeypatch.setattr(_bounded, "_acquire", released_meanwhile)
    await backend.enqueue(EnqueueArgs(actor="a"))
    assert pinned._conn is None
    assert backend._bounded is not None
    pool = backend._bounded.pool
    assert pool.get_idle_size() == pool.get_size()


async def test_a_statement_sent_as_its_session_ends_fails_and_is_not_sent_again(
    backend: PostgresBackend,
) -> None:
    # Its session ended while it waited for a lock (it did not run); had it waited for
    # its commit, it would have run: the error says nothing of which, so no retry.
    await backend.enqueue(EnqueueArgs(actor="a"))  # pins
    async with backend.connection() as admin, admin.transaction():
        await admin.execute(f"LOCK TABLE {backend.schema}.jobs")
        enqueue = asyncio.create_task(backend.enqueue(EnqueueArgs(actor="a")))
        for _ in range(500):  # until its INSERT waits for the lock
            pid = await admin.fetchval(
                "SELECT pid FROM pg_stat_activity WHERE application_name = $1 "
                "AND wait_event_type = 'Lock'",
                f"taskq-pool/{backend.instance_id}",
            )
            if pid is not None:
                break
            await asyncio.sleep(0.01)
        assert pid is not None
        await admin.execute("SELECT pg_terminate_backend($1)", pid)
        with pytest.raises(asyncpg.ConnectionDoesNotExistError):
            await enqueue
    async with backend.connection() as conn:
        assert await conn.fetchval(f"SELECT count(*) FROM {backend.schema}.jobs") == 1


async def test_a_pool_of_one_connection_is_not_pinned(pg_pooled_schema: PgSchema) -> None:
    # Pinned, its only connection would leave nothing for the trailing wake or a caller.
    backend = PostgresBackend(
        pg_pooled_schema.dsn, schema=pg_pooled_schema.name, min_pool_size=1, max_pool_size=1
    )
    await backend.open()
    try:
        async with asyncio.timeout(10):
            for _ in range(3):
                await backend.enqueue(EnqueueArgs(actor="a"))  # some coalesced: a flush follows
            async with backend.connection() as conn:
                count = await conn.fetchval(f"SELECT count(*) FROM {backend.schema}.jobs")
                assert count == 3
    finally:
        await asyncio.wait_for(backend.close(), 10)


@actor(name="conn.capped", max_pending=1)
async def capped(payload: dict[str, Any]) -> None:
    return None


async def test_an_idempotent_retry_at_max_pending_in_a_transaction_gets_its_job_back(
    pg_pooled_schema: PgSchema,
) -> None:
    # As enqueue and the sync client do: enqueue_with_conn raised MaxPendingExceededError.
    async with TaskQ(pg_pooled_schema.dsn, schema=pg_pooled_schema.name, actors=[capped]) as tq:
        first = await tq.client.enqueue(capped, {}, idempotency_key="order-7")
        conn = await asyncpg.connect(pg_pooled_schema.dsn)
        try:
            async with conn.transaction():
                again = await tq.client.enqueue_with_conn(
                    conn, capped, {}, idempotency_key="order-7"
                )
                with pytest.raises(MaxPendingExceededError):
                    await tq.client.enqueue_with_conn(conn, capped, {}, idempotency_key="order-8")
        finally:
            await conn.close()
        assert again == first
        assert [r.id for r in await tq.client.list_jobs()] == [first.id]


@pytest.mark.parametrize("call", ["enqueue", "singleton", "batch", "copy"])
async def test_a_callers_transaction_aborted_by_an_earlier_error_is_named_as_on_psycopg(
    backend: PostgresBackend, call: str
) -> None:
    # As SyncJobsClient says it: a raw InFailedSQLTransactionError said nothing of what to do.
    args = EnqueueArgs(actor="a", identity_key="i", singleton=call == "singleton")
    enqueue: Callable[[Any], Awaitable[object]] = {
        "enqueue": lambda c: backend.enqueue_with_conn(c, args),
        "singleton": lambda c: backend.enqueue_with_conn(c, args),
        "batch": lambda c: backend.enqueue_batch([args], connection=c),
        "copy": lambda c: backend.enqueue_batch_fast([args], connection=c),
    }[call]
    async with backend.connection() as conn:
        transaction = conn.transaction()
        await transaction.start()
        with pytest.raises(asyncpg.DivisionByZeroError):
            await conn.execute("SELECT 1/0")
        with pytest.raises(TransactionAbortedError, match="nothing was enqueued; roll it back"):
            await enqueue(conn)
        await transaction.rollback()  # as told: then it works
        async with conn.transaction():
            await enqueue(conn)
    assert len(await backend.list_jobs(JobFilter())) == 1


@pytest.mark.parametrize("call", ["enqueue", "batch", "copy"])
async def test_a_callers_closed_connection_is_named_as_on_psycopg(
    backend: PostgresBackend, pg_pooled_schema: PgSchema, call: str
) -> None:
    # As SyncJobsClient says it: asyncpg's InterfaceError said nothing of the enqueue.
    args = EnqueueArgs(actor="a")
    enqueue: Callable[[Any], Awaitable[object]] = {
        "enqueue": lambda c: backend.enqueue_with_conn(c, args),
        "batch": lambda c: backend.enqueue_batch([args], connection=c),
        "copy": lambda c: backend.enqueue_batch_fast([args], connection=c),
    }[call]
    conn = await asyncpg.connect(pg_pooled_schema.dsn)
    await conn.close()
    with pytest.raises(BackendUnavailableError, match="the enqueue was given is closed"):
        await enqueue(conn)
    assert await backend.list_jobs(JobFilter()) == []
