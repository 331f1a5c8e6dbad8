"""``direct_dsn``: the sessions that must stay one server session (the leader's lock,
LISTEN, migrations) reach the server itself when ``dsn`` is a transaction-mode pooler."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit
from uuid import uuid4

import asyncpg
import pytest
import pytest_asyncio
from structlog.testing import capture_logs

from taskq.errors import ConfigurationError
from taskq.settings import WorkerSettings
from taskq_postgres import BackendUnavailableError, PostgresBackend
from taskq_postgres._leader import LeaderStatements, PostgresLeaderElector
from taskq_testing.postgres import PgSchema

pytestmark = pytest.mark.postgres

LEASE = timedelta(seconds=5)


def _as_user(dsn: str, user: str) -> str:
    """``dsn`` with ``user`` logging in (both roles are on the test server)."""
    parts = urlsplit(dsn)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}@{host}"))


@pytest_asyncio.fixture
async def watcher(pg_schema: PgSchema) -> AsyncIterator[asyncpg.Connection[Any]]:
    conn: asyncpg.Connection[Any] = await asyncpg.connect(pg_schema.dsn)
    yield conn
    await conn.close()


async def _users(conn: asyncpg.Connection[Any], instance: str) -> dict[str, set[str]]:
    rows = await conn.fetch(
        "SELECT split_part(application_name, '/', 1) AS role, usename FROM pg_stat_activity "
        "WHERE application_name LIKE $1",
        f"%/{instance}",
    )
    found: dict[str, set[str]] = {}
    for row in rows:
        found.setdefault(row["role"], set()).add(row["usename"])
    return found


async def test_the_leader_and_listen_sessions_go_to_the_direct_dsn_the_pool_to_the_dsn(
    pg_schema: PgSchema, watcher: asyncpg.Connection[Any]
) -> None:
    instance = f"direct-{uuid4().hex[:8]}"
    backend = PostgresBackend(
        _as_user(pg_schema.dsn, "postgres"),
        direct_dsn=_as_user(pg_schema.dsn, "root"),
        schema=pg_schema.name,
        instance_id=instance,
    )
    await backend.open()
    elector = backend.leader_elector(uuid4(), lease=LEASE)
    try:
        assert await elector.try_acquire()
        async with backend.subscribe_wake():
            assert await _users(watcher, instance) == {
                "taskq-pool": {"postgres"},
                "taskq-notify": {"root"},
                "taskq-leader": {"root"},
            }
    finally:
        await elector.release()
        await backend.close()


async def test_without_a_direct_dsn_every_session_goes_to_the_dsn(
    pg_schema: PgSchema, watcher: asyncpg.Connection[Any]
) -> None:
    instance = f"direct-{uuid4().hex[:8]}"
    backend = PostgresBackend(
        _as_user(pg_schema.dsn, "root"), schema=pg_schema.name, instance_id=instance
    )
    assert backend.direct_dsn == backend.dsn
    await backend.open()
    elector = backend.leader_elector(uuid4(), lease=LEASE)
    try:
        assert await elector.try_acquire()
        async with backend.subscribe_wake():
            users = await _users(watcher, instance)
        assert set(users) == {"taskq-pool", "taskq-notify", "taskq-leader"}
        assert set().union(*users.values()) == {"root"}
    finally:
        await elector.release()
        await backend.close()


async def test_migrations_connect_to_the_direct_dsn(pg_schema: PgSchema) -> None:
    # Nothing listens on port 1: a migration that used the pooler's DSN would pass.
    unreachable = urlunsplit(urlsplit(pg_schema.dsn)._replace(netloc="postgres@127.0.0.1:1"))
    backend = PostgresBackend(
        pg_schema.dsn,
        direct_dsn=unreachable,
        schema=pg_schema.name,
        connect_timeout=timedelta(seconds=2),
    )
    with pytest.raises(BackendUnavailableError, match="127.0.0.1:1"):
        await backend.migrate()
    assert await PostgresBackend(pg_schema.dsn, schema=pg_schema.name).migrate() == []


def test_a_bad_direct_dsn_is_refused_up_front(pg_schema: PgSchema) -> None:
    with pytest.raises(ConfigurationError, match="invalid DSN"):
        PostgresBackend(pg_schema.dsn, direct_dsn="mysql://x@h/db", schema=pg_schema.name)


def test_the_worker_setting_reaches_the_backend(pg_schema: PgSchema) -> None:
    direct = _as_user(pg_schema.dsn, "root")
    options = WorkerSettings.backend_options_from_env({"TASKQ_DIRECT_DSN": direct})
    assert options == {"direct_dsn": direct}
    backend = PostgresBackend.from_url(pg_schema.dsn, schema=pg_schema.name, **options)
    assert backend.direct_dsn == direct


class _TransactionPooler:
    """What a transaction-mode pooler does to a client's session: each statement runs on
    whichever server connection is free, here each in turn."""

    def __init__(self, servers: list[asyncpg.Connection[Any]]) -> None:
        self._servers = servers
        self._turn = 0

    def _next(self) -> asyncpg.Connection[Any]:
        self._turn += 1
        return self._servers[self._turn % len(self._servers)]

    async def fetchrow(self, sql: str, *args: Any, **options: Any) -> Any:
        return await self._next().fetchrow(sql, *args, **options)

    async def execute(self, sql: str, *args: Any, **options: Any) -> Any:
        return await self._next().execute(sql, *args, **options)

    def is_closed(self) -> bool:
        return False

    async def close(self) -> None:
        return None

    def terminate(self) -> None:
        return None


async def test_a_leader_behind_a_transaction_pooler_says_so_and_does_not_lead(
    pg_schema: PgSchema,
) -> None:
    servers = [await asyncpg.connect(pg_schema.dsn) for _ in range(3)]
    # The session the renewal reaches holds an advisory lock of its own (another
    # client's): the renewal's "a lock is held here" says yes, the pid says no.
    await servers[0].execute("SELECT pg_advisory_lock(42)")
    pooler = _TransactionPooler(servers)

    async def connect() -> Any:
        return pooler

    elector = PostgresLeaderElector(
        connect, LeaderStatements(pg_schema.name), uuid4(), command_timeout=LEASE
    )
    try:
        assert await elector.try_acquire()  # the lock, on one server session
        with capture_logs() as logs:
            # The renewal reaches the other: that session holds no lock, and this
            # candidate's lock stays where the pooler left it.
            assert not await elector.try_acquire()
        [moved] = [e for e in logs if e["event"] == "taskq.leader-session-moved"]
        assert moved["log_level"] == "error"
        assert "direct_dsn" in moved["hint"]
    finally:
        for server in servers:
            await server.close()


def test_taskq_migrate_takes_the_direct_dsn_over_the_dsn(pg_schema: PgSchema) -> None:
    # Its advisory lock is a session's: behind a pooler, the server's own address.
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("TASKQ_")},
        "TASKQ_DSN": "postgresql://postgres@127.0.0.1:1/nowhere",
        "TASKQ_DIRECT_DSN": pg_schema.dsn,
        "TASKQ_SCHEMA": pg_schema.name,
    }
    done = subprocess.run(
        [str(Path(sys.executable).with_name("taskq")), "migrate"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(
    "spelt",
    [
        "postgres://taskq@db.internal/app",
        "postgresql://taskq@DB.Internal:5432/app",
        "postgresql://taskq@db.internal:5432/app?sslmode=prefer&application_name=x",
    ],
)
def test_the_same_address_spelt_otherwise_is_not_a_pooler(spelt: str) -> None:
    # Taken for a pooler's, the pool's sessions lost their settings and statement cache.
    dsn = "postgresql://taskq@db.internal/app"
    if "sslmode" in spelt:
        dsn += "?application_name=x&sslmode=prefer"
    assert not PostgresBackend(dsn, direct_dsn=spelt).behind_pooler
    assert PostgresBackend(dsn, direct_dsn="postgresql://taskq@db.internal:6432/app").behind_pooler


def test_a_connect_timeout_in_one_dsn_alone_is_not_a_pooler() -> None:
    # A DSN's connect_timeout, read since today, made the same server a pooler's: the
    # pool's sessions went without their settings (jit on, no idle limit) and statement
    # cache, where the fleet's direct DSN left it out.
    dsn = "postgresql://taskq@db.internal/app"
    waiting = f"{dsn}?connect_timeout=10"
    assert not PostgresBackend(waiting, direct_dsn=dsn).behind_pooler
    assert not PostgresBackend(dsn, direct_dsn=f"{dsn}?connect%5Ftimeout=3").behind_pooler
    pooler = "postgresql://taskq@db.internal:6432/app?connect_timeout=10"
    assert PostgresBackend(pooler, direct_dsn=waiting).behind_pooler


def test_the_sync_client_takes_the_fleets_direct_dsn_as_the_backend_does(
    pg_schema: PgSchema, monkeypatch: pytest.MonkeyPatch
) -> None:
    from taskq_postgres import SyncJobsClient

    # The fleet's direct address spelt otherwise is the client's own: no pooler.
    monkeypatch.setenv("TASKQ_DIRECT_DSN", pg_schema.dsn.replace("postgresql://", "postgres://"))
    with SyncJobsClient(pg_schema.dsn, actors=[], schema=pg_schema.name) as client:
        assert not client._behind_pooler
    other = urlunsplit(urlsplit(pg_schema.dsn)._replace(netloc="postgres@127.0.0.1:6432"))
    monkeypatch.setenv("TASKQ_DIRECT_DSN", other)
    with SyncJobsClient(pg_schema.dsn, actors=[], schema=pg_schema.name) as client:
        assert client._behind_pooler
