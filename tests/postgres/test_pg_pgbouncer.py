"""Behind PgBouncer in transaction mode: the DSN is the pooler's, ``direct_dsn`` the
server's. The pooled connections send only what the pooler passes and keep no
statement prepared; the leader, LISTEN and migrations go to the server."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit
from uuid import uuid4

import asyncpg
import pytest
from structlog.testing import capture_logs

from taskq import JobStatus, TaskQ
from taskq.errors import ConfigurationError
from taskq_postgres import BackendUnavailableError, PostgresBackend, SyncJobsClient
from taskq_testing import run_until_idle
from taskq_testing.postgres import PgSchema
from tests.apps import basic

_PGBOUNCER = shutil.which("pgbouncer") or (
    "/usr/sbin/pgbouncer" if os.path.exists("/usr/sbin/pgbouncer") else None
)

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.skipif(
        _PGBOUNCER is None, reason="needs pgbouncer (apt-get install pgbouncer; .ci/run does)"
    ),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _as_user(dsn: str, user: str) -> str:
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(netloc=f"{user}@{parts.netloc.rpartition('@')[2]}"))


@contextmanager
def _pgbouncer(database: str, settings: str = "") -> Iterator[str]:
    """A PgBouncer in transaction mode in front of ``database`` (clients and server
    sessions as ``postgres``), with ``settings`` added; yields its DSN."""
    assert _PGBOUNCER is not None
    port = _free_port()
    # PgBouncer refuses to run as root: it then runs as postgres, which must read these.
    folder = Path(tempfile.mkdtemp(prefix="taskq-pgbouncer-"))
    folder.chmod(0o755)
    (folder / "users.txt").write_text('"postgres" ""\n')
    (folder / "pgbouncer.ini").write_text(
        f"[databases]\n{database} = host=127.0.0.1 port=5432 dbname={database} user=postgres\n"
        f"[pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\nauth_type = trust\n"
        f"auth_file = {folder / 'users.txt'}\npool_mode = transaction\n"
        f"default_pool_size = 4\nmax_client_conn = 100\nunix_socket_dir =\n{settings}"
    )
    for path in folder.iterdir():
        path.chmod(0o644)
    as_root = ["-u", "postgres"] if os.geteuid() == 0 else []
    process = subprocess.Popen(
        [_PGBOUNCER, *as_root, str(folder / "pgbouncer.ini")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    assert process.stderr is not None
                    said = process.stderr.read()
                    raise RuntimeError(f"pgbouncer did not start: {said!r}") from None
                time.sleep(0.05)
        yield f"postgresql://postgres@127.0.0.1:{port}/{database}"
    finally:
        process.terminate()
        process.wait(10)
        assert process.stderr is not None
        process.stderr.close()
        shutil.rmtree(folder)


@pytest.fixture
def pooler(pg_schema: PgSchema) -> Iterator[str]:
    """A PgBouncer in transaction mode in front of the test database; yields its DSN."""
    with _pgbouncer(urlsplit(pg_schema.dsn).path.lstrip("/")) as dsn:
        yield dsn


async def test_without_a_direct_dsn_the_pooler_refuses_and_the_error_says_what_to_do(
    pooler: str, pg_schema: PgSchema
) -> None:
    backend = PostgresBackend(pooler, schema=pg_schema.name)
    with pytest.raises(ConfigurationError, match="direct_dsn"):
        await backend.open()


async def test_a_worker_behind_a_transaction_pooler_runs_every_job(
    pooler: str, pg_schema: PgSchema
) -> None:
    # The sessions that must stay one server session log in as root, the pooler's as
    # postgres: which is which shows in pg_stat_activity.
    direct = _as_user(pg_schema.dsn, "root")
    instance = f"pgb-{uuid4().hex[:8]}"
    tq = TaskQ(
        pooler,
        schema=pg_schema.name,
        actors=basic.tq.actors.values(),
        direct_dsn=direct,
        instance_id=instance,
    )
    with capture_logs() as logs:
        await tq.backend.open()
    # Not sent through the pooler, left as the server's defaults have them: said.
    [missing] = [e for e in logs if e["event"] == "taskq.pooled-settings-missing"]
    assert missing["settings"] == ["idle_in_transaction_session_timeout", "jit"]
    assert "ALTER ROLE postgres SET jit = off" in missing["hint"]
    async with tq:
        assert isinstance(tq.backend, PostgresBackend) and tq.backend.behind_pooler
        ones = [await tq.client.enqueue(basic.nap, {"seconds": 0}) for _ in range(50)]
        batch = await tq.client.enqueue_batch([(basic.nap, {"seconds": 0})] * 200)
        copied = await tq.client.enqueue_batch_fast([(basic.nap, {"seconds": 0})] * 200)
        snoozed = await tq.client.enqueue(basic.snooze_twice, {})
        await run_until_idle(tq, concurrency=16, timeout=60)
        jobs = await tq.client.list_jobs(limit=1000)
        retried = await tq.client.get(snoozed.id)
        conn: asyncpg.Connection[Any] = await asyncpg.connect(direct)
        try:
            async with tq.backend.subscribe_wake():
                elector = tq.backend.leader_elector(uuid4(), lease=timedelta(seconds=5))
                assert await elector.try_acquire()
                users = {
                    row["role"]: row["usename"]
                    for row in await conn.fetch(
                        "SELECT split_part(application_name, '/', 1) AS role, usename "
                        "FROM pg_stat_activity WHERE application_name LIKE $1",
                        f"%/{instance}",
                    )
                }
                await elector.release()
        finally:
            await conn.close()
    assert copied == 200 and len(ones) + len(batch) == 250
    assert len(jobs) == 451 and {job.status for job in jobs} == {JobStatus.SUCCEEDED}
    assert retried is not None and retried.result == 3  # run again after each snooze
    assert users["taskq-leader"] == users["taskq-notify"] == "root"


def test_taskq_jobs_takes_the_direct_dsn_from_the_environment(
    pooler: str, pg_schema: PgSchema
) -> None:
    # `taskq jobs` opens a backend as an application built from a URL does.
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("TASKQ_")},
        "TASKQ_DSN": pooler,
        "TASKQ_DIRECT_DSN": pg_schema.dsn,
        "TASKQ_SCHEMA": pg_schema.name,
    }
    done = subprocess.run(
        [str(Path(sys.executable).with_name("taskq")), "jobs", "list", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_the_sync_client_behind_a_transaction_pooler(
    pooler: str, pg_schema: PgSchema, monkeypatch: pytest.MonkeyPatch
) -> None:
    actors = basic.tq.actors.values()
    with pytest.raises(ConfigurationError, match="behind_pooler=True"):
        SyncJobsClient(pooler, actors=actors, schema=pg_schema.name)
    # Told by the fleet's TASKQ_DIRECT_DSN, or in so many words.
    monkeypatch.setenv("TASKQ_DIRECT_DSN", pg_schema.dsn)
    for client in (
        SyncJobsClient(pooler, actors=actors, schema=pg_schema.name),
        SyncJobsClient(pooler, actors=actors, schema=pg_schema.name, behind_pooler=True),
    ):
        with client:
            # Past psycopg's threshold for preparing a statement it runs again.
            for _ in range(12):
                client.enqueue(basic.nap, {"seconds": 0})
            assert len(client.enqueue_batch([(basic.nap, {"seconds": 0})] * 20)) == 20
            assert client.enqueue_batch_fast([(basic.nap, {"seconds": 0})] * 20) == 20


async def test_a_pooler_ignoring_the_settings_sent_is_refused_too(pg_schema: PgSchema) -> None:
    # Told to ignore them, PgBouncer took the connection: the leader's lock then stayed
    # on a server connection it lent to others.
    database = urlsplit(pg_schema.dsn).path.lstrip("/")
    ignored = "ignore_startup_parameters = jit, idle_in_transaction_session_timeout\n"
    with _pgbouncer(database, ignored) as ignoring:
        backend = PostgresBackend(ignoring, schema=pg_schema.name)
        with pytest.raises(ConfigurationError, match="direct_dsn"):
            await backend.open()


async def test_a_direct_dsn_to_another_database_is_refused(
    pooler: str, pg_schema: PgSchema
) -> None:
    other = urlsplit(pg_schema.dsn)._replace(path="/postgres")
    backend = PostgresBackend(pooler, direct_dsn=urlunsplit(other), schema=pg_schema.name)
    with pytest.raises(ConfigurationError, match="another database"):
        await backend.open()
    unreachable = urlsplit(pg_schema.dsn)._replace(netloc="postgres@127.0.0.1:1")
    backend = PostgresBackend(pooler, direct_dsn=urlunsplit(unreachable), schema=pg_schema.name)
    with pytest.raises(BackendUnavailableError):  # a typo: no worker would ever lead
        await backend.open()


async def test_behind_a_pooler_the_unmigrated_hint_names_the_direct_address(
    pooler: str, pg_schema: PgSchema
) -> None:
    # It named the pooler's: `taskq migrate` through it left its lock there.
    database = urlsplit(pg_schema.dsn).path.lstrip("/")
    backend = PostgresBackend(pooler, direct_dsn=pg_schema.dsn, schema="never_migrated")
    with pytest.raises(ConfigurationError) as refused:
        await backend.open()
    assert f"127.0.0.1:5432/{database}" in str(refused.value)
    assert urlsplit(pooler).netloc not in str(refused.value)


def test_taskq_migrate_refuses_a_pooler(pooler: str) -> None:
    # The migration lock taken through the pooler stayed on a server connection it lent
    # to others, and the next migration, even to the server itself, waited for ever.
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKQ_")}
    done = subprocess.run(
        [str(Path(sys.executable).with_name("taskq")), "migrate", "--dsn", pooler, "--schema",
         "never_migrated"],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 1 and "pooler" in done.stderr, done.stderr


async def test_a_connection_lent_behind_a_pooler_leaves_the_session_in_utc(
    pooler: str, pg_schema: PgSchema
) -> None:
    # Its reset's RESET ALL dropped the UTC TaskQ connects with: the next statements ran
    # in the database's zone, where a day across a DST change is 23 or 25 hours.
    database = urlsplit(pg_schema.dsn).path.lstrip("/")
    admin: asyncpg.Connection[Any] = await asyncpg.connect(pg_schema.dsn)
    try:
        await admin.execute(f"ALTER DATABASE {database} SET TimeZone = 'America/New_York'")
        backend = PostgresBackend(
            pooler, direct_dsn=pg_schema.dsn, schema=pg_schema.name, max_pool_size=1
        )
        await backend.open()
        try:
            for _ in range(3):
                async with backend.connection() as conn:
                    assert await conn.fetchval("SHOW TimeZone") == "UTC"
        finally:
            await backend.close()
    finally:
        await admin.execute(f"ALTER DATABASE {database} RESET TimeZone")
        await admin.close()


async def test_a_login_the_pooler_refuses_is_no_outage(pooler: str, pg_schema: PgSchema) -> None:
    # PgBouncer's refusal comes as a protocol violation, a connection error: a worker's
    # start took it for an outage and waited out its whole startup wait.
    stranger = pooler.replace("postgres@", "nobody@")
    backend = PostgresBackend(stranger, direct_dsn=pg_schema.dsn, schema=pg_schema.name)
    with pytest.raises(ConfigurationError, match="refused the login"):
        await backend.open()


async def test_behind_a_pooler_taskqs_own_transactions_set_their_idle_limit(
    pooler: str, pg_schema: PgSchema
) -> None:
    # The setting sent at connect never reached the server: a transaction left idle (a
    # frozen process) held its rows from the sweeps for as long as it lived.
    backend = PostgresBackend(
        pooler,
        direct_dsn=pg_schema.dsn,
        schema=pg_schema.name,
        idle_in_transaction_session_timeout=timedelta(seconds=7),
    )
    await backend.open()
    try:
        async with backend._transaction() as tx:
            assert await tx.fetchval("SHOW idle_in_transaction_session_timeout") == "7s"
    finally:
        await backend.close()
