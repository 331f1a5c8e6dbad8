"""SIGHUP credential reload: coalescing, and Postgres connections really replaced."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from taskq import TaskQ, WorkerSettings
from taskq.backend.memory import InMemoryBackend
from taskq.worker import Worker
from taskq_testing.postgres import PgSchema
from tests.apps import basic

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
# The watchdogs off: in the test's process, a trip ends the whole pytest worker.
FAST = {
    "poll_interval": "50ms",
    "heartbeat_interval": "50ms",
    "lock_lease": "1s",
    "watchdog_enabled": "false",
}


class Reloadable(InMemoryBackend):
    def __init__(self) -> None:
        super().__init__()
        self.started = 0
        self.release = asyncio.Event()

    async def reload_credentials(self) -> None:
        self.started += 1
        await self.release.wait()
        self.release.clear()


def _start_worker(env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [str(BIN / "taskq-worker"), "tests.apps.basic:tq"],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


async def _until(predicate: Any) -> None:
    async with asyncio.timeout(5):
        while not predicate():  # noqa: ASYNC110 - polling counters of the system under test
            await asyncio.sleep(0.01)


async def test_reload_requests_during_a_reload_coalesce_into_one_follow_up() -> None:
    backend = Reloadable()
    tq = TaskQ("memory://", backend=backend)
    async with tq:
        worker = Worker(tq, WorkerSettings.load(FAST, env={}))
        run = asyncio.create_task(worker.run())
        await asyncio.sleep(0.1)
        worker.reload()
        await _until(lambda: backend.started == 1)
        for _ in range(3):  # a burst while the first reload is still running
            worker.reload()
        backend.release.set()
        await _until(lambda: backend.started == 2)  # exactly one follow-up
        backend.release.set()
        await _until(lambda: worker.reloads == 2)
        await asyncio.sleep(0.2)
        assert backend.started == 2
        worker.stop()
        await asyncio.wait_for(run, 10)


class RefusedReload(InMemoryBackend):
    async def reload_credentials(self) -> None:
        from taskq.errors import ConfigurationError

        raise ConfigurationError("password authentication failed")


async def test_a_failed_reload_is_logged_and_the_worker_goes_on() -> None:
    # Only transient errors were caught: a refused login ended the reload loop, and
    # with it the worker.
    import structlog.testing

    tq = TaskQ("memory://", backend=RefusedReload(), actors=basic.tq.actors.values())
    async with tq:
        worker = Worker(tq, WorkerSettings.load(FAST, env={}))
        run = asyncio.create_task(worker.run())
        with structlog.testing.capture_logs() as logs:
            await asyncio.sleep(0.1)
            worker.reload()
            await asyncio.sleep(0.2)
            job = await tq.client.enqueue(basic.nap, {})
            await tq.client.wait_for_result(job.id, timeout=5)
        assert not run.done()
        worker.stop()
        await asyncio.wait_for(run, 10)
    failed = [e for e in logs if e["event"] == "taskq.credentials-reload-failed"]
    assert len(failed) == 1 and "password authentication failed" in failed[0]["error"]
    assert worker.reloads == 0


@pytest.mark.postgres
async def test_sighup_replaces_the_workers_postgres_connections(pg_schema: PgSchema) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKQ_")}
    env.update(
        TASKQ_DSN=pg_schema.dsn,
        TASKQ_SCHEMA=pg_schema.name,
        TASKQ_POLL_INTERVAL="100ms",
        TASKQ_HEARTBEAT_INTERVAL="100ms",
        TASKQ_LOCK_LEASE="2s",
    )
    dbname = pg_schema.dsn.rsplit("/", 1)[1]
    app = TaskQ(
        pg_schema.dsn,
        schema=pg_schema.name,
        actors=basic.tq.actors.values(),
        instance_id="testclient",
    )
    proc = _start_worker(env)

    async def worker_pids(conn: asyncpg.Connection[Any], role: str) -> set[int]:
        rows = await conn.fetch(
            "SELECT pid FROM pg_stat_activity WHERE datname = $1 AND application_name LIKE "
            "$2 AND application_name NOT LIKE '%/testclient'",
            dbname,
            f"{role}/%",
        )
        return {r["pid"] for r in rows}

    try:
        async with app:
            first = await app.client.enqueue(basic.nap, {})
            await app.client.wait_for_result(first.id, timeout=20)
            conn = await asyncpg.connect(pg_schema.dsn)
            try:
                notify_before = await worker_pids(conn, "taskq-notify")
                pool_before = await worker_pids(conn, "taskq-pool")
                assert notify_before and pool_before
                proc.send_signal(signal.SIGHUP)
                await asyncio.sleep(1.0)
                second = await app.client.enqueue(basic.nap, {})
                await app.client.wait_for_result(second.id, timeout=20)
                notify_after = await worker_pids(conn, "taskq-notify")
                pool_after = await worker_pids(conn, "taskq-pool")
            finally:
                await conn.close()
        # the LISTEN connection is replaced at once; pooled ones as they are next used
        assert notify_after and not notify_before & notify_after
        assert pool_after - pool_before
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
        assert proc.returncode == 0
        assert stderr.count('"event": "taskq.credentials-reloaded"') == 1
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


async def test_a_reload_whose_credentials_cannot_connect_keeps_the_connections_in_use(
    pg_schema: PgSchema, tmp_path: Path
) -> None:
    # The pool was expired before anything tried the new secret: with a wrong one (or
    # one written before the role's password changed) every loop failed to connect and
    # the worker ended within seconds, its running jobs left to their leases.
    from taskq.models import EnqueueArgs
    from taskq_postgres import BackendUnavailableError, PostgresBackend
    from taskq_postgres._connect import password_from_file

    secret = tmp_path / "password"
    secret.write_text("unused: the test server trusts")
    backend = PostgresBackend(
        pg_schema.dsn, schema=pg_schema.name, password=password_from_file(str(secret))
    )
    await backend.open()
    try:
        await backend.enqueue(EnqueueArgs(actor="a"))
        secret.unlink()  # the mounted secret is gone: no new connection can be made
        with pytest.raises(BackendUnavailableError, match="No such file"):
            await backend.reload_credentials()
        for _ in range(3):  # on the connections already open
            await backend.enqueue(EnqueueArgs(actor="a"))
    finally:
        await backend.close()
