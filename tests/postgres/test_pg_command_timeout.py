"""The worker's dispatcher_command_timeout bounds the backend's calls, end to end."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit
from uuid import uuid4

import asyncpg
import pytest

from taskq import EnqueueArgs
from taskq_postgres import PostgresBackend
from taskq_testing.faults import TcpProxy
from taskq_testing.postgres import PgSchema

pytestmark = pytest.mark.postgres


async def test_a_stalled_statement_times_out_and_the_pool_stays_usable(
    pg_pooled_schema: PgSchema,
) -> None:
    backend = PostgresBackend(
        pg_pooled_schema.dsn,
        schema=pg_pooled_schema.name,
        command_timeout=timedelta(milliseconds=300),
    )
    await backend.open()
    try:
        async with backend.connection() as conn:
            with pytest.raises(TimeoutError):
                await conn.execute("SELECT pg_sleep(5)")
        assert await backend.count_active_jobs(["default"]) == 0
    finally:
        await backend.close()


async def _ends_within(call: Awaitable[Any], seconds: float) -> BaseException | None:
    """What ``call`` raised, asserting it ended within ``seconds``."""
    task = asyncio.ensure_future(call)
    done, _ = await asyncio.wait({task}, timeout=seconds)
    if not done:
        task.cancel()
        raise AssertionError(f"still running after {seconds}s")
    return task.exception()


_BUDGET = 1.5  # seconds; the waits the deadline cuts short were 2 x _BUDGET and 30 s


@asynccontextmanager
async def _through_proxy(
    schema: PgSchema, **options: Any
) -> AsyncIterator[tuple[TcpProxy, PostgresBackend]]:
    """A proxy to the server and an opened backend of ``schema`` connecting through it,
    each call bounded by ``_BUDGET`` (a connect by 30 s: the bound cuts a reconnect
    short too); the backend is closed after."""
    with TcpProxy(urlsplit(schema.dsn).port or 5432) as proxy:
        backend = PostgresBackend(
            proxy.through(schema.dsn),
            schema=schema.name,
            command_timeout=timedelta(seconds=_BUDGET),
            connect_timeout=timedelta(seconds=30),
            **options,
        )
        await backend.open()
        try:
            yield proxy, backend
        finally:
            await backend.close()


@pytest.mark.parametrize("max_pool_size", [1, 10], ids=["pool", "pinned"])
async def test_over_a_stalled_network_each_call_ends_within_the_command_timeout(
    pg_pooled_schema: PgSchema, max_pool_size: int
) -> None:
    # A black hole, not a cut: without the call's own deadline a statement that timed
    # out waited as long again for its cancel request before the pool took its
    # connection back, and the reconnect that follows waited for connect_timeout.
    async with _through_proxy(pg_pooled_schema, max_pool_size=max_pool_size) as (proxy, backend):

        def dispatch() -> Awaitable[Any]:
            return backend.dispatch_batch(uuid4(), ["default"], 1, timedelta(seconds=30))

        await dispatch()
        proxy.stall()
        for call, bound in (
            (dispatch(), _BUDGET + 1),  # on the open connection
            (backend.count_active_jobs(["default"]), 10),  # on a new one
            (dispatch(), 10),
        ):
            error = await _ends_within(call, bound)
            assert isinstance(error, TimeoutError), repr(error)
        proxy.restore()
        assert await backend.count_active_jobs(["default"]) == 0


async def test_over_a_stalled_network_a_leader_confirmation_ends_within_the_command_timeout(
    pg_pooled_schema: PgSchema,
) -> None:
    async with _through_proxy(pg_pooled_schema) as (proxy, backend):
        elector = backend.leader_elector(uuid4(), lease=timedelta(seconds=60))
        try:
            assert await elector.try_acquire()
            proxy.stall()
            # Half the budget each: the election loop may wait for one in flight first.
            for bound in (_BUDGET / 2 + 0.5, 10):  # the renewal, then the reconnect
                error = await _ends_within(elector.try_acquire(), bound)
                assert isinstance(error, TimeoutError), repr(error)
            proxy.restore()
            assert await elector.try_acquire()
        finally:
            await elector.release()


async def test_over_a_stalled_network_a_one_job_enqueue_ends_within_the_command_timeout(
    pg_pooled_schema: PgSchema,
) -> None:
    # The pinned connection's prepared statement: its own deadline, neither sooner nor
    # later, and the next enqueue gets a connection that works.
    async with _through_proxy(pg_pooled_schema) as (proxy, backend):
        await backend.enqueue(EnqueueArgs(actor="a"))  # pinned, and prepared
        proxy.stall()
        stalled = time.monotonic()
        error = await _ends_within(backend.enqueue(EnqueueArgs(actor="a")), _BUDGET + 1)
        assert isinstance(error, TimeoutError), repr(error)
        assert time.monotonic() - stalled > _BUDGET * 0.9
        proxy.restore()
        await backend.enqueue(EnqueueArgs(actor="a"))


async def test_a_one_job_enqueue_past_the_command_timeout_is_not_written_later(
    pg_pooled_schema: PgSchema,
) -> None:
    # Timed out on a live server (waiting on a lock), the statement is cancelled there:
    # closing only the client's socket let it commit once the lock was free, after its
    # caller had the TimeoutError (and a retry under a new id made the job twice).
    backend = PostgresBackend(
        pg_pooled_schema.dsn, schema=pg_pooled_schema.name, command_timeout=timedelta(seconds=1)
    )
    await backend.open()
    locker = await asyncpg.connect(pg_pooled_schema.dsn)
    try:
        await backend.enqueue(EnqueueArgs(actor="a"))  # pinned, and prepared
        args = EnqueueArgs(actor="a")
        async with locker.transaction():
            await locker.execute(f"LOCK TABLE {pg_pooled_schema.name}.jobs IN EXCLUSIVE MODE")
            with pytest.raises(TimeoutError):
                await backend.enqueue(args)
        await asyncio.sleep(0.5)  # time for a statement still waiting to commit
        assert await backend.get(args.id) is None
    finally:
        await locker.close()
        await backend.close()


@pytest.mark.parametrize("command_timeout", [timedelta(seconds=1), None], ids=["timeout", "none"])
async def test_closing_over_a_stalled_network_ends_and_raises_nothing(
    pg_pooled_schema: PgSchema, command_timeout: timedelta | None
) -> None:
    # It raised TimeoutError (a worker that had stopped cleanly then exited 1), or with
    # no command_timeout waited forever.
    with TcpProxy(urlsplit(pg_pooled_schema.dsn).port or 5432) as proxy:
        backend = PostgresBackend(
            proxy.through(pg_pooled_schema.dsn),
            schema=pg_pooled_schema.name,
            command_timeout=command_timeout,
        )
        await backend.open()
        await backend.count_active_jobs(["default"])
        proxy.stall()
        assert await _ends_within(backend.close(), 15) is None
