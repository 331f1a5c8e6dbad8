"""Running the ``taskq`` and ``taskq-worker`` console scripts as a user would."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from taskq import Backend, JobRow, TaskQ, open_backend
from taskq_testing.postgres import PgSchema
from tests.apps import basic

T = TypeVar("T")

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
APP = "tests.apps.basic:tq"
FAST_WORKER_ENV = {
    "TASKQ_POLL_INTERVAL": "100ms",
    "TASKQ_HEARTBEAT_INTERVAL": "100ms",
    "TASKQ_LOCK_LEASE": "2s",
    "TASKQ_MAINTENANCE_INTERVAL": "50ms",
}


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without any TASKQ_* setting, plus ``extra``."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("TASKQ_")}
    return {**base, **extra}


def run(script: str, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run console script ``script`` from the repository root (so ``tests.apps`` imports)."""
    return subprocess.run(
        [str(BIN / script), *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )


def error_line(result: subprocess.CompletedProcess[str]) -> str:
    """The one ``taskq: error:`` line of a command that failed with exit code 1."""
    assert result.returncode == 1, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("taskq: error: ")
    return lines[0]


@dataclass
class Cli:
    """``taskq`` pointed at one test schema through TASKQ_DSN / TASKQ_SCHEMA."""

    pg: PgSchema

    def env(self, **extra: str) -> dict[str, str]:
        return clean_env(TASKQ_DSN=self.pg.dsn, TASKQ_SCHEMA=self.pg.name, **extra)

    def taskq(self, *args: str) -> subprocess.CompletedProcess[str]:
        return run("taskq", *args, env=self.env())

    def ok(self, *args: str) -> str:
        """Stdout of a ``taskq`` command that must succeed (and stay quiet on stderr)."""
        result = self.taskq(*args)
        assert result.returncode == 0, result.stderr
        assert result.stderr == ""
        return result.stdout

    def json(self, *args: str) -> Any:
        return json.loads(self.ok(*args, "--json"))

    def work_until_idle(self) -> None:
        """One ``taskq-worker`` run until the default queue has no active job."""
        result = run("taskq-worker", APP, "--until-idle", env=self.env(**FAST_WORKER_ENV))
        assert result.returncode == 0, result.stderr

    def seed(self, *jobs: tuple[str, dict[str, Any], dict[str, Any]]) -> list[JobRow]:
        """Enqueue ``(actor, payload, options)`` jobs in-process: quicker than the CLI
        where the enqueue command is not what the test is about."""

        async def enqueue() -> list[JobRow]:
            app = TaskQ(self.pg.dsn, schema=self.pg.name, actors=basic.tq.actors.values())
            async with app:
                return [await app.client.enqueue(a, p, **o) for a, p, o in jobs]

        return asyncio.run(enqueue())

    def on_backend(self, action: Callable[[Backend], Awaitable[T]]) -> T:
        """Run ``action`` in-process on an open backend of this schema: a way to reach
        states, such as a running job with no worker, that the commands cannot."""

        async def run_it() -> T:
            backend = open_backend(self.pg.dsn, schema=self.pg.name)
            await backend.open()
            try:
                return await action(backend)
            finally:
                await backend.close()

        return asyncio.run(run_it())


def interrupt_once_blocked(
    proc: subprocess.Popen[str], dsn: str, holder_pid: int
) -> tuple[str, str]:
    """Send ``proc`` a SIGINT once a session waits for a lock the session ``holder_pid``
    holds (a condition, polled on a connection of its own, not a pause); its stdout and
    stderr. A process that outlives the call is killed."""
    import signal

    import psycopg
    import pytest

    try:
        with psycopg.connect(dsn, autocommit=True) as watcher:
            for _ in range(600):
                row = watcher.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))",
                    (holder_pid,),
                ).fetchone()
                if row is not None and row[0] > 0:
                    break
                watcher.execute("SELECT pg_sleep(0.05)")
            else:
                pytest.fail("the command never waited for the lock")
        proc.send_signal(signal.SIGINT)
        return proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
