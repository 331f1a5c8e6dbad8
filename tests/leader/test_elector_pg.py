"""The Postgres leader elector's traps: stacking, per-schema keys, frozen leaders."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any
from uuid import uuid4

import asyncpg
import pytest

from taskq.backend._protocol import LeaderElector, SupportsLeaderElection
from taskq_postgres import PostgresBackend
from taskq_testing.postgres import PgSchema, migrated_schema

pytestmark = pytest.mark.postgres

LEASE = timedelta(seconds=1)


@pytest.fixture
async def backend(pg_schema: PgSchema) -> AsyncIterator[PostgresBackend]:
    b = PostgresBackend(pg_schema.dsn, schema=pg_schema.name)
    await b.open()
    yield b
    await b.close()


async def _leader_row(backend: PostgresBackend) -> asyncpg.Record | None:
    async with backend.connection() as conn:
        return await conn.fetchrow(f"SELECT worker_id FROM {backend.schema}.maintenance_leader")


async def test_one_leader_renewing_never_stacks_and_stepping_down_hands_over(
    backend: PostgresBackend,
) -> None:
    assert isinstance(backend, SupportsLeaderElection)
    a_id, b_id = uuid4(), uuid4()
    a = backend.leader_elector(a_id, lease=LEASE)
    b = backend.leader_elector(b_id, lease=LEASE)
    assert isinstance(a, LeaderElector)
    assert await a.try_acquire()
    for _ in range(5):  # ticks confirm, they do not take the lock again
        assert await a.try_acquire()
        assert not await b.try_acquire()
    row = await _leader_row(backend)
    assert row is not None and row["worker_id"] == a_id
    async with backend.connection() as conn:
        held = await conn.fetchval(
            "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity s USING (pid) "
            "WHERE l.locktype = 'advisory' AND s.application_name = $1",
            f"taskq-leader/{backend.instance_id}",
        )
    assert held == 1
    await a.release()  # one release is enough: the session ends
    assert await b.try_acquire()
    row = await _leader_row(backend)
    assert row is not None and row["worker_id"] == b_id
    await b.release()


async def test_each_schema_elects_its_own_leader(
    backend: PostgresBackend, pg_database_dsn: str
) -> None:
    with migrated_schema(pg_database_dsn) as other_schema:
        other = PostgresBackend(other_schema.dsn, schema=other_schema.name)
        await other.open()
        try:
            here = backend.leader_elector(uuid4(), lease=LEASE)
            there = other.leader_elector(uuid4(), lease=LEASE)
            assert await here.try_acquire()
            assert await there.try_acquire()
            await here.release()
            await there.release()
        finally:
            await other.close()


async def test_a_leader_that_stops_renewing_loses_the_lease(backend: PostgresBackend) -> None:
    frozen = backend.leader_elector(uuid4(), lease=LEASE)
    rival = backend.leader_elector(uuid4(), lease=LEASE)
    assert await frozen.try_acquire()
    assert not await rival.try_acquire()
    # What a SIGSTOPped leader looks like to the server: a session that says nothing.
    await asyncio.sleep(LEASE.total_seconds() * 2)
    assert await rival.try_acquire()
    try:
        woke_leading = await frozen.try_acquire()
    except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError):
        woke_leading = False
    assert not woke_leading
    await rival.release()
    await frozen.release()


async def test_a_leader_whose_session_ended_is_told_it_lost_before_it_stands_again(
    backend: PostgresBackend,
) -> None:
    # A terminated session was reconnected and the lock taken again in the same call:
    # no leader-lost, and the new leadership kept the old one's reclaim grace.
    elector = backend.leader_elector(uuid4(), lease=LEASE)
    assert await elector.try_acquire()
    async with backend.connection() as conn:
        pids = await conn.fetch(
            "SELECT pid FROM pg_stat_activity WHERE application_name = $1",
            f"taskq-leader/{backend.instance_id}",
        )
        assert len(pids) == 1
        await conn.execute("SELECT pg_terminate_backend($1)", pids[0]["pid"])
    session = elector._conn  # waiting for the driver to see the end
    async with asyncio.timeout(10):
        while session is not None and not session.is_closed():  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    assert not await elector.try_acquire()
    assert await elector.try_acquire()  # stands again, a new election
    await elector.release()


class _JustEnded:
    """The leader's session as a statement finds it the moment the server ended it (a
    restart, ``pg_terminate_backend``): asyncpg has read the server's goodbye, not yet
    the end of the stream, and refuses the statement with ``InternalClientError``."""

    def __init__(self, conn: asyncpg.Connection[Any]) -> None:
        self.conn = conn

    def is_closed(self) -> bool:
        return self.conn.is_closed()

    async def execute(self, *_: object, **__: object) -> str:
        raise asyncpg.InternalClientError(
            "cannot switch to state 11; another operation (2) is in progress"
        )

    async def close(self) -> None:
        await self.conn.close()

    def terminate(self) -> None:
        self.conn.terminate()


async def test_a_leader_stepping_down_as_its_session_ends_ends_it_without_raising(
    backend: PostgresBackend,
) -> None:
    # The resign row's statement met the driver's InternalClientError (seen in a third
    # of the tries of a release right after pg_terminate_backend): release() raised it,
    # out of the worker's step-down, and its stop ended as a crash.
    leader = backend.leader_elector(uuid4(), lease=LEASE)
    rival = backend.leader_elector(uuid4(), lease=LEASE)
    assert await leader.try_acquire()
    session = leader._conn
    assert session is not None
    leader._conn = _JustEnded(session)  # type: ignore[assignment] # the driver's side of it
    await leader.release()
    assert session.is_closed()
    assert await rival.try_acquire()  # the lock went with the session
    await rival.release()
